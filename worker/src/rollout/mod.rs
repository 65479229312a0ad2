//! Rollout: running agents against an inference engine and their tools to produce token-exact
//! trajectories.
//!
//! - [`engine`]: the [`Engine`](engine::Engine) trait and its errors;
//! - [`embedded`]: the in-process tch engine with continuous batching across trajectories;
//! - [`sglang`], [`vllm`]: SGLang (`/generate`) and vLLM (`/v1/completions`) servers over HTTP;
//!   [`balanced`]: several engines balanced client-side;
//! - [`fake`]: scripted engines for tests and benchmarks;
//! - [`retry`]: engine calls with retries and backoff;
//! - [`task`]: a prompt to roll out; [`builder`]: assembling a token-exact trajectory;
//! - [`env`]: the environments (Search-R1, ASearcher, tool-integrated reasoning).

pub mod balanced;
pub mod builder;
pub mod config;
pub mod embedded;
pub mod engine;
pub mod env;
pub mod fake;
pub mod group;
mod http_engine;
pub mod metrics;
pub mod remote;
pub mod retry;
pub mod server;
pub mod sglang;
pub mod task;
pub mod vllm;
