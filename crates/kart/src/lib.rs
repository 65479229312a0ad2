//! The `kart` binary's library: what its commands are made of beyond the other kart crates.
//!
//! - [`local`]: `kart local`'s synthetic world, gold trajectories and warm start;
//! - [`conformance`]: `kart conformance`, checking kart against the upstream test vectors and
//!   transformers' outputs;
//! - [`convert`]: `kart convert verl`, a verl / Search-R1 command line as a kart config;
//! - [`plot`]: `kart plot`, charts of a run's metrics.
//!
//! The crates below it, by what they hold: `kart-core` (pure: agent protocols, rewards, RL math,
//! configs, wire types), `kart-tokenizer`, `kart-model` (tch models and the embedded engine),
//! `kart-http`, `kart-tools`, `kart-retriever`, `kart-rollout` and `kart-train`.

pub mod conformance;
pub mod convert;
pub mod local;
pub mod plot;
