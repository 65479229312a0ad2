//! The retriever: Search-R1's `/retrieve` API over a local BM25 index (tantivy), a dense index
//! (a BERT-family encoder and exact inner-product search), or online web search, plus page access
//! for ASearcher's `<access>` tool.
//!
//! - [`corpus`]: streaming reader of the Search-R1 corpus format (JSON lines, optionally gzipped);
//! - [`docstore`]: the documents stored beside every local index;
//! - [`bm25`]: building and searching the BM25 index, with top-k by window-max MaxScore (`max_score`)
//!   over bounds computed once for the common terms ([`stored_maxima`]);
//! - [`encoder`] and [`dense`]: sentence embeddings and the dense inner-product index, scanned
//!   exactly by [`flat`] (sharded over every GPU with CUDA) or through [`ann`]'s approximate graph
//!   (HNSW, usearch);
//! - [`online`]: Serper web search and page reading (Jina reader or direct fetch), cached;
//! - [`local_pages`]: ASearcher's local pages file, for `/access` without the web;
//! - [`server`]: the HTTP service.
//!
//! Local indexes implement [`LocalIndex`]; the server runs their CPU-bound searches off the async
//! runtime, online backends run as async clients. [`InProcess`] is a local index as an
//! environment's search tool, without HTTP (as `kart local` and the trainer's in-process pool use
//! it). The retriever's configuration is [`kart_core::config::retriever`].

pub mod ann;
pub mod bm25;
pub mod corpus;
pub mod dense;
pub mod docstore;
pub mod encoder;
mod error;
pub mod flat;
mod in_process;
pub mod local_pages;
pub mod max_score;
pub mod online;
mod read_only_dir;
pub mod searcher;
pub mod server;
pub mod stored_maxima;

pub use error::RetrieverError;
pub use in_process::InProcess;

use kart_core::agent::search_r1::RetrievalResult;
use kart_core::config::retriever::{Method, RetrieverConfig};
use std::path::Path;
use std::sync::Arc;

/// A local index answering batches of queries synchronously (BM25, dense).
pub trait LocalIndex: Send + Sync {
    /// The `topk` best documents for each query, best first.
    fn search_batch(
        &self,
        queries: &[String],
        topk: usize,
    ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError>;
    /// Number of documents indexed.
    fn num_docs(&self) -> u64;
}

/// The local index of `method` in `dir` (dense indexes encode queries on CUDA when available; an
/// approximate graph is searched with `config`'s `ann_expansion_search` and `ann_rerank`).
pub fn open_local(
    dir: &Path,
    method: Method,
    config: &RetrieverConfig,
) -> Result<Arc<dyn LocalIndex>, RetrieverError> {
    Ok(match method {
        Method::Bm25 => Arc::new(bm25::Bm25Index::open(dir)?),
        Method::Dense => {
            let device = kart_torch::auto("dense retriever");
            Arc::new(dense::DenseIndex::open(dir, device, config.ann_expansion_search, config.ann_rerank)?)
        }
        Method::Serper => {
            let reason = "serper searches online; a local index is bm25 or dense".into();
            return Err(RetrieverError::BadRequest { field: "method", reason });
        }
    })
}
