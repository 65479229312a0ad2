//! The error type of the model crate.
//!
//! Every variant names the file it is about and, where there is one, the config key or tensor, so
//! that a user pointing kart at a broken or unsupported Hugging Face folder learns what to fix
//! without reading code.

use kart_tokenizer::file::FileError;
use std::path::PathBuf;

/// An error loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file of the folder cannot be read or written.
    #[error(transparent)]
    File(#[from] FileError),

    /// A config key is missing, has the wrong type, or has a value kart does not support.
    #[error("{path}: `{key}` = {value}: {reason}")]
    Config { path: PathBuf, key: String, value: String, reason: String },

    /// The config names a model architecture kart does not implement.
    #[error(
        "{path}: unsupported architecture `{architecture}` \
         (supported: Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM)"
    )]
    UnsupportedArchitecture { path: PathBuf, architecture: String },

    /// A tensor the model needs is not in the checkpoint.
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor { path: PathBuf, name: String },

    /// A checkpoint tensor's shape does not match the config.
    #[error("{path}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape { path: PathBuf, name: String, expected: Vec<i64>, got: Vec<i64> },

    /// A checkpoint tensor is not stored as a floating-point type kart can load.
    #[error("{path}: tensor `{name}` has dtype {dtype}, expected F16, BF16, F32 or F64")]
    TensorDtype { path: PathBuf, name: String, dtype: String },

    /// The checkpoint holds tensors the model did not use: a mismatch between config and weights.
    #[error("{path}: unused tensors in checkpoint: {}", names.join(", "))]
    UnusedTensors { path: PathBuf, names: Vec<String> },

    /// A safetensors file is malformed or cannot be written.
    #[error("{path}: invalid safetensors: {reason}")]
    Safetensors { path: PathBuf, reason: String },

    /// The tokenizer or chat template cannot be loaded or used.
    #[error(transparent)]
    Tokenizer(#[from] kart_tokenizer::TokenizerError),

    /// A libtorch operation failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}
