//! Configuration of a rollout worker: one serde type, read by `kart rollout serve --config` and
//! rendered by the operator into the ConfigMap the RolloutPool's pods read.

use super::ConfigError;
use super::env::EnvConfig;
use super::retry::RetryPolicy;
use super::sandbox::SandboxConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The inference engine behind the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EngineConfig {
    /// kart's own tch engine in this process, loading `RolloutConfig::model`.
    Embedded {
        /// Most sequences decoded together (continuous batching).
        #[serde(default = "default_max_batch")]
        max_batch: usize,
        /// Seed of requests that bring none.
        #[serde(default)]
        seed: u64,
    },
    /// SGLang servers (`/generate`); several URLs are balanced client-side.
    Sglang {
        urls: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_secs: f64,
    },
    /// vLLM OpenAI-compatible servers (`/v1/completions`); several URLs are balanced client-side.
    Vllm {
        urls: Vec<String>,
        /// The served model name.
        model: String,
        #[serde(default = "default_timeout")]
        timeout_secs: f64,
    },
}

fn default_max_batch() -> usize {
    64
}

fn default_timeout() -> f64 {
    600.0
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::Embedded { max_batch: default_max_batch(), seed: 0 }
    }
}

/// What environments run against besides the engine and the tokenizer: the tools they call, with
/// their limits and caches, and how failed engine calls are retried. A rollout worker's config
/// and the trainer's in-process pool embed it, its keys beside theirs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ContextConfig {
    /// The retriever (`kart retriever serve` or Search-R1's server) for search and page access.
    pub retriever_url: Option<String>,
    /// Timeout of one tool call, in seconds.
    pub tool_timeout_secs: f64,
    /// Search results cached (LRU), by query and topk.
    pub search_cache_entries: usize,
    /// Search requests in flight toward the retriever.
    pub search_concurrency: usize,
    /// The Python executor of tool-integrated reasoning.
    pub python: SandboxConfig,
    /// Retries of failed engine calls.
    pub retry: RetryPolicy,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            retriever_url: None,
            tool_timeout_secs: 30.0,
            search_cache_entries: 10_000,
            search_concurrency: 64,
            python: SandboxConfig::default(),
            retry: RetryPolicy::default(),
        }
    }
}

impl ContextConfig {
    /// Checks what serde cannot, naming the field and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = self.tool_timeout_secs;
        if !(t > 0.0 && t.is_finite()) {
            return Err(ConfigError::new("tool_timeout_secs", t, "must be positive"));
        }
        if let Some(url) = self.retriever_url.as_deref().filter(|u| !is_http_url(u)) {
            return Err(ConfigError::new("retriever_url", url, "must be an http(s) URL"));
        }
        Ok(())
    }
}

/// Whether `url` starts with `http://` or `https://`.
pub fn is_http_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// The rollout worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on.
    pub port: u16,
    /// The Hugging Face model folder: tokenizer and chat template always, weights for the embedded
    /// engine.
    pub model: PathBuf,
    /// The inference engine.
    pub engine: EngineConfig,
    /// The environment requests run in unless they name their own.
    pub env: EnvConfig,
    /// The tools and engine retries (`retriever_url`, `tool_timeout_secs`, ...: keys of their
    /// own beside these).
    #[serde(flatten)]
    pub context: ContextConfig,
    /// Groups rolled out at once per worker; further groups of a request wait.
    pub max_concurrent_groups: usize,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// Trajectories (prompts x n) in flight per worker over all requests: a request that would
    /// pass it is answered 429 with `Retry-After`, one larger than it alone 422.
    pub max_trajectories: usize,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            host: "0.0.0.0".into(),
            port: 8001,
            model: PathBuf::new(),
            engine: EngineConfig::default(),
            env: EnvConfig::default(),
            context: ContextConfig::default(),
            max_concurrent_groups: 256,
            max_body_bytes: 64 << 20,
            max_trajectories: 8192,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_kinds_parse() {
        let c: RolloutConfig = serde_json::from_str(
            r#"{"model": "/m", "engine": {"kind": "sglang", "urls": ["http://a:30000"]}}"#,
        )
        .unwrap();
        assert!(matches!(c.engine, EngineConfig::Sglang { ref urls, .. } if urls.len() == 1));
        let c: RolloutConfig = serde_json::from_str(r#"{"engine": {"kind": "embedded"}}"#).unwrap();
        assert_eq!(c.engine, EngineConfig::Embedded { max_batch: 64, seed: 0 });
    }

    #[test]
    fn unknown_keys_are_named() {
        let err =
            serde_json::from_str::<RolloutConfig>(r#"{"engine": {"kind": "tgi"}}"#).unwrap_err().to_string();
        assert!(err.contains("tgi"), "{err}");
        let err = serde_json::from_str::<RolloutConfig>(r#"{"max_turns": 3}"#).unwrap_err().to_string();
        assert!(err.contains("max_turns"), "{err}");
    }
}
