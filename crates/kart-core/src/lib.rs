//! kart's pure core: everything the other kart crates share, with no libtorch and no I/O.
//!
//! - [`agent`]: the agents' protocols (prompts, parsing, observations, turn rules) and the
//!   trajectory type;
//! - [`reward`]: the upstream reward functions (Search-R1 EM and format rewards, ASearcher EM/F1,
//!   math answers);
//! - [`rl`]: advantage estimators, KL estimators, loss aggregation and the reference losses on
//!   plain slices;
//! - [`generation`], [`engine`]: what an inference engine is asked for and returns, and the
//!   [`Engine`](engine::Engine) contract that keeps rollouts token-exact;
//! - [`chat`], [`tool`]: chat messages, and the search and page-access tool contracts;
//! - [`config`]: the configuration types of every component (also embedded in the CRDs);
//! - [`wire`]: the JSON bodies the services exchange; [`json`]: JSON values in error messages.
//!
//! The `kart conformance` command checks all of it against vectors produced by the upstream
//! Python code.

pub mod agent;
pub mod chat;
pub mod config;
pub mod engine;
pub mod generation;
pub mod json;
pub mod reward;
pub mod rl;
pub mod tool;
pub mod wire;
