//! The inference engine seen by the agent loop: token ids in, sampled token ids with their
//! log-probabilities out. Implementations: the embedded tch engine ([`super::embedded`]), SGLang and
//! vLLM over HTTP, a client-side balanced list of them, and scripted engines in tests.
//!
//! The contract that keeps rollouts token-exact: the engine returns the ids it sampled, never text
//! to be re-tokenised, and each id's log-probability under `softmax(logits / T)`.

use crate::model::{Generation, GenerationRequest};
use futures::future::BoxFuture;

/// One generation, tagged with the policy version that produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOutput {
    pub generation: Generation,
    /// The policy version of the weights that generated every token of this output.
    pub version: i64,
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
