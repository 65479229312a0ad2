//! A local index as an environment's search tool, searched in this process.

use crate::LocalIndex;
use crate::searcher::IndexSearcher;
use kart_core::tool::{Search, Searched, ToolError};
use std::sync::Arc;

/// A local index searched in this process (as `kart local` does), inline when quick, else off
/// the async threads.
pub struct InProcess(IndexSearcher);

impl InProcess {
    /// Searches `index`.
    pub fn new(index: Arc<dyn LocalIndex>) -> InProcess {
        InProcess(IndexSearcher::new(index))
    }

    /// The index folder `dir` (built by `kart retriever index`, its method read from its manifest)
    /// as a search tool, with the retriever service's default settings.
    pub fn open(dir: &std::path::Path) -> Result<Arc<dyn Search>, crate::RetrieverError> {
        let manifest = crate::docstore::Manifest::read(dir)?;
        let defaults = kart_core::config::retriever::RetrieverConfig::default();
        Ok(Arc::new(InProcess::new(crate::open_local(dir, manifest.method, &defaults)?)))
    }
}

impl Search for InProcess {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
        Box::pin(async move {
            self.0
                .search(queries.to_vec(), topk)
                .await
                .map_err(|e| ToolError { tool: "search", reason: e.to_string() })
        })
    }
}
