//! Rollout: running agents against an inference engine and their tools to produce token-exact
//! trajectories.
//!
//! - [`engine`]: the [`Engine`](engine::Engine) trait and its errors;
//! - [`embedded`]: the in-process tch engine with continuous batching across trajectories;
//!   [`weights`]: how a worker's embedded engine gets new weights (pushed or pulled, single-flight);
//! - [`sglang`], [`vllm`]: SGLang (`/generate`) and vLLM (`/v1/completions`) servers over HTTP;
//!   [`balanced`]: several engines balanced client-side;
//! - [`fake`]: scripted engines for tests and benchmarks;
//! - [`retry`]: engine calls with retries and backoff, per a [`retry_policy`];
//! - [`task`]: a prompt to roll out; [`builder`]: assembling a token-exact trajectory;
//! - [`env`]: the environments (Search-R1, ASearcher, tool-integrated reasoning);
//! - [`config`]: the worker's configuration.
//!
//! Without the `torch` and `server` features only the configuration types remain (the operator
//! renders them).

#[cfg(all(feature = "torch", feature = "server"))]
pub mod balanced;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod builder;
pub mod config;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod embedded;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod engine;
pub mod env;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod fake;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod group;
#[cfg(all(feature = "torch", feature = "server"))]
mod http_engine;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod metrics;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod remote;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod retry;
pub mod retry_policy;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod server;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod sglang;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod task;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod vllm;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod weights;
