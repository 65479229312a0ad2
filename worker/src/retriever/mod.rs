//! The retriever: Search-R1's `/retrieve` API over a local BM25 index (tantivy), a dense index
//! (a BERT-family encoder and exact inner-product search), or online web search, plus page access
//! for ASearcher's `<access>` tool.
//!
//! - [`config`]: the retriever's configuration (also rendered by the operator);
//! - [`corpus`]: streaming reader of the Search-R1 corpus format (JSON lines, optionally gzipped);
//! - [`docstore`]: the documents stored beside every local index;
//! - [`bm25`]: building and searching the BM25 index, with top-k by window-max MaxScore (`max_score`);
//! - [`encoder`] and [`dense`]: sentence embeddings and the flat inner-product index;
//! - [`online`]: Serper web search and page reading (Jina reader or direct fetch), cached;
//! - [`server`]: the HTTP service.
//!
//! Local indexes implement [`LocalIndex`]; the server runs their CPU-bound searches off the async
//! runtime, online backends run as async clients.

pub mod config;

#[cfg(feature = "server")]
pub mod bm25;
#[cfg(feature = "server")]
pub mod corpus;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod dense;
#[cfg(feature = "server")]
pub mod docstore;
#[cfg(all(feature = "torch", feature = "server"))]
pub mod encoder;
#[cfg(feature = "server")]
mod error;
#[cfg(feature = "server")]
pub mod max_score;
#[cfg(feature = "server")]
pub mod online;
#[cfg(feature = "server")]
pub mod server;

#[cfg(feature = "server")]
pub use error::RetrieverError;

use crate::agent::search_r1::Document;
#[cfg(feature = "server")]
use crate::agent::search_r1::RetrievalResult;

/// A local index answering batches of queries synchronously (BM25, dense).
#[cfg(feature = "server")]
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

/// The Search-R1 document for a passage: `contents` is `"{title}"\n{text}`; `title` and `text` are
/// filled in from it so clients reading either form work.
pub fn document(id: String, contents: String) -> Document {
    let (first, rest) = contents.split_once('\n').unwrap_or((&contents, ""));
    let title = first.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(first).to_string();
    let text = rest.to_string();
    Document { id, contents, title: Some(title), text: Some(text) }
}

/// Search-R1's `contents` for a passage given as a title and a text.
pub fn contents(title: &str, text: &str) -> String {
    format!("\"{title}\"\n{text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_splits_title_and_text() {
        let d = document("7".into(), "\"Paris\"\nCapital of France.\nSecond line.".into());
        assert_eq!(d.title.as_deref(), Some("Paris"));
        assert_eq!(d.text.as_deref(), Some("Capital of France.\nSecond line."));
        let d = document("8".into(), "no title line".into());
        assert_eq!((d.title.as_deref(), d.text.as_deref()), (Some("no title line"), Some("")));
    }

    #[test]
    fn contents_round_trips() {
        let d = document("1".into(), contents("A \"quoted\" title", "text"));
        assert_eq!(d.title.as_deref(), Some("A \"quoted\" title"));
        assert_eq!(d.contents, "\"A \"quoted\" title\"\ntext");
    }
}
