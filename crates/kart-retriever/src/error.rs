//! The retriever's error type.

use std::path::PathBuf;

/// An error building, opening or querying a retriever.
#[derive(Debug, thiserror::Error)]
pub enum RetrieverError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A corpus row is not valid JSON or lacks the fields of the Search-R1 corpus format.
    #[error("{path}:{line}: {reason}")]
    Corpus { path: PathBuf, line: u64, reason: String },
    /// The index folder is missing, incomplete, or of another kind.
    #[error("{path}: {reason}")]
    Index { path: PathBuf, reason: String },
    /// tantivy failed.
    #[error("index {path}: {source}")]
    Tantivy { path: PathBuf, source: tantivy::TantivyError },
    /// A request is invalid; names the field and the value.
    #[error("{field}: {reason}")]
    BadRequest { field: &'static str, reason: String },
    /// An upstream service (Serper, Jina, a web page) failed after retries. Never contains keys.
    #[error("{service}: {reason}")]
    Upstream { service: &'static str, reason: String },
    /// The dense encoder failed.
    #[error(transparent)]
    Model(#[from] kart_model::ModelError),
    /// A bug: a task panicked or failed unexpectedly. `reason` says how (a panic's message); the
    /// server logs it and answers 500 without it.
    #[error("{what} failed unexpectedly: {reason}")]
    Internal { what: &'static str, reason: String },
}

impl RetrieverError {
    /// The error of a blocking task that did not finish: a panic with its message, or cancelled.
    pub(crate) fn task_failed(what: &'static str, error: tokio::task::JoinError) -> Self {
        match error.try_into_panic() {
            Ok(payload) => Self::panicked(what, payload.as_ref()),
            Err(error) => RetrieverError::Internal { what, reason: error.to_string() },
        }
    }

    /// The error of work that panicked with `payload`.
    pub(crate) fn panicked(what: &'static str, payload: &(dyn std::any::Any + Send)) -> Self {
        RetrieverError::Internal {
            what,
            reason: format!("panicked: {}", kart_http::panics::message(payload)),
        }
    }
}
