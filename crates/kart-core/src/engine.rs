//! The inference engine seen by the agent loop: token ids in, sampled token ids with their
//! log-probabilities out. Implementations: the embedded tch engine (`kart-model`), SGLang and
//! vLLM over HTTP, a client-side balanced list of them, and scripted engines in tests.
//!
//! The contract that keeps rollouts token-exact: the engine returns the ids it sampled, never text
//! to be re-tokenised, and each id's log-probability under `softmax(logits / T)`.

use crate::config::lora::LoraConfig;
use crate::generation::{Generation, GenerationRequest};
use futures::future::BoxFuture;
use std::path::PathBuf;

/// One generation, tagged with the policy versions that produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOutput {
    pub generation: Generation,
    /// The policy version of the weights that generated the tokens (those after `earlier`'s).
    pub version: i64,
    /// The generation's first tokens when earlier weights sampled them: `(tokens, version)` spans
    /// in order, left by a request that a weight update interrupted and the engine continued on
    /// the new weights. Empty when one version sampled every token.
    pub earlier: Vec<(usize, i64)>,
}

impl EngineOutput {
    /// A generation whose every token the weights of `version` sampled.
    pub fn new(generation: Generation, version: i64) -> Self {
        EngineOutput { generation, version, earlier: Vec::new() }
    }
}

/// Why an engine could not generate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid for this engine (not worth retrying).
    #[error("invalid generation request: {0}")]
    Invalid(String),
    /// The engine failed or is unreachable (worth retrying).
    #[error("{engine}: {reason}")]
    Unavailable { engine: String, reason: String },
    /// The engine aborted the request (e.g. SGLang's `abort` finish reason).
    #[error("{engine} aborted the request")]
    Aborted { engine: String },
}

impl EngineError {
    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, EngineError::Invalid(_))
    }
}

/// An inference engine serving many concurrent generations.
pub trait Engine: Send + Sync {
    /// Generates for one request.
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>>;
    /// A short name for logs and metrics (`embedded`, `sglang`, `vllm`, …).
    fn name(&self) -> &str;
}

/// Why new weights could not be loaded into an engine.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadWeightsError {
    /// The file is not a readable safetensors file.
    #[error("not a safetensors file: {0}")]
    Read(String),
    /// The engine rejected the weights (unknown parameter, wrong shape) or has stopped.
    #[error("{0}")]
    Rejected(String),
}

/// An engine whose weights the worker replaces (the embedded engine); SGLang and vLLM servers
/// load theirs themselves.
pub trait LoadWeights: Send + Sync {
    /// Replaces the weights with those of the safetensors file `file` as policy `version`;
    /// resolves once generations run on them. With `lora`, the file holds LoRA adapters of those
    /// settings alone (PEFT's names), which the engine applies over the base it started with.
    fn load_weights(
        &self,
        file: PathBuf,
        version: i64,
        lora: Option<LoraConfig>,
    ) -> BoxFuture<'_, Result<(), LoadWeightsError>>;
}
