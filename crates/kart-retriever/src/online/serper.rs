//! Web search through Serper, answering in the Search-R1 retrieval format.
//!
//! Each query is one `POST {serper_url}` with `X-API-KEY` and `{"q": query, "num": topk}`. Like
//! Search-R1's `serp_search_server.py` and slime's `google_search_server.py`, each organic result
//! becomes a passage `"{title}"\n{snippet}` ("No title." / "No snippet available." standing in for a
//! missing part; results with neither are skipped). The result's URL is the document id, so
//! ASearcher can `<access>` it. Scores are reciprocal ranks, `1 / (rank + 1)` from rank 0: Serper
//! gives no relevance score, and unlike `topk - rank` the score of a result does not depend on how
//! many were asked for.

use super::cache::Cache;
use super::upstream::{ApiKey, Upstream};
use crate::RetrieverError;
use futures::future::try_join_all;
use kart_core::agent::search_r1::RetrievalResult;
use kart_core::agent::search_r1::{contents, document};
use kart_core::config::retriever::OnlineConfig;
use prometheus::Registry;
use reqwest::Url;
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;

/// Serper web search with caching, a concurrency limit, timeouts and retries.
pub struct OnlineSearch {
    url: Url,
    api_key: Option<ApiKey>,
    upstream: Upstream,
    cache: Cache<(String, usize), Vec<RetrievalResult>>,
}

/// The part of Serper's answer that is used.
#[derive(Deserialize)]
struct SerperResponse {
    #[serde(default)]
    organic: Vec<Organic>,
}

/// One organic result. ASearcher's client reads the URL as `url`, Serper sends `link`.
#[derive(Deserialize)]
struct Organic {
    #[serde(default)]
    title: String,
    #[serde(default, alias = "url")]
    link: String,
    #[serde(default)]
    snippet: String,
}

impl OnlineSearch {
    /// A client of the Serper endpoint `config.serper_url`, sending `api_key` (`SERPER_API_KEY`;
    /// `None` or blank sends no key, for keyless proxies), its metrics registered into `registry`.
    pub fn new(
        config: &OnlineConfig,
        api_key: Option<String>,
        registry: &Registry,
    ) -> Result<Self, RetrieverError> {
        let url = Url::parse(&config.serper_url).map_err(|e| RetrieverError::BadRequest {
            field: "online.serper_url",
            reason: format!("{:?}: {e}", config.serper_url),
        })?;
        Ok(OnlineSearch {
            url,
            api_key: ApiKey::plain("SERPER_API_KEY", api_key)?,
            upstream: Upstream::new("serper", config, None, registry)?,
            cache: Cache::new(
                "serper",
                config.cache_entries,
                config.cache_bytes,
                |(query, _): &(String, usize), hits: &Vec<RetrievalResult>| weigh(query, hits),
                registry,
            )?,
        })
    }

    /// The `topk` best web results for each query, best first. Distinct queries are searched
    /// concurrently (identical ones once); a blank query matches nothing. Fails if any search fails.
    pub async fn search_batch(
        &self,
        queries: &[String],
        topk: usize,
    ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
        if topk == 0 {
            return Err(RetrieverError::BadRequest {
                field: "topk",
                reason: "must be at least 1, got 0".into(),
            });
        }
        let mut distinct: Vec<&str> = Vec::new();
        let mut slots: HashMap<&str, usize> = HashMap::new();
        let slot_of_query: Vec<usize> = queries
            .iter()
            .map(|q| {
                *slots.entry(q.as_str()).or_insert_with(|| {
                    distinct.push(q);
                    distinct.len() - 1
                })
            })
            .collect();
        let answers = try_join_all(distinct.iter().map(|q| self.search(q, topk))).await?;
        Ok(slot_of_query.into_iter().map(|slot| answers[slot].clone()).collect())
    }

    /// One query, from the cache or from Serper.
    async fn search(&self, query: &str, topk: usize) -> Result<Vec<RetrievalResult>, RetrieverError> {
        if query.trim().is_empty() {
            return Ok(Vec::new());
        }
        let key = (query.to_string(), topk);
        if let Some(hits) = self.cache.get(&key) {
            return Ok(hits);
        }
        let body = serde_json::json!({ "q": query, "num": topk });
        let request = || {
            let request = self.upstream.client().post(self.url.clone()).json(&body);
            match &self.api_key {
                Some(key) => request.header("X-API-KEY", key.header()),
                None => request,
            }
        };
        let what = format!("query {query:?}");
        let ((), raw) = self.upstream.fetch(&what, request, |_| Ok(())).await?;
        let response: SerperResponse =
            serde_json::from_slice(&raw).map_err(|e| RetrieverError::Upstream {
                service: self.upstream.service(),
                reason: format!("{what}: the answer is not Serper's JSON: {e}"),
            })?;
        let hits = to_results(response.organic, topk);
        self.cache.put(key, hits.clone());
        Ok(hits)
    }
}

/// The heap bytes of a cached search: the query and each result's text.
fn weigh(query: &str, hits: &[RetrievalResult]) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    query.len()
        + hits
            .iter()
            .map(|hit| {
                let d = &hit.document;
                size_of::<RetrievalResult>() + d.id.len() + d.contents.len() + text(&d.title) + text(&d.text)
            })
            .sum::<usize>()
}

/// The first `topk` organic results with a title or a snippet, as scored passages.
fn to_results(organic: Vec<Organic>, topk: usize) -> Vec<RetrievalResult> {
    organic
        .into_iter()
        .filter(|hit| !(hit.title.is_empty() && hit.snippet.is_empty()))
        .take(topk)
        .enumerate()
        .map(|(rank, hit)| {
            let title = if hit.title.is_empty() { "No title." } else { &hit.title };
            let snippet = if hit.snippet.is_empty() { "No snippet available." } else { &hit.snippet };
            RetrievalResult {
                document: document(hit.link, contents(title, snippet)),
                score: 1.0 / (rank + 1) as f64,
            }
        })
        .collect()
}

impl fmt::Debug for OnlineSearch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnlineSearch")
            .field("url", &self.url.as_str())
            .field("api_key", &self.api_key)
            .field("upstream", &self.upstream)
            .field("cache", &self.cache)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::online::fake::{config, sample, serve};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::{Json, Router, routing::post};
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};
    use tokio::sync::{Semaphore, watch};

    const KEY: &str = "serper-secret-4f2a";

    /// A fake Serper at `url`, keeping each request it got.
    struct FakeSerper {
        url: String,
        requests: Arc<Mutex<Vec<Request>>>,
    }

    /// A request as the fake Serper saw it.
    #[derive(Debug, PartialEq)]
    struct Request {
        key: Option<String>,
        body: Value,
    }

    impl FakeSerper {
        /// Serves a fake answering call `i` (from 0) with `respond(i)`.
        async fn start(respond: impl Fn(usize) -> Response + Clone + Send + Sync + 'static) -> Self {
            let requests = Arc::new(Mutex::new(Vec::new()));
            let seen = requests.clone();
            let handler = move |headers: HeaderMap, Json(body): Json<Value>| {
                let key = headers.get("x-api-key").map(|v| v.to_str().unwrap().to_string());
                let call = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(Request { key, body });
                    seen.len() - 1
                };
                std::future::ready(respond(call))
            };
            let url = format!("{}/search", serve(Router::new().route("/search", post(handler))).await);
            FakeSerper { url, requests }
        }

        fn calls(&self) -> usize {
            self.requests.lock().unwrap().len()
        }

        fn client(&self, registry: &Registry) -> OnlineSearch {
            let config = OnlineConfig { serper_url: self.url.clone(), ..config() };
            OnlineSearch::new(&config, Some(KEY.into()), registry).unwrap()
        }
    }

    /// Serper's answer with `n` organic results.
    fn organic(n: usize) -> Response {
        let results: Vec<Value> = (0..n)
            .map(|i| json!({"title": format!("Title {i}"), "link": format!("https://site{i}.example/"), "snippet": format!("Snippet {i}."), "position": i + 1}))
            .collect();
        Json(json!({ "searchParameters": {}, "organic": results })).into_response()
    }

    #[tokio::test]
    async fn organic_results_become_passages_keeping_urls() {
        let serper = FakeSerper::start(|_| {
            Json(json!({"organic": [
                {"title": "Dune (novel)", "link": "https://wiki.example/Dune", "snippet": "Dune is a 1965 novel."},
                {"link": "https://a.example/", "snippet": "Only a snippet."},
                {"title": "", "link": "https://empty.example/", "snippet": ""},
                {"title": "Frank Herbert", "link": "https://wiki.example/Herbert"},
                {"title": "Beyond topk", "link": "https://b.example/", "snippet": "Cut."},
            ]}))
            .into_response()
        })
        .await;
        let registry = Registry::new();
        let search = serper.client(&registry);

        let results = search.search_batch(&["who wrote dune".into(), "  ".into()], 3).await.unwrap();

        assert_eq!(results.len(), 2);
        assert!(results[1].is_empty(), "a blank query matches nothing");
        let ids: Vec<&str> = results[0].iter().map(|r| r.document.id.as_str()).collect();
        assert_eq!(ids, ["https://wiki.example/Dune", "https://a.example/", "https://wiki.example/Herbert"]);
        let contents: Vec<&str> = results[0].iter().map(|r| r.document.contents.as_str()).collect();
        assert_eq!(
            contents,
            [
                "\"Dune (novel)\"\nDune is a 1965 novel.",
                "\"No title.\"\nOnly a snippet.",
                "\"Frank Herbert\"\nNo snippet available."
            ]
        );
        assert_eq!(results[0][0].document.title.as_deref(), Some("Dune (novel)"));
        assert_eq!(results[0][0].document.text.as_deref(), Some("Dune is a 1965 novel."));
        let scores: Vec<f64> = results[0].iter().map(|r| r.score).collect();
        assert_eq!(scores, [1.0, 0.5, 1.0 / 3.0]);

        let requests = serper.requests.lock().unwrap();
        let expected = Request { key: Some(KEY.into()), body: json!({"q": "who wrote dune", "num": 3}) };
        assert_eq!(*requests, [expected]);
    }

    #[tokio::test]
    async fn repeated_queries_are_served_from_the_cache() {
        let serper = FakeSerper::start(|_| organic(5)).await;
        let registry = Registry::new();
        let search = serper.client(&registry);
        let queries = vec!["dune".to_string(), "dune".to_string()];

        let first = search.search_batch(&queries, 2).await.unwrap();
        let again = search.search_batch(&queries[..1], 2).await.unwrap();

        assert_eq!(serper.calls(), 1);
        assert_eq!((first[0].len(), &first[0]), (2, &first[1]));
        assert_eq!(again[0], first[0]);
        assert_eq!(
            sample(&registry, r#"kart_retriever_cache_requests_total{backend="serper",result="miss"}"#),
            1.0
        );
        assert_eq!(
            sample(&registry, r#"kart_retriever_cache_requests_total{backend="serper",result="hit"}"#),
            1.0
        );
    }

    #[tokio::test]
    async fn server_errors_are_retried() {
        let serper = FakeSerper::start(|call| match call {
            0 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            _ => organic(1),
        })
        .await;
        let registry = Registry::new();

        let results = serper.client(&registry).search_batch(&["dune".into()], 3).await.unwrap();

        assert_eq!(results[0].len(), 1);
        assert_eq!(serper.calls(), 2);
        let series = |outcome| {
            format!(r#"kart_retriever_upstream_requests_total{{outcome="{outcome}",service="serper"}}"#)
        };
        assert_eq!(sample(&registry, &series("retry")), 1.0);
        assert_eq!(sample(&registry, &series("ok")), 1.0);
        assert_eq!(
            sample(&registry, "kart_retriever_upstream_latency_seconds_count{service=\"serper\"}"),
            2.0
        );
    }

    #[tokio::test]
    async fn the_cache_holds_searches_within_cache_bytes() {
        let serper = FakeSerper::start(|_| organic(2)).await;
        let registry = Registry::new();
        let sized = serper.client(&Registry::new());
        let hits = sized.search_batch(&["q0".into()], 2).await.unwrap().remove(0);
        let entry = weigh("q0", &hits) + size_of::<((String, usize), Vec<RetrievalResult>)>();
        // Room for one search of a two-letter query, not two.
        let config: OnlineConfig = serde_json::from_value(json!({ "cache_bytes": entry * 3 / 2 })).unwrap();
        let config = OnlineConfig { serper_url: serper.url.clone(), ..config };
        let search = OnlineSearch::new(&config, None, &registry).unwrap();

        for query in ["q1", "q2", "q2", "q1"] {
            search.search_batch(&[query.into()], 2).await.unwrap();
            assert_eq!(search.cache.usage(), (1, entry));
        }

        // q2 was a hit; q1 was evicted by q2 and searched again.
        assert_eq!(serper.calls(), 1 + 3);
        let hits = r#"kart_retriever_cache_requests_total{backend="serper",result="hit"}"#;
        assert_eq!(sample(&registry, hits), 1.0);
    }

    #[tokio::test]
    async fn client_errors_are_not_retried_and_never_show_the_key() {
        let serper = FakeSerper::start(|_| StatusCode::UNAUTHORIZED.into_response()).await;
        let registry = Registry::new();
        let search = serper.client(&registry);

        let error = search.search_batch(&["dune".into()], 3).await.unwrap_err().to_string();

        assert_eq!(serper.calls(), 1);
        assert!(error.starts_with("serper: ") && error.contains("401 Unauthorized"), "{error}");
        assert!(!error.contains(KEY), "{error}");
        let debug = format!("{search:?}");
        assert!(!debug.contains(KEY) && debug.contains("redacted"), "{debug}");
    }

    #[tokio::test]
    async fn timeouts_fail_after_the_retries() {
        // A handler that never finishes: every attempt times out.
        let hanging = Router::new().route("/search", post(std::future::pending::<()>));
        let config = OnlineConfig {
            serper_url: format!("{}/search", serve(hanging).await),
            timeout_secs: 0.05,
            ..config()
        };
        let registry = Registry::new();
        let search = OnlineSearch::new(&config, Some(KEY.into()), &registry).unwrap();

        let error = search.search_batch(&["dune".into()], 3).await.unwrap_err().to_string();

        assert!(
            error.starts_with("serper: ") && error.contains("timed out") && error.contains("3 attempts"),
            "{error}"
        );
        let series = |outcome| {
            format!(r#"kart_retriever_upstream_requests_total{{outcome="{outcome}",service="serper"}}"#)
        };
        assert_eq!(sample(&registry, &series("retry")), 2.0);
        assert_eq!(sample(&registry, &series("error")), 1.0);
    }

    #[tokio::test]
    async fn requests_in_flight_stay_within_the_limit() {
        const LIMIT: usize = 2;
        const QUERIES: usize = 7;
        /// What the fake has seen: requests started, finished, in flight, and most at once.
        #[derive(Default)]
        struct Load {
            started: usize,
            finished: usize,
            in_flight: usize,
            most: usize,
        }
        let (load, _) = watch::channel(Load::default());
        let load = Arc::new(load);
        // The fake holds every request until the test releases it.
        let release = Arc::new(Semaphore::new(0));
        let (fake_load, fake_release) = (load.clone(), release.clone());
        let handler = move || {
            fake_load.send_modify(|l| {
                l.started += 1;
                l.in_flight += 1;
                l.most = l.most.max(l.in_flight);
            });
            let (load, release) = (fake_load.clone(), fake_release.clone());
            async move {
                release.acquire().await.unwrap().forget();
                load.send_modify(|l| {
                    l.in_flight -= 1;
                    l.finished += 1;
                });
                organic(1)
            }
        };
        let config = OnlineConfig {
            serper_url: format!("{}/search", serve(Router::new().route("/search", post(handler))).await),
            concurrency: LIMIT,
            ..config()
        };
        let search = OnlineSearch::new(&config, None, &Registry::new()).unwrap();
        let queries: Vec<String> = (0..QUERIES).map(|i| format!("query {i}")).collect();
        let batch = tokio::spawn(async move { search.search_batch(&queries, 1).await });

        // Release one request at a time, each once the client has as many in flight as it may (or
        // has sent everything): a client over the limit piles up held requests meanwhile.
        let mut changes = load.subscribe();
        for released in 0..QUERIES {
            changes
                .wait_for(|l| l.finished == released && (l.in_flight >= LIMIT || l.started == QUERIES))
                .await
                .unwrap();
            release.add_permits(1);
        }

        assert_eq!(batch.await.unwrap().unwrap().len(), QUERIES);
        assert_eq!(load.borrow().most, LIMIT);
    }
}
