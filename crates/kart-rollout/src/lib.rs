//! Rollout: running agents against an inference engine and their tools to produce token-exact
//! trajectories, and the rollout worker that serves them (`kart rollout serve`). No libtorch:
//! the engine is an [`Engine`](kart_core::engine::Engine) (the embedded one is `kart-model`'s),
//! tokenisation is `kart-tokenizer`'s.
//!
//! - [`env`]: the environments (Search-R1, ASearcher, tool-integrated reasoning, tool calling)
//!   and the [`Context`](env::Context) they run against;
//! - [`reward`]: reward services (HTTP scorers, LLM judges) combined with their rewards;
//! - [`builder`]: assembling a token-exact trajectory;
//! - [`engines`]: SGLang (`/generate`) and vLLM (`/v1/completions`) servers over HTTP, balanced
//!   client-side; [`fake`]: scripted engines for tests and benchmarks;
//! - [`retry`]: engine calls with retries and backoff;
//! - [`group`]: the `n` trajectories of a task;
//! - [`weights`]: how a worker's engine gets new weights (pushed or pulled, single-flight);
//! - [`descriptors`]: the worker's file-descriptor budget;
//! - [`server`]: the worker's HTTP service; [`metrics`]: its metrics.

pub mod builder;
pub mod descriptors;
pub mod engines;
pub mod env;
pub mod fake;
pub mod group;
pub mod metrics;
pub mod retry;
pub mod reward;
pub mod server;
pub mod weights;
