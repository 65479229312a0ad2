//! The retriever's HTTP service: Search-R1's `POST /retrieve`, `POST /access` for page reading, and
//! the operational endpoints.
//!
//! `/retrieve` takes `{"queries": [str], "topk": int | null, "return_scores": bool}` and answers
//! `{"result": [[{"document": {"id", "contents", "title", "text"}, "score"}, …], …]}`, or the bare
//! documents when `return_scores` is false, exactly as Search-R1's `retrieval_server.py`. Bad input
//! gets a 4xx JSON error naming the field; the index loads in the background while `/readyz` says
//! 503, so a large index never blocks liveness probes. An index that fails to load (a file whose
//! checksum does not match among them) ends the process with the error: the service never becomes
//! ready on it.
//!
//! A failing upstream (Serper, Jina) is a 502; a failing local index a 500; a bug (a panic in a
//! handler or in a search) a 500 whose cause is logged, not returned.

use crate::RetrieverError;
use crate::local_pages::LocalPages;
use crate::online::{OnlineSearch, PageReader};
use crate::searcher::IndexSearcher;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use kart_core::agent::search_r1::{Document, RetrievalResult};
use kart_core::config::retriever::{Method, RetrieverConfig};
use kart_core::wire::{AccessRequest, RetrieveRequest};
use kart_http::metrics;
use kart_http::{self as http, ApiError, Readiness};
use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Where `/retrieve` gets its answers.
pub enum Backend {
    /// A local index (BM25 or dense), searched inline when quick, else on the blocking pool.
    Local(IndexSearcher),
    /// Serper web search.
    Serper(Box<OnlineSearch>),
}

impl Backend {
    /// Opens the backend `config` names: the index folder for BM25 and dense, Serper's client
    /// (key from `SERPER_API_KEY`) for online search.
    pub fn open(config: &RetrieverConfig, registry: &Registry) -> Result<Backend, RetrieverError> {
        let index_dir = || {
            config.index.clone().ok_or_else(|| RetrieverError::BadRequest {
                field: "index",
                reason: format!("method `{:?}` needs an index folder", config.method).to_lowercase(),
            })
        };
        Ok(match config.method {
            Method::Bm25 | Method::Dense => {
                Backend::Local(IndexSearcher::new(crate::open_local(&index_dir()?, config.method, config)?))
            }
            Method::Serper => Backend::Serper(Box::new(OnlineSearch::new(
                &config.online,
                std::env::var("SERPER_API_KEY").ok(),
                registry,
            )?)),
        })
    }

    async fn retrieve(
        &self,
        queries: Vec<String>,
        topk: usize,
    ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
        match self {
            Backend::Local(searcher) => searcher.search(queries, topk).await,
            Backend::Serper(search) => search.search_batch(&queries, topk).await,
        }
    }

    /// Documents in the index, when the backend has one.
    pub fn num_docs(&self) -> Option<u64> {
        match self {
            Backend::Local(searcher) => Some(searcher.index().num_docs()),
            Backend::Serper(_) => None,
        }
    }
}

/// The service's metrics.
struct Metrics {
    requests: IntCounterVec,
    /// Queries answered, under the configured method's label.
    queries: IntCounter,
    latency: HistogramVec,
    errors: IntCounterVec,
    documents: IntGauge,
}

impl Metrics {
    fn new(registry: &Registry, method: Method) -> Self {
        Metrics {
            requests: metrics::counter_vec(
                registry,
                "kart_retriever_requests_total",
                "HTTP requests by endpoint and status code",
                &["endpoint", "code"],
            ),
            queries: metrics::counter_vec(
                registry,
                "kart_retriever_queries_total",
                "Queries answered",
                &["method"],
            )
            .with_label_values(&[format!("{method:?}").to_lowercase()]),
            latency: metrics::histogram_vec(
                registry,
                "kart_retriever_request_duration_seconds",
                "Time to answer a request",
                &["endpoint"],
                metrics::latency_buckets(),
            ),
            errors: metrics::counter_vec(
                registry,
                "kart_retriever_errors_total",
                "Requests that failed, by endpoint and kind (bad_request, not_ready, too_large, backend, internal)",
                &["endpoint", "kind"],
            ),
            documents: metrics::gauge(registry, "kart_retriever_documents", "Documents in the loaded index"),
        }
    }
}

/// Shared state of the handlers.
pub struct AppState {
    config: RetrieverConfig,
    backend: OnceLock<Backend>,
    pages: PageReader,
    /// ASearcher's local pages, when `pages` is configured (loaded with the backend).
    local_pages: OnceLock<LocalPages>,
    ready: Readiness,
    metrics: Metrics,
}

impl AppState {
    /// State with no backend yet; `/readyz` answers 503 until [`AppState::set_backend`].
    pub fn new(config: RetrieverConfig, registry: &Registry) -> Result<Arc<Self>, RetrieverError> {
        let pages = PageReader::new(&config.online, std::env::var("JINA_API_KEY").ok(), registry)?;
        Ok(Arc::new(AppState {
            metrics: Metrics::new(registry, config.method),
            config,
            backend: OnceLock::new(),
            pages,
            local_pages: OnceLock::new(),
            ready: Readiness::default(),
        }))
    }

    /// Installs the loaded backend and marks the service ready.
    pub fn set_backend(&self, backend: Backend) {
        if let Some(n) = backend.num_docs() {
            self.metrics.documents.set(n as i64);
        }
        if self.backend.set(backend).is_ok() {
            self.ready.set(true);
        }
    }

    /// The readiness flag `/readyz` reports.
    pub fn readiness(&self) -> Readiness {
        self.ready.clone()
    }
}

/// The complete router: `/retrieve`, `/access`, `/healthz`, `/readyz`, `/metrics`.
pub fn router(state: Arc<AppState>, registry: Registry) -> Router {
    let ops = http::ops_routes(registry, state.readiness());
    Router::new()
        .route("/retrieve", post(retrieve))
        .route("/access", post(access))
        .route_layer(middleware::from_fn(http::panics::contain))
        .route_layer(middleware::from_fn_with_state(state.clone(), count_panics))
        .with_state(state)
        .merge(ops)
}

/// Counts a request whose handler panicked ([`http::panics::contain`] answered it) as an
/// `internal` error of its endpoint.
async fn count_panics(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let endpoint = request.uri().path().trim_start_matches('/').to_string();
    let response = next.run(request).await;
    if response.extensions().get::<http::panics::Panicked>().is_some() {
        observe(&state, &endpoint, started, &response, Some("internal"));
    }
    response
}

/// A 500 naming `field`, saying no more than that the cause is in the log.
fn internal_error(field: &str) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        field: field.into(),
        message: "internal error; the retriever's log has the cause".into(),
    }
}

/// Runs the service until SIGINT/SIGTERM: binds first, loads the backend in the background.
pub async fn run(config: RetrieverConfig) -> Result<(), RetrieverError> {
    let addr = http::bind_address(&config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| RetrieverError::Io { path: addr.clone().into(), source })?;
    serve(listener, config).await
}

/// [`run`] on a bound listener.
async fn serve(listener: tokio::net::TcpListener, config: RetrieverConfig) -> Result<(), RetrieverError> {
    let registry = Registry::new();
    let addr = listener.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    let state = AppState::new(config.clone(), &registry)?;
    tracing::info!(%addr, method = ?config.method, "retriever listening");
    let loading = state.clone();
    let load_registry = registry.clone();
    let loader = tokio::task::spawn_blocking(move || {
        if let Some(path) = &loading.config.pages {
            let pages = LocalPages::load(path)?;
            tracing::info!(pages = pages.len(), path = %path.display(), "local pages loaded");
            let _ = loading.local_pages.set(pages);
        }
        Backend::open(&loading.config, &load_registry).map(|b| loading.set_backend(b))
    });
    let server = tokio::spawn(http::serve(listener, router(state, registry)));
    // A backend that cannot load ends the process with its error (the pod restarts and reports it)
    // rather than leaving a server that is never ready.
    match loader.await {
        Ok(Ok(())) => tracing::info!("index loaded; ready"),
        Ok(Err(e)) => {
            server.abort();
            return Err(e);
        }
        Err(e) => {
            server.abort();
            return Err(RetrieverError::task_failed("loading the index", e));
        }
    }
    let served = server.await.map_err(|e| RetrieverError::task_failed("the server", e))?;
    served.map_err(|source| RetrieverError::Io { path: addr.into(), source })
}

/// Records a request's outcome in the metrics.
fn observe(
    state: &AppState,
    endpoint: &str,
    started: Instant,
    response: &Response,
    error_kind: Option<&str>,
) {
    let m = &state.metrics;
    m.requests.with_label_values(&[endpoint, response.status().as_str()]).inc();
    m.latency.with_label_values(&[endpoint]).observe(started.elapsed().as_secs_f64());
    if let Some(kind) = error_kind {
        m.errors.with_label_values(&[endpoint, kind]).inc();
    }
}

async fn retrieve(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    let (response, error_kind) = match answer_retrieve(&state, body).await {
        Ok(json) => (([(header::CONTENT_TYPE, "application/json")], json).into_response(), None),
        Err((kind, err)) => (err.into_response(), Some(kind)),
    };
    observe(&state, "retrieve", started, &response, error_kind);
    response
}

/// The serialised answer, at most `max_response_bytes` long.
async fn answer_retrieve(state: &AppState, body: Body) -> Result<Vec<u8>, (&'static str, ApiError)> {
    let body = http::read_json(body, state.config.max_body_bytes).await.map_err(|e| ("bad_request", e))?;
    let request = RetrieveRequest::parse(&body, &state.config.retrieve_limits())
        .map_err(|e| ("bad_request", ApiError::from(e)))?;
    if request.queries.is_empty() {
        return Ok(br#"{"result":[]}"#.to_vec());
    }
    let backend = state.backend.get().ok_or_else(|| {
        (
            "not_ready",
            ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                field: "index".into(),
                message: "the index is still loading".into(),
            },
        )
    })?;
    let topk = request.topk.unwrap_or(state.config.topk);
    let n = request.queries.len() as u64;
    let results = backend.retrieve(request.queries, topk).await.map_err(backend_error)?;
    state.metrics.queries.inc_by(n);
    let result = results
        .iter()
        .map(|hits| match request.return_scores {
            true => Hits::Scored(hits),
            false => Hits::Documents(hits.iter().map(|h| &h.document).collect()),
        })
        .collect();
    let json = serde_json::to_vec(&Retrieved { result }).map_err(|e| {
        let message = format!("serialising the results: {e}");
        ("backend", ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: "queries".into(), message })
    })?;
    if json.len() > state.config.max_response_bytes {
        let message = format!(
            "the results take {} bytes, over max_response_bytes ({}): ask for fewer queries or a smaller topk",
            json.len(),
            state.config.max_response_bytes
        );
        return Err((
            "too_large",
            ApiError { status: StatusCode::PAYLOAD_TOO_LARGE, field: "queries".into(), message },
        ));
    }
    Ok(json)
}

/// `/retrieve`'s answer as Search-R1's `retrieval_server.py` writes it, serialised straight from
/// the hits.
#[derive(Serialize)]
struct Retrieved<'a> {
    result: Vec<Hits<'a>>,
}

/// One query's hits: with their scores (`return_scores`), or the documents alone.
#[derive(Serialize)]
#[serde(untagged)]
enum Hits<'a> {
    Scored(&'a [RetrievalResult]),
    Documents(Vec<&'a Document>),
}

/// The answer to a failed retrieval: 502 when an upstream service failed, 500 when the local index
/// did, and a bare 500 for a bug (its cause logged only).
fn backend_error(error: RetrieverError) -> (&'static str, ApiError) {
    let (status, kind) = match &error {
        RetrieverError::Internal { .. } => {
            tracing::error!(%error, "retrieval failed");
            return ("internal", internal_error("queries"));
        }
        RetrieverError::Upstream { .. } => (StatusCode::BAD_GATEWAY, "backend"),
        RetrieverError::BadRequest { field, reason } => {
            return ("bad_request", ApiError::invalid(*field, reason.clone()));
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "backend"),
    };
    tracing::warn!(%error, "retrieval failed");
    (kind, ApiError { status, field: "queries".into(), message: error.to_string() })
}

async fn access(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let started = Instant::now();
    let (response, error_kind) = match answer_access(&state, body).await {
        Ok(value) => (Json(value).into_response(), None),
        Err(err) => (err.into_response(), Some("bad_request")),
    };
    observe(&state, "access", started, &response, error_kind);
    response
}

async fn answer_access(state: &AppState, body: Body) -> Result<Value, ApiError> {
    let body = http::read_json(body, state.config.max_body_bytes).await?;
    let urls = AccessRequest::parse(&body)?.urls;
    if state.config.pages.is_some() {
        // ASearcher's local server: the stored page (with kart's `page` beside its `contents`), or
        // null.
        let Some(local) = state.local_pages.get() else {
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                field: "urls".into(),
                message: "the local pages are still loading".into(),
            });
        };
        let result: Vec<Value> = urls
            .iter()
            .map(|url| match local.get(url) {
                Some(page) => {
                    let mut page = page.clone();
                    let contents = page.get("contents").cloned().unwrap_or(Value::Null);
                    page.entry("page").or_insert(contents);
                    Value::Object(page)
                }
                None => Value::Null,
            })
            .collect();
        return Ok(json!({ "result": result }));
    }
    let pages = state.pages.access(&urls).await;
    let result: Vec<Value> = urls
        .iter()
        .zip(pages)
        .map(|(url, page)| match page {
            Ok(text) => json!({"url": url, "page": &*text}),
            Err(e) => json!({"url": url, "page": null, "error": e.to_string()}),
        })
        .collect();
    Ok(json!({ "result": result }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalIndex;
    use kart_core::agent::search_r1::document;

    /// A fixed index: every query gets documents "0".."k-1" with descending scores.
    struct Fixed;

    impl LocalIndex for Fixed {
        fn search_batch(
            &self,
            queries: &[String],
            topk: usize,
        ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
            Ok(queries
                .iter()
                .map(|q| {
                    (0..topk)
                        .map(|i| RetrievalResult {
                            document: document(i.to_string(), format!("\"{q}\"\npassage {i}")),
                            score: (topk - i) as f64,
                        })
                        .collect()
                })
                .collect())
        }
        fn num_docs(&self) -> u64 {
            10
        }
    }

    async fn post(router: &Router, uri: &str, body: &str) -> (StatusCode, Value) {
        use tower::ServiceExt;
        let request = axum::http::Request::post(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    fn service(max_body_bytes: usize) -> (Router, Arc<AppState>, Registry) {
        let registry = Registry::new();
        let config = RetrieverConfig { max_body_bytes, ..RetrieverConfig::default() };
        let state = AppState::new(config, &registry).unwrap();
        (router(state.clone(), registry.clone()), state, registry)
    }

    #[tokio::test]
    async fn answers_in_search_r1_shape_with_and_without_scores() {
        let (router, state, registry) = service(1 << 20);
        state.set_backend(Backend::Local(IndexSearcher::new(Arc::new(Fixed))));
        let (status, v) =
            post(&router, "/retrieve", r#"{"queries": ["paris", "rome"], "topk": 2, "return_scores": true}"#)
                .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["result"].as_array().unwrap().len(), 2);
        assert_eq!(v["result"][1][0]["document"]["contents"], "\"rome\"\npassage 0");
        assert_eq!(v["result"][1][0]["document"]["title"], "rome");
        assert_eq!(v["result"][0][1]["score"], 1.0);
        let (_, v) = post(&router, "/retrieve", r#"{"queries": ["paris"]}"#).await;
        assert_eq!(v["result"][0].as_array().unwrap().len(), 3, "server default topk");
        assert_eq!(v["result"][0][0]["id"], "0", "bare documents without scores");
        let text = kart_http::metrics::encode(&registry);
        assert!(text.contains("kart_retriever_queries_total{method=\"bm25\"} 3"), "{text}");
        assert!(text.contains("kart_retriever_documents 10"), "{text}");
    }

    #[tokio::test]
    async fn an_answer_over_max_response_bytes_is_refused_with_413() {
        let registry = Registry::new();
        let config = RetrieverConfig { max_response_bytes: 2048, ..RetrieverConfig::default() };
        let state = AppState::new(config, &registry).unwrap();
        state.set_backend(Backend::Local(IndexSearcher::new(Arc::new(Fixed))));
        let router = router(state, registry);
        let (status, v) = post(&router, "/retrieve", r#"{"queries": ["paris"], "topk": 2}"#).await;
        assert_eq!((status, v["result"][0].as_array().map(Vec::len)), (StatusCode::OK, Some(2)));
        let (status, v) = post(&router, "/retrieve", r#"{"queries": ["paris"], "topk": 100}"#).await;
        assert_eq!((status, v["error"]["field"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("queries")));
        assert!(v["error"]["message"].as_str().unwrap().contains("max_response_bytes (2048)"), "{v}");
    }

    #[tokio::test]
    async fn empty_queries_are_valid_even_before_the_index_loads() {
        let (router, _, _) = service(1 << 20);
        let (status, v) =
            post(&router, "/retrieve", r#"{"queries": [], "topk": 3, "return_scores": true}"#).await;
        assert_eq!((status, v), (StatusCode::OK, json!({"result": []})));
        let (status, v) = post(&router, "/retrieve", r#"{"queries": ["a"]}"#).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v["error"]["field"], "index");
    }

    #[tokio::test]
    async fn bad_input_gets_4xx_json_and_the_server_keeps_serving() {
        let (router, state, registry) = service(64);
        state.set_backend(Backend::Local(IndexSearcher::new(Arc::new(Fixed))));
        for (body, status, field) in [
            ("{not json", StatusCode::BAD_REQUEST, "body"),
            (r#"{"topk": 3}"#, StatusCode::UNPROCESSABLE_ENTITY, "queries"),
            (r#"{"queries": [1]}"#, StatusCode::UNPROCESSABLE_ENTITY, "queries[0]"),
            (r#"{"queries": ["a"], "topk": -1}"#, StatusCode::UNPROCESSABLE_ENTITY, "topk"),
            (r#"{"queries": ["a"], "topK": 50}"#, StatusCode::UNPROCESSABLE_ENTITY, "topK"),
        ] {
            let (got, v) = post(&router, "/retrieve", body).await;
            assert_eq!((got, v["error"]["field"].as_str()), (status, Some(field)), "{body}");
        }
        let big = format!(r#"{{"queries": ["{}"]}}"#, "x".repeat(100));
        let (status, v) = post(&router, "/retrieve", &big).await;
        assert_eq!((status, v["error"]["field"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("body")));
        let (status, _) = post(&router, "/retrieve", r#"{"queries": ["ok"]}"#).await;
        assert_eq!(status, StatusCode::OK);
        let text = kart_http::metrics::encode(&registry);
        assert!(
            text.contains("kart_retriever_errors_total{endpoint=\"retrieve\",kind=\"bad_request\"} 6"),
            "{text}"
        );
    }

    /// An index whose every search panics, as a bug or a damaged file would make it.
    struct Panicking;

    impl LocalIndex for Panicking {
        fn search_batch(&self, _: &[String], _: usize) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
            panic!("Compressed array seems too small");
        }
        fn num_docs(&self) -> u64 {
            10
        }
    }

    #[tokio::test]
    async fn a_panicking_search_is_a_500_without_its_message() {
        let (router, state, registry) = service(1 << 20);
        state.set_backend(Backend::Local(IndexSearcher::new(Arc::new(Panicking))));
        for _ in 0..2 {
            let (status, v) = post(&router, "/retrieve", r#"{"queries": ["a", "b"]}"#).await;
            assert_eq!(
                (status, v["error"]["field"].as_str()),
                (StatusCode::INTERNAL_SERVER_ERROR, Some("queries"))
            );
            let message = v["error"]["message"].as_str().unwrap();
            assert!(!message.contains("Compressed") && !message.contains("panicked"), "{message}");
        }
        let (status, _) = post(&router, "/retrieve", r#"{"queries": []}"#).await;
        assert_eq!(status, StatusCode::OK, "the server keeps serving");
        let text = kart_http::metrics::encode(&registry);
        assert!(
            text.contains(r#"kart_retriever_errors_total{endpoint="retrieve",kind="internal"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kart_retriever_requests_total{code="500",endpoint="retrieve"} 2"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_failed_task_names_its_panic() {
        let joined = tokio::task::spawn_blocking(|| panic!("index {} broke", 7)).await;
        let error = RetrieverError::task_failed("the index search", joined.unwrap_err());
        assert_eq!(error.to_string(), "the index search failed unexpectedly: panicked: index 7 broke");
        let (kind, api) = backend_error(error);
        assert_eq!((kind, api.status), ("internal", StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!api.message.contains("broke"), "{}", api.message);
        let upstream = RetrieverError::Upstream { service: "serper", reason: "HTTP 503".into() };
        assert_eq!(backend_error(upstream).1.status, StatusCode::BAD_GATEWAY);
    }

    async fn explode() -> &'static str {
        panic!("handler bug {}", 42)
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_500() {
        let registry = Registry::new();
        let state = AppState::new(RetrieverConfig::default(), &registry).unwrap();
        let router = Router::new()
            .route("/explode", axum::routing::post(explode))
            .route_layer(middleware::from_fn(http::panics::contain))
            .route_layer(middleware::from_fn_with_state(state.clone(), count_panics))
            .with_state(state);
        let (status, v) = post(&router, "/explode", "{}").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!v["error"]["message"].as_str().unwrap().contains("42"), "{v}");
        let text = kart_http::metrics::encode(&registry);
        assert!(
            text.contains(r#"kart_retriever_errors_total{endpoint="explode",kind="internal"} 1"#),
            "{text}"
        );
    }

    /// A BM25 index of a few passages in a new temporary folder.
    fn bm25_index() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        let rows: Vec<String> = (0..300)
            .map(|i| {
                json!({"id": i.to_string(), "contents": format!("\"Title {i}\"\npassage number {i}")})
                    .to_string()
            })
            .collect();
        std::fs::write(&corpus, rows.join("\n")).unwrap();
        let index = dir.path().join("index");
        crate::bm25::build(&corpus, &index, 50_000_000, |_, _, _| {}).unwrap();
        (dir, index)
    }

    /// `serve`s `index` on a free port; returns the task and the base URL.
    async fn serve_index(
        index: &std::path::Path,
    ) -> (tokio::task::JoinHandle<Result<(), RetrieverError>>, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let config = RetrieverConfig { index: Some(index.to_path_buf()), ..RetrieverConfig::default() };
        (tokio::spawn(serve(listener, config)), url)
    }

    #[tokio::test]
    async fn a_damaged_index_never_becomes_ready_and_ends_the_server() {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + std::time::Duration::from_secs(600);
        let ((_sound_dir, sound), (_damaged_dir, damaged)) = (bm25_index(), bm25_index());

        // A sound index: ready, and searched.
        let (server, url) = serve_index(&sound).await;
        loop {
            let ready = client.get(format!("{url}/readyz")).send().await.is_ok_and(|r| r.status() == 200);
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "the sound index never became ready");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let answer =
            client.post(format!("{url}/retrieve")).json(&json!({"queries": ["passage 7"]})).send().await;
        assert_eq!(answer.unwrap().status(), 200);
        server.abort();

        // Half of the document store overwritten: the server ends with the error naming the file,
        // and no /readyz in between says ready.
        let store = std::fs::read_dir(&damaged)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "store"))
            .unwrap();
        let len = std::fs::metadata(&store).unwrap().len() as usize;
        crate::docstore::tests::scribble(&store, 0, len / 2);
        let (mut server, url) = serve_index(&damaged).await;
        let ended = loop {
            tokio::select! {
                ended = &mut server => break ended.unwrap(),
                answer = client.get(format!("{url}/readyz")).send() => {
                    if let Ok(answer) = answer {
                        assert_eq!(answer.status(), 503, "a damaged index made the server ready");
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            assert!(Instant::now() < deadline, "the server with a damaged index kept running");
        };
        let error = ended.unwrap_err().to_string();
        assert!(error.starts_with(&format!("{}: damaged", store.display())), "{error}");
    }

    #[tokio::test]
    async fn access_validates_urls() {
        let (router, _, _) = service(1 << 20);
        let (status, v) = post(&router, "/access", r#"{"urls": "http://x"}"#).await;
        assert_eq!((status, v["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("urls")));
        let (status, v) = post(&router, "/access", r#"{"urls": ["ftp://x"]}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert!(v["result"][0]["error"].as_str().unwrap().contains("ftp://x"), "{v}");
    }
}
