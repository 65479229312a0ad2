//! The policy model: Hugging Face causal LMs (Qwen2, Qwen3, Llama) in tch, computing what
//! transformers computes, and the engine that generates with them in process.
//!
//! - [`config`]: `config.json` in both Hub styles, as a [`ModelConfig`];
//! - [`weights`]: safetensors checkpoints, single or sharded;
//! - [`transformer`]: the decoder ([`CausalLm`]), loaded or randomly initialised, with a
//!   [`KvCache`] for generation, over padded rows or packed sequences ([`Layout`]); generation
//!   multiplies by weights packed once for oneDNN on the CPU (`prepacked`);
//! - [`lora`]: LoRA adapters on the frozen base, switched off for the reference, merged for
//!   engines, saved and loaded in PEFT's format;
//! - [`recompute`]: activation checkpointing, decoder layers recomputed in the backward pass;
//! - [`residency`]: decoder layers brought to the device only while they run, from CPU memory
//!   ([`CausalLm::offload_layers`]) or gathered from sharded ranks;
//! - [`logprobs`]: per-token log-probabilities and entropies without full-batch logits;
//! - [`save`]: writing a folder transformers, vLLM and SGLang load;
//! - [`sampling`], [`scheduler`]: seeded per-request sampling and continuous batching;
//! - [`embedded`]: the [`EmbeddedEngine`], a thread running the scheduler behind the
//!   [`Engine`](kart_core::engine::Engine) contract, its weights replaceable between steps.

pub mod config;
pub mod embedded;
pub mod error;
pub mod kv_cache;
pub mod logprobs;
pub mod lora;
mod offload;
mod prepacked;
pub mod recompute;
pub mod residency;
pub mod rope;
pub mod sampling;
pub mod save;
pub mod scheduler;
pub mod transformer;
pub mod weights;

pub use config::{Family, ModelConfig, QwenSizes, Rope, RopeScaling};
pub use embedded::EmbeddedEngine;
pub use error::ModelError;
pub use kv_cache::KvCache;
pub use recompute::Recomputed;
pub use residency::Residency;
pub use save::{DEFAULT_MAX_SHARD_SIZE, save_pretrained, save_pretrained_with_max_shard_size};
pub use scheduler::{Scheduler, generate};
pub use transformer::{CausalLm, Layout};
pub use weights::{Weights, save_safetensors};
