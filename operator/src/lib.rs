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
//! - `testing` (feature `testing`): an in-process stateful fake API server.

pub mod build;
pub mod controller;
pub mod crd;
pub mod leader;
pub mod metrics;
pub mod server;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
