//! A local index as an environment's search tool, searched in this process.

use crate::LocalIndex;
use kart_core::tool::{Search, Searched, ToolError};
use std::sync::Arc;

/// A local index searched in this process (as `kart local` does), off the async threads.
#[derive(Clone)]
pub struct InProcess(pub Arc<dyn LocalIndex>);

impl InProcess {
    /// The index folder `dir` (built by `kart retriever index`, its method read from its manifest)
    /// as a search tool, with the retriever service's default settings.
    pub fn open(dir: &std::path::Path) -> Result<Arc<dyn Search>, crate::RetrieverError> {
        let manifest = crate::docstore::Manifest::read(dir)?;
        let defaults = kart_core::config::retriever::RetrieverConfig::default();
        Ok(Arc::new(InProcess(crate::open_local(dir, manifest.method, &defaults)?)))
    }
}

impl Search for InProcess {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
        Box::pin(async move {
            let (index, queries) = (self.0.clone(), queries.to_vec());
            tokio::task::spawn_blocking(move || index.search_batch(&queries, topk))
                .await
                .map_err(|e| ToolError { tool: "search", reason: e.to_string() })?
                .map_err(|e| ToolError { tool: "search", reason: e.to_string() })
        })
    }
}
