//! The policy model: Hugging Face causal LMs (Qwen2, Qwen3, Llama) in tch, computing what
//! transformers computes.
//!
//! - [`config`]: `config.json` in both Hub styles, as a [`ModelConfig`];
//! - [`weights`]: safetensors checkpoints, single or sharded;
//! - [`transformer`]: the decoder ([`CausalLm`]), loaded or randomly initialised, with a
//!   [`KvCache`] for generation;
//! - [`logprobs`]: per-token log-probabilities and entropies without full-batch logits;
//! - [`tokenizer`] and [`chat_template`]: `tokenizer.json` (or a byte-level BPE trained here) and
//!   the Jinja chat template;
//! - [`save`]: writing a folder transformers, vLLM and SGLang load.

pub mod chat_template;
pub mod config;
pub mod engine;
pub mod error;
pub mod kv_cache;
pub mod logprobs;
pub mod rope;
pub mod sampling;
pub mod save;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use chat_template::{CHATML, ChatMessage, ChatTemplate};
pub use config::{Family, ModelConfig, QwenSizes, Rope, RopeScaling};
pub use engine::{FinishReason, Generation, GenerationRequest, Scheduler, generate};
pub use error::ModelError;
pub use kv_cache::KvCache;
pub use sampling::SamplingParams;
pub use save::{DEFAULT_MAX_SHARD_SIZE, save_pretrained, save_pretrained_with_max_shard_size};
pub use tokenizer::{DecodeStream, Tokenizer};
pub use transformer::CausalLm;
pub use weights::{Weights, save_safetensors};
