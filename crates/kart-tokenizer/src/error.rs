//! The error type of tokenizers and chat templates.
//!
//! Every variant names the file it is about, so that a user pointing kart at a broken or
//! unsupported Hugging Face folder learns what to fix without reading code.

use crate::file::FileError;
use std::path::PathBuf;

/// An error loading or using a tokenizer or chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file of the folder cannot be read.
    #[error(transparent)]
    File(#[from] FileError),

    /// The tokenizer cannot be loaded or used.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// The chat template cannot be parsed or rendered.
    #[error("{path}: chat template: {reason}")]
    Template { path: PathBuf, reason: String },
}
