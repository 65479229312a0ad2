//! Text to token ids and back, as transformers does it for a Hugging Face model folder, without
//! libtorch: the [`Tokenizer`] (with a streaming [`DecodeStream`]) and the model's Jinja
//! [`ChatTemplate`]. Rollouts tokenise here, so the rollout worker needs no model library.
//! [`file`] reads a model folder's files for this crate and the ones above it.

mod byte_level;
mod chat_template;
mod error;
pub mod file;
mod pieces;
mod remembered;
#[cfg(test)]
mod testing;
mod tokenizer;

pub use chat_template::{CHATML, ChatTemplate, QWEN25};
pub use error::TokenizerError;
pub use tokenizer::{DecodeStream, Tokenizer};
