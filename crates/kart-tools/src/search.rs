//! The search and page-access tools as environments call them: a Search-R1 retriever over HTTP,
//! and an LRU cache of results in front of any search tool.
//!
//! A failing tool never fails the trajectory: the environment turns a [`ToolError`] into a masked
//! error observation and counts the failed call.

use futures::future::BoxFuture;
use kart_core::agent::search_r1::RetrievalResult;
use kart_core::tool::{Access, Search, Searched, ToolError};
use lru::LruCache;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A `kart retriever serve` (or Search-R1 `retrieval_server.py`) reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpRetriever {
    client: reqwest::Client,
    /// Parsed once: parsing it again for every request was a tenth of a search's client time.
    retrieve_url: reqwest::Url,
    access_url: reqwest::Url,
}

impl HttpRetriever {
    /// A client for the retriever at `base_url` (e.g. `http://retriever:8000`), with a per-request
    /// timeout; an error when `base_url` is not a URL.
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, url::ParseError> {
        let base = base_url.trim_end_matches('/').trim_end_matches("/retrieve");
        let client =
            reqwest::Client::builder().timeout(timeout).build().expect("a default HTTP client builds");
        Ok(HttpRetriever {
            client,
            retrieve_url: reqwest::Url::parse(&format!("{base}/retrieve"))?,
            access_url: reqwest::Url::parse(&format!("{base}/access"))?,
        })
    }

    /// `POST`s `payload` to `url`; the 2xx answer's body parsed as `T` straight from its bytes.
    async fn post<T: DeserializeOwned>(
        &self,
        tool: &'static str,
        url: &reqwest::Url,
        payload: &Value,
    ) -> Result<T, ToolError> {
        let error = |reason: String| ToolError { tool, reason };
        let response =
            self.client.post(url.clone()).json(payload).send().await.map_err(|e| error(e.to_string()))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| error(format!("reading the response body: {e}")))?;
        if !status.is_success() {
            let message = match serde_json::from_slice::<Value>(&body) {
                Ok(body) => body["error"]["message"].to_string(),
                Err(_) => String::from_utf8_lossy(&body).trim().chars().take(500).collect(),
            };
            return Err(error(format!("{url} answered {status}: {message}")));
        }
        serde_json::from_slice(&body).map_err(|e| error(format!("invalid response body: {e}")))
    }
}

impl Search for HttpRetriever {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
        Box::pin(async move {
            // Exactly what Search-R1's generation.py posts.
            let payload = json!({"queries": queries, "topk": topk, "return_scores": true});
            let answer: Retrieved = self.post("search", &self.retrieve_url, &payload).await?;
            Ok(answer.result)
        })
    }
}

impl Access for HttpRetriever {
    fn access<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let body: Value = self.post("access", &self.access_url, &json!({"urls": [url]})).await?;
            let page = &body["result"][0];
            match page["page"].as_str() {
                Some(text) => Ok(text.to_string()),
                None => Err(ToolError {
                    tool: "access",
                    reason: page["error"].as_str().unwrap_or("no page").to_string(),
                }),
            }
        })
    }
}

/// `/retrieve`'s answer, as Search-R1's `retrieval_server.py` writes it (other keys ignored).
#[derive(Deserialize)]
struct Retrieved {
    result: Vec<Vec<RetrievalResult>>,
}

/// Search results by query and topk.
type Results = LruCache<(String, usize), Vec<RetrievalResult>>;

/// A search tool with an LRU cache of results per (query, topk).
pub struct CachedSearch {
    inner: Arc<dyn Search>,
    /// `None`: no cache.
    cache: Option<Mutex<Results>>,
}

impl CachedSearch {
    /// Wraps `inner`; a zero `cache_entries` disables caching.
    pub fn new(inner: Arc<dyn Search>, cache_entries: usize) -> Self {
        let cache = NonZeroUsize::new(cache_entries).map(|capacity| Mutex::new(LruCache::new(capacity)));
        CachedSearch { inner, cache }
    }

    fn cached(&self, query: &str, topk: usize) -> Option<Vec<RetrievalResult>> {
        self.cache.as_ref()?.lock().expect("cache lock").get(&(query.to_string(), topk)).cloned()
    }
}

impl Search for CachedSearch {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
        Box::pin(async move {
            let mut results: Vec<Option<Vec<RetrievalResult>>> =
                queries.iter().map(|q| self.cached(q, topk)).collect();
            let missing: Vec<String> =
                queries.iter().zip(&results).filter(|(_, r)| r.is_none()).map(|(q, _)| q.clone()).collect();
            if !missing.is_empty() {
                let mut fetched = self.inner.search(&missing, topk).await?.into_iter();
                let mut cache = self.cache.as_ref().map(|c| c.lock().expect("cache lock"));
                for (query, slot) in queries.iter().zip(results.iter_mut()).filter(|(_, r)| r.is_none()) {
                    let hits = fetched.next().ok_or_else(|| ToolError {
                        tool: "search",
                        reason: format!("the retriever answered fewer than {} queries", missing.len()),
                    })?;
                    if let Some(cache) = cache.as_mut() {
                        cache.put((query.clone(), topk), hits.clone());
                    }
                    *slot = Some(hits);
                }
            }
            Ok(results.into_iter().map(|r| r.expect("filled above")).collect())
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kart_core::agent::search_r1::document;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// `topk` results for `query`, each titled with the query, as test backends answer.
    pub(crate) fn hits(query: &str, topk: usize) -> Vec<RetrievalResult> {
        (0..topk)
            .map(|i| RetrievalResult {
                document: document(i.to_string(), format!("\"{query}\"\n")),
                score: 1.0,
            })
            .collect()
    }

    /// A backend counting the queries that reach it.
    struct Counting(AtomicUsize);

    impl Search for Counting {
        fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
            self.0.fetch_add(queries.len(), Ordering::SeqCst);
            Box::pin(std::future::ready(Ok(queries.iter().map(|q| hits(q, topk)).collect())))
        }
    }

    #[tokio::test]
    async fn cache_answers_repeated_queries_without_the_backend() {
        let index = Arc::new(Counting(AtomicUsize::new(0)));
        let search = CachedSearch::new(index.clone(), 100);
        let q = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let first = search.search(&q(&["a", "b"]), 2).await.unwrap();
        let second = search.search(&q(&["b", "c", "a"]), 2).await.unwrap();
        assert_eq!(index.0.load(Ordering::SeqCst), 3, "only `c` reached the index the second time");
        assert_eq!(second[0], first[1]);
        assert_eq!(second[2], first[0]);
        assert_eq!(second[1][0].document.title.as_deref(), Some("c"));
        search.search(&q(&["a"]), 3).await.unwrap();
        assert_eq!(index.0.load(Ordering::SeqCst), 4, "topk is part of the key");
    }

    #[tokio::test]
    async fn zero_entries_cache_nothing() {
        let index = Arc::new(Counting(AtomicUsize::new(0)));
        let search = CachedSearch::new(index.clone(), 0);
        for _ in 0..3 {
            search.search(&["a".to_string()], 2).await.unwrap();
        }
        assert_eq!(index.0.load(Ordering::SeqCst), 3, "every query reached the index");
    }

    #[tokio::test]
    async fn answers_are_read_as_search_r1_writes_them_and_refusals_are_named() {
        use crate::functions::http::tests::serve;
        let hit = r#"{"result": [[{"document": {"id": "7", "contents": "\"Paris\"\nParis is the capital.", "url": "u"}, "score": 2.5}]], "took": 1}"#;
        let (url, seen) = serve(vec![
            (200, hit),
            (422, r#"{"error": {"message": "topk = 0: must be at least 1"}}"#),
            (502, "bad gateway"),
            (200, r#"{"result": 3}"#),
        ]);
        let retriever = HttpRetriever::new(url.trim_end_matches("/call"), Duration::from_secs(60)).unwrap();
        let queries = ["capital of france".to_string()];
        let hits = retriever.search(&queries, 1).await.unwrap();
        assert_eq!((hits[0][0].document.id.as_str(), hits[0][0].score), ("7", 2.5));
        assert_eq!(hits[0][0].document.fields["url"], "u", "the row's other fields are kept");
        let sent: Value = serde_json::from_str(&seen.lock().unwrap()[0]).unwrap();
        assert_eq!(sent, json!({"queries": queries, "topk": 1, "return_scores": true}));
        let err = retriever.search(&queries, 1).await.unwrap_err().reason;
        assert!(
            err.ends_with("answered 422 Unprocessable Entity: \"topk = 0: must be at least 1\""),
            "{err}"
        );
        let err = retriever.search(&queries, 1).await.unwrap_err().reason;
        assert!(err.ends_with("answered 502 Bad Gateway: bad gateway"), "{err}");
        let err = retriever.search(&queries, 1).await.unwrap_err().reason;
        assert!(err.starts_with("invalid response body: "), "{err}");
    }

    #[tokio::test]
    async fn unreachable_retriever_is_a_tool_error() {
        // A reserved port nothing listens on.
        let port = kart_testing::free_port();
        let retriever =
            HttpRetriever::new(&format!("http://127.0.0.1:{port}/retrieve"), Duration::from_secs(60))
                .unwrap();
        let err = retriever.search(&["q".to_string()], 3).await.unwrap_err();
        assert_eq!(err.tool, "search");
    }
}
