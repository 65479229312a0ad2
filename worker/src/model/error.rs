//! The error type of the model module.
//!
//! Every variant names the file it is about and, where there is one, the config key or tensor, so
//! that a user pointing kart at a broken or unsupported Hugging Face folder learns what to fix
//! without reading code.

use std::path::PathBuf;

/// An error loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file the model folder must contain does not exist.
    #[error("{path}: no such file")]
    MissingFile { path: PathBuf },

    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (config, index, generation config) does not parse.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

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

    /// The tokenizer cannot be loaded or used.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// The chat template cannot be parsed or rendered.
    #[error("{path}: chat template: {reason}")]
    Template { path: PathBuf, reason: String },

    /// A libtorch operation failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}
