//! Configuration of a retriever service: one serde type, read by `kart retriever serve --config` and
//! rendered by the operator into the ConfigMap the retriever pods read.

use crate::wire::RetrieveLimits;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How documents are retrieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Lexical BM25 over a local tantivy index.
    #[default]
    Bm25,
    /// A BERT-family encoder and exact inner-product search over stored embeddings.
    Dense,
    /// Web search through Serper (`SERPER_API_KEY`).
    Serper,
}

/// Settings of the dense encoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EncoderConfig {
    /// Hugging Face folder of the encoder (BERT family: `config.json`, `tokenizer.json`, safetensors).
    pub model: Option<PathBuf>,
    /// `mean` or `cls`.
    pub pooling: Pooling,
    /// L2-normalise embeddings.
    pub normalize: bool,
    /// Prepended to queries (E5: `query: `).
    pub query_prefix: String,
    /// Prepended to passages (E5: `passage: `).
    pub passage_prefix: String,
    /// Longest input in tokens; longer inputs are truncated.
    pub max_length: usize,
    /// Sentences per forward pass.
    pub batch_size: usize,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            model: None,
            pooling: Pooling::Mean,
            normalize: true,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            max_length: 256,
            batch_size: 64,
        }
    }
}

/// How token embeddings become one sentence embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Mean over non-padding tokens.
    #[default]
    Mean,
    /// The first (`[CLS]`) token.
    Cls,
}

/// An approximate nearest-neighbour graph (HNSW, built and searched by usearch) over a dense
/// index's embeddings, for corpora a flat scan cannot serve: a query visits a few thousand
/// passages instead of all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AnnConfig {
    /// Links per node (HNSW's `M`): more is closer to exact and larger.
    pub connectivity: usize,
    /// Candidates kept while inserting (HNSW's `efConstruction`): more builds slower and better.
    pub expansion_add: usize,
    /// How the graph stores each vector.
    pub quantization: AnnQuantization,
}

impl Default for AnnConfig {
    fn default() -> Self {
        AnnConfig { connectivity: 32, expansion_add: 128, quantization: AnnQuantization::I8 }
    }
}

/// The scalar type of the vectors an approximate graph stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AnnQuantization {
    /// 4 bytes a dimension, as the embeddings.
    F32,
    /// 2 bytes a dimension (half of `f32`'s memory).
    F16,
    /// 1 byte a dimension (a quarter), scaled for unit vectors: the fastest; re-scoring the
    /// candidates (`ann_rerank`) recovers the recall it loses.
    #[default]
    I8,
    /// 1 bit a dimension (its sign: a 32nd of f32), compared by Hamming distance, for corpora
    /// whose embeddings do not fit in memory even at a byte a dimension: the graph only finds
    /// candidates, and re-scoring many of them (`ann_rerank` of 100 or more) against the f32
    /// embeddings, read from disk, ranks them.
    B1,
}

/// Settings of the online backends (web search and page access).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OnlineConfig {
    /// Serper endpoint.
    pub serper_url: String,
    /// Jina reader endpoint (used when `JINA_API_KEY` is set).
    pub jina_url: String,
    /// Results cached (LRU), across queries and pages.
    pub cache_entries: usize,
    /// Bytes each cache (Serper results, page text) holds at most, keys and values counted: the
    /// least recently used entries are evicted to stay under it, and an answer larger than it is
    /// not cached. 0 caches nothing.
    pub cache_bytes: usize,
    /// Requests in flight toward each upstream service.
    pub concurrency: usize,
    /// Page reads in flight toward one host (the page URL's host name or address, any port), so a
    /// slow host holds at most this many of the `concurrency` slots and other hosts keep being
    /// read. At least 1.
    pub per_host_concurrency: usize,
    /// Timeout of one upstream request in seconds.
    pub timeout_secs: f64,
    /// Retries after a failed upstream request, with exponential backoff.
    pub retries: u32,
    /// First backoff delay in milliseconds (doubled each retry).
    pub backoff_ms: u64,
    /// Internal networks (CIDR, e.g. `10.0.0.0/8`), addresses and host names pages may be read
    /// from; every other loopback, private, link-local (cloud metadata), multicast or reserved
    /// address is refused, after DNS resolution and after every redirect.
    pub allow_internal: Vec<String>,
    /// Bytes of page text one `/access` request returns at most; pages past it fail with an
    /// error naming this key.
    pub access_budget_bytes: usize,
}

impl Default for OnlineConfig {
    fn default() -> Self {
        OnlineConfig {
            serper_url: "https://google.serper.dev/search".into(),
            jina_url: "https://r.jina.ai".into(),
            cache_entries: 10_000,
            cache_bytes: 256 << 20,
            concurrency: 32,
            per_host_concurrency: 4,
            timeout_secs: 20.0,
            retries: 3,
            backoff_ms: 200,
            allow_internal: Vec::new(),
            access_budget_bytes: 8 << 20,
        }
    }
}

/// The retriever service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetrieverConfig {
    /// Retrieval method.
    pub method: Method,
    /// Index folder (BM25 and dense).
    pub index: Option<PathBuf>,
    /// Results per query when a request's `topk` is null (Search-R1's default is 3).
    pub topk: usize,
    /// Address to listen on.
    pub host: String,
    /// Port to listen on.
    pub port: u16,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// Most queries in one request.
    pub max_queries: usize,
    /// Most results (queries x topk) in one request.
    pub max_results: usize,
    /// Largest `/retrieve` response in bytes; a larger one is refused with 413.
    pub max_response_bytes: usize,
    /// Dense encoder settings.
    pub encoder: EncoderConfig,
    /// Candidates a dense index's approximate graph explores per query (HNSW's `efSearch`): more
    /// is slower and closer to the exact scan. Indexes without a graph are scanned exactly.
    pub ann_expansion_search: usize,
    /// Candidates of the graph re-scored exactly against the f32 embeddings (memory-mapped, read
    /// as the OS pages them in) before the best `topk` are kept, undoing the graph's
    /// quantisation; at least `topk` always are, so scores are exact inner products.
    pub ann_rerank: usize,
    /// Online backend settings (Serper search, page access).
    pub online: OnlineConfig,
    /// ASearcher's local pages file (JSON lines keyed by `url`, such as its
    /// `wiki_webpages.jsonl`, plain or gzipped): `/access` answers from it, as ASearcher's local
    /// server does, instead of reading the web.
    pub pages: Option<PathBuf>,
}

impl Default for RetrieverConfig {
    fn default() -> Self {
        RetrieverConfig {
            method: Method::Bm25,
            index: None,
            topk: 3,
            host: "0.0.0.0".into(),
            port: 8000,
            max_body_bytes: 10 * 1024 * 1024,
            max_queries: 4096,
            max_results: 100_000,
            max_response_bytes: 64 << 20,
            encoder: EncoderConfig::default(),
            ann_expansion_search: 64,
            ann_rerank: 50,
            online: OnlineConfig::default(),
            pages: None,
        }
    }
}

/// The largest `topk` a request may ask for.
pub const MAX_TOPK: usize = 1000;

impl RetrieverConfig {
    /// What one `/retrieve` request may ask for.
    pub fn retrieve_limits(&self) -> RetrieveLimits {
        RetrieveLimits {
            default_topk: self.topk,
            max_queries: self.max_queries,
            max_results: self.max_results,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_search_r1() {
        let c: RetrieverConfig = serde_json::from_str("{}").unwrap();
        assert_eq!((c.topk, c.port, c.method), (3, 8000, Method::Bm25));
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let err = serde_json::from_str::<RetrieverConfig>(r#"{"top_k": 5}"#).unwrap_err().to_string();
        assert!(err.contains("top_k"), "{err}");
    }
}
