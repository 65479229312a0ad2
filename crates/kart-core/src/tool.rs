//! The tools environments call, as contracts: searching a corpus and reading a page. Their
//! implementations are a retriever over HTTP or in process, behind a cache (`kart-tools`,
//! `kart-retriever`).
//!
//! A failing tool never fails the trajectory: the environment turns a [`ToolError`] into a masked
//! error observation and counts the failed call.

use crate::agent::search_r1::RetrievalResult;
use futures::future::BoxFuture;

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
