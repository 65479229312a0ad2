//! Configuration of a rollout worker: one serde type, read by `kart rollout serve --config` and
//! rendered by the operator into the ConfigMap the RolloutPool's pods read.

use super::ConfigError;
use super::env::EnvConfig;
use super::retry::RetryPolicy;
use super::reward::RewardConfig;
use super::sandbox::SandboxConfig;
use super::weight_sources::WeightSources;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

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
        /// The servers; left empty in a RolloutPool that runs them (`inference`), whose Service
        /// the operator fills in.
        #[serde(default)]
        urls: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_secs: f64,
    },
    /// vLLM OpenAI-compatible servers (`/v1/completions`); several URLs are balanced client-side.
    Vllm {
        /// The servers; left empty in a RolloutPool that runs them (`inference`), whose Service
        /// the operator fills in.
        #[serde(default)]
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
    /// Search requests in flight toward the retriever; searches arriving while all are out wait
    /// and leave together as one batched request.
    pub search_concurrency: usize,
    /// The Python executor of tool-integrated reasoning.
    pub python: SandboxConfig,
    /// Retries of failed engine calls.
    pub retry: RetryPolicy,
    /// Reward services combined with the environment's own reward.
    pub reward: RewardConfig,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            retriever_url: None,
            tool_timeout_secs: 30.0,
            search_cache_entries: 10_000,
            search_concurrency: 8,
            python: SandboxConfig::default(),
            retry: RetryPolicy::default(),
            reward: RewardConfig::default(),
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
        self.reward.validate().map_err(|e| e.within("reward"))
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
    /// Limits of the embedded engine's weight downloads (a `url` weight source).
    pub weight_download: WeightDownloadConfig,
    /// Where weights may be loaded from.
    pub weight_sources: WeightSources,
}

/// How patient a worker is with a weights server and how much it takes from it: a download that
/// breaks a limit fails the requests waiting for that version, and only those.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WeightDownloadConfig {
    /// Seconds to open the connection to the server.
    pub connect_timeout_secs: f64,
    /// Seconds without a byte from the server (from the request until the response starts, then
    /// between two reads of the body) before the download fails.
    pub idle_timeout_secs: f64,
    /// Largest weights file accepted, in bytes: a larger announced `Content-Length` is refused
    /// before the body is read, and a body that grows past it is cut off.
    pub max_bytes: u64,
}

impl Default for WeightDownloadConfig {
    fn default() -> Self {
        // 64 GiB: a 7B model in f32 (28 GB) or a 30B one in bf16 fits.
        WeightDownloadConfig { connect_timeout_secs: 10.0, idle_timeout_secs: 30.0, max_bytes: 64 << 30 }
    }
}

impl WeightDownloadConfig {
    /// Checks what serde cannot, naming the field and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, secs) in [
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
        ] {
            if !(secs > 0.0 && Duration::try_from_secs_f64(secs).is_ok()) {
                return Err(ConfigError::new(field, secs, "must be a positive number of seconds"));
            }
        }
        if self.max_bytes == 0 {
            return Err(ConfigError::new("max_bytes", self.max_bytes, "must be at least 1"));
        }
        Ok(())
    }
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
            weight_download: WeightDownloadConfig::default(),
            weight_sources: WeightSources::default(),
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
    fn weight_download_limits_parse_and_are_checked() {
        let c: RolloutConfig = serde_json::from_str(
            r#"{"weight_download": {"connect_timeout_secs": 2, "idle_timeout_secs": 0.5, "max_bytes": 1024}}"#,
        )
        .unwrap();
        let limits =
            WeightDownloadConfig { connect_timeout_secs: 2.0, idle_timeout_secs: 0.5, max_bytes: 1024 };
        assert_eq!(c.weight_download, limits);
        assert_eq!(RolloutConfig::default().weight_download.max_bytes, 64 << 30);
        assert_eq!(limits.validate(), Ok(()));
        let err = |c: WeightDownloadConfig| c.validate().unwrap_err().within("weight_download").to_string();
        assert_eq!(
            err(WeightDownloadConfig { idle_timeout_secs: 0.0, ..limits.clone() }),
            "weight_download.idle_timeout_secs = 0: must be a positive number of seconds"
        );
        assert!(
            err(WeightDownloadConfig { connect_timeout_secs: f64::NAN, ..limits.clone() })
                .starts_with("weight_download.connect_timeout_secs = NaN")
        );
        assert!(
            err(WeightDownloadConfig { max_bytes: 0, ..limits }).starts_with("weight_download.max_bytes = 0")
        );
        let e = serde_json::from_str::<RolloutConfig>(r#"{"weight_download": {"timeout": 3}}"#).unwrap_err();
        assert!(e.to_string().contains("timeout"), "{e}");
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
