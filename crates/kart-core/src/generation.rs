//! What an inference engine is asked for and what it returns: token ids in, sampled token ids
//! with their log-probabilities out, never text to be re-tokenised. The embedded engine, SGLang
//! and vLLM all speak these types.

use serde::{Deserialize, Serialize};

/// One generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRequest {
    /// The prompt's token ids (at least one).
    pub input_ids: Vec<u32>,
    /// Temperature, top-p, top-k and seed.
    #[serde(default)]
    pub sampling: SamplingParams,
    /// The most tokens to generate.
    pub max_new_tokens: usize,
    /// Generation stops once the decoded output contains one of these; the tokens that completed it
    /// are kept.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Generation stops after any of these tokens (in addition to the tokenizer's end-of-sequence
    /// tokens unless `ignore_eos`).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the tokenizer's end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: bool,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_new_tokens` or the model's context length.
    Length,
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The generated token ids.
    pub token_ids: Vec<u32>,
    /// Log-probability of each generated token under `softmax(logits / T)` (T = 1 when greedy).
    pub logprobs: Vec<f32>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
}

/// How to pick tokens for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy decoding.
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of top tokens whose probability reaches `top_p`.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 or negative disables it.
    pub top_k: i64,
    /// Seed of the request's random stream; `None` draws one from the engine.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_p: 1.0, top_k: -1, seed: None }
    }
}

/// Errors in sampling parameters, naming the field and value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("sampling.temperature must be >= 0 and finite, got {0}")]
    Temperature(f64),
    #[error("sampling.top_p must be in (0, 1], got {0}")]
    TopP(f64),
}

impl SamplingParams {
    /// Checks the ranges of the parameters.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        Ok(())
    }

    /// Whether this request decodes greedily.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}
