//! The tools environments call, as contracts: searching a corpus, reading a page, and any named
//! [`Function`] a tool-calling model calls. Their implementations are a retriever over HTTP or in
//! process, behind a cache, and the function back ends (`kart-tools`, `kart-retriever`).
//!
//! A failing tool never fails the trajectory: the environment turns a [`ToolError`] into a masked
//! error observation and counts the failed call.

use crate::agent::search_r1::RetrievalResult;
use futures::future::BoxFuture;
use serde_json::Value;

/// A tool call that failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{tool}: {reason}")]
pub struct ToolError {
    pub tool: &'static str,
    pub reason: String,
}

/// What a search answers: the passages of each query, best first.
pub type Searched<'a> = BoxFuture<'a, Result<Vec<Vec<RetrievalResult>>, ToolError>>;

/// Retrieves the `topk` best passages for each query.
pub trait Search: Send + Sync {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a>;
}

/// Reads a web page as text.
pub trait Access: Send + Sync {
    fn access<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<String, ToolError>>;
}

/// A function call that failed: the reason the model is told.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CallFailed(pub String);

impl From<ToolError> for CallFailed {
    fn from(e: ToolError) -> Self {
        CallFailed(e.reason)
    }
}

/// What a function call answers: the text of the tool response.
pub type Called<'a> = BoxFuture<'a, Result<String, CallFailed>>;

/// A function a tool-calling model calls by name.
pub trait Function: Send + Sync {
    /// Its schema in OpenAI's function format: `{"type": "function", "function": {"name",
    /// "description", "parameters"}}`.
    fn schema(&self) -> &Value;

    /// Runs the function on `arguments` (a JSON object, checked against the schema).
    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a>;

    /// The function's name, from its schema.
    fn name(&self) -> &str {
        self.schema().pointer("/function/name").and_then(Value::as_str).unwrap_or_default()
    }
}
