//! kart-operator: the Kubernetes operator that reconciles kart's Retriever, RolloutPool and
//! TrainingJob custom resources into workloads. Of kart's crates it depends on `kart-core` alone,
//! for the configuration types it embeds in its CRDs, and never links libtorch.
//!
//! - [`crd`]: the custom resources and their CRDs;
//! - [`build`]: the desired children of each resource (pure: spec in, objects out);
//! - [`status`]: each resource's status (and a TrainingJob's next action) derived from what its
//!   children report (pure);
//! - [`controller`]: the reconcilers and their shared context;
//! - [`metrics`], [`server`]: the operator's own metrics and its HTTP endpoints;
//! - [`leader`]: leader election on a Lease;
//! - [`bench`]: `kart bench operator`, the operator at scale on simulated nodes.
//!
//! Its integration tests run against a real control plane (`tests/tests/control_plane.rs` and
//! `operator_e2e.rs`); this crate's own tests check one reconciliation's requests against a mock
//! service (`tests/verify.rs`).

pub mod bench;
pub mod build;
pub mod controller;
pub mod crd;
pub mod leader;
pub mod metrics;
pub mod server;
pub mod status;
