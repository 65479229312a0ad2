//! Reading the files of a Hugging Face model folder, with errors that name the file: shared by
//! the tokenizer, the models and the dense retriever's encoder.

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// A file of a model folder that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A file the model folder must contain does not exist.
    #[error("{path}: no such file")]
    Missing { path: PathBuf },

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
}

impl FileError {
    /// The error of an I/O failure on `path`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io { path: path.to_path_buf(), source }
    }

    /// The error of JSON that `path` holds, or should hold, but does not parse or print.
    pub fn json(path: &Path) -> impl FnOnce(serde_json::Error) -> FileError + '_ {
        move |source| FileError::Json { path: path.to_path_buf(), source }
    }
}

/// Parses the JSON file at `path`, or returns `None` when there is no such file.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(FileError::Io { path: path.to_path_buf(), source }),
    };
    serde_json::from_str(&text).map(Some).map_err(FileError::json(path))
}

/// Parses the JSON file at `path`, which must exist.
pub fn require_json<T: DeserializeOwned>(path: &Path) -> Result<T, FileError> {
    read_json(path)?.ok_or_else(|| FileError::Missing { path: path.to_path_buf() })
}
