//! The desired children of each resource: pure functions from a resource (and what it depends
//! on) to the objects the controllers apply. Names, ports, paths and labels are fixed here.
//!
//! - [`meta`]: names, labels, owner references, endpoints;
//! - [`pod`]: containers and pod templates with the user's overrides applied; [`objects`]: the
//!   plain objects (ConfigMaps, Services, claims, Deployments);
//! - [`retriever`], [`rollout_pool`], [`training_job`]: each kind's children; [`adapters`]: what
//!   a pool's vLLM servers need for the LoRA adapters of the TrainingJobs using it.

pub mod adapters;
#[cfg(test)]
pub mod fixtures;
pub mod meta;
pub mod objects;
pub mod pod;
pub mod retriever;
pub mod rollout_pool;
pub mod training_job;

/// Where the rendered config is mounted; the worker reads `/etc/kart/config.json`.
pub const CONFIG_DIR: &str = "/etc/kart";
/// The ConfigMap key (and file name) of the rendered config.
pub const CONFIG_FILE: &str = "config.json";
/// Port of `kart retriever serve`.
pub const RETRIEVER_PORT: u16 = 8000;
/// Port of `kart rollout serve`.
pub const ROLLOUT_PORT: u16 = 8001;
/// Port of `kart train`'s HTTP server (`/status`, `/metrics`, `/weights/{version}`).
pub const TRAINER_PORT: u16 = 8002;
/// Port of the trainers' collective rendezvous (`MASTER_PORT`).
pub const MASTER_PORT: u16 = 29500;
/// Port of an SGLang server.
pub const SGLANG_PORT: u16 = 30000;
/// Port of a vLLM server.
pub const VLLM_PORT: u16 = 8000;
/// Where a retriever's index volume is mounted.
pub const INDEX_DIR: &str = "/var/lib/kart/index";

/// Operator-wide settings the builders need.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The kart image pods run unless they override it.
    pub image: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { image: format!("ghcr.io/kart-dev/kart:{}", env!("CARGO_PKG_VERSION")) }
    }
}

/// The path of the rendered config inside a pod.
pub fn config_path() -> String {
    format!("{CONFIG_DIR}/{CONFIG_FILE}")
}

/// A spec that cannot become workloads, naming the field and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct InvalidSpec {
    /// The field, as a path from the resource (`spec.config.model`).
    pub field: String,
    /// The offending value.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

impl InvalidSpec {
    /// An invalid `field` holding `value`.
    pub fn new(field: impl Into<String>, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        InvalidSpec { field: field.into(), value: value.to_string(), reason: reason.into() }
    }
}
