//! The rollout worker's HTTP service (`kart rollout serve`), the stateless, horizontally scaled
//! piece of a RolloutPool.
//!
//! - `POST /rollout` `{prompts: [{id, messages | prompt, ground_truth, data_source}], n, sampling,
//!   policy_version, env}` streams NDJSON: one line per finished group of `n` trajectories, in
//!   completion order. A client that disconnects cancels the work of its request.
//! - `POST /weights` `{version, url | path}` makes the embedded engine load new weights (a
//!   safetensors file, fetched from the trainer's `/weights/{version}` or read from a shared path).
//! - `GET /healthz`, `/readyz`, `/metrics`.

use super::config::{EngineConfig, RolloutConfig};
use super::embedded::EmbeddedEngine;
use super::engine::Engine;
use super::env::{Context, EnvConfig, Environment};
use super::group::run_group;
use super::metrics::RolloutMetrics;
use super::task::Task;
use crate::http::{self, ApiError, Readiness};
use crate::model::{CausalLm, ChatTemplate, ModelError, SamplingParams, Tokenizer};
use crate::tools::python::PythonSandbox;
use crate::tools::search::{CachedSearch, HttpRetriever};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use prometheus::Registry;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("model {path}: {source}")]
    Model { path: std::path::PathBuf, source: Box<ModelError> },
    #[error("python sandbox: {0}")]
    Sandbox(String),
    #[error("listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("config: {0}")]
    Config(String),
}

/// One rollout worker: the context environments run in, and its default environment.
pub struct Worker {
    ctx: Context,
    env: Arc<dyn Environment>,
    embedded: Option<EmbeddedEngine>,
    metrics: RolloutMetrics,
    groups: Arc<Semaphore>,
    config: RolloutConfig,
}

impl Worker {
    /// Loads the tokenizer, chat template and engine, and connects the tools.
    pub fn build(config: RolloutConfig, registry: &Registry) -> Result<Self, WorkerError> {
        let model_error =
            |source| WorkerError::Model { path: config.model.clone(), source: Box::new(source) };
        let tokenizer = Tokenizer::load(&config.model).map_err(model_error)?;
        let chat_template = ChatTemplate::load(&config.model).map_err(model_error)?;
        let (engine, embedded): (Arc<dyn Engine>, _) = match &config.engine {
            EngineConfig::Embedded { max_batch, seed } => {
                let model =
                    CausalLm::load(&config.model, tch::Device::cuda_if_available()).map_err(model_error)?;
                let engine = EmbeddedEngine::spawn(model, tokenizer.clone(), *max_batch, 0, *seed);
                (Arc::new(engine.clone()), Some(engine))
            }
            other => (super::remote::engine(other).map_err(WorkerError::Config)?, None),
        };
        let tool_timeout = Duration::from_secs_f64(config.tool_timeout_secs);
        let retriever =
            config.retriever_url.as_deref().map(|url| Arc::new(HttpRetriever::new(url, tool_timeout)));
        let search = retriever.clone().map(|r| {
            Arc::new(CachedSearch::new(r, config.search_cache_entries, config.search_concurrency)) as Arc<_>
        });
        let python =
            PythonSandbox::new(config.python.clone()).map_err(|e| WorkerError::Sandbox(e.to_string()))?;
        let ctx = Context {
            engine,
            tokenizer,
            chat_template,
            search,
            access: retriever.map(|r| r as Arc<_>),
            python: Some(Arc::new(python)),
            retry: config.retry.clone(),
        };
        Ok(Worker {
            env: config.env.build(),
            ctx,
            embedded,
            metrics: RolloutMetrics::new(registry),
            groups: Arc::new(Semaphore::new(config.max_concurrent_groups.max(1))),
            config,
        })
    }
}

/// A `/rollout` request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutRequest {
    prompts: Vec<Task>,
    #[serde(default = "one")]
    n: usize,
    #[serde(default)]
    sampling: SamplingParams,
    /// The policy version the trainer expects; recorded, the tokens carry the actual versions.
    #[serde(default)]
    policy_version: Option<i64>,
    /// An environment for this request instead of the worker's default.
    #[serde(default)]
    env: Option<EnvConfig>,
}

fn one() -> usize {
    1
}

/// Most trajectories per group.
const MAX_N: usize = 1024;

fn parse_request(body: serde_json::Value) -> Result<RolloutRequest, ApiError> {
    let request: RolloutRequest =
        serde_json::from_value(body).map_err(|e| ApiError::invalid("body", e.to_string()))?;
    if !(1..=MAX_N).contains(&request.n) {
        return Err(ApiError::invalid("n", format!("{} is not in 1..={MAX_N}", request.n)));
    }
    request.sampling.validate().map_err(|e| ApiError::invalid("sampling", e.to_string()))?;
    let mut ids = HashSet::new();
    for (i, task) in request.prompts.iter().enumerate() {
        if task.messages.as_ref().is_none_or(Vec::is_empty) && task.prompt.is_none() {
            return Err(ApiError::invalid(format!("prompts[{i}]"), "needs `messages` or `prompt`"));
        }
        if !ids.insert(task.id.as_str()) {
            return Err(ApiError::invalid(format!("prompts[{i}].id"), format!("duplicate id `{}`", task.id)));
        }
    }
    Ok(request)
}

/// The complete router: `/rollout`, `/weights`, `/healthz`, `/readyz`, `/metrics`.
pub fn router(worker: Arc<Worker>, registry: Registry) -> Router {
    let ready = Readiness::default();
    ready.set(true);
    Router::new()
        .route("/rollout", post(rollout))
        .route("/weights", post(weights))
        .with_state(worker)
        .merge(http::ops_routes(registry, ready))
}

/// Runs the worker until SIGINT/SIGTERM.
pub async fn run(config: RolloutConfig) -> Result<(), WorkerError> {
    let registry = Registry::new();
    let addr = http::bind_address(&config.host, config.port);
    let worker = tokio::task::block_in_place(|| Worker::build(config, &registry))?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| WorkerError::Listen { addr: addr.clone(), source })?;
    tracing::info!(%addr, env = worker.env.name(), engine = worker.ctx.engine.name(), "rollout worker listening");
    http::serve(listener, router(Arc::new(worker), registry))
        .await
        .map_err(|source| WorkerError::Listen { addr, source })
}

async fn rollout(State(worker): State<Arc<Worker>>, body: Body) -> Response {
    let request = match http::read_json(body, worker.config.max_body_bytes).await.and_then(parse_request) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Some(v) = request.policy_version {
        tracing::debug!(
            policy_version = v,
            prompts = request.prompts.len(),
            n = request.n,
            "rollout request"
        );
    }
    let env = request.env.as_ref().map_or_else(|| worker.env.clone(), EnvConfig::build);
    let (lines, mut receiver) = mpsc::channel::<String>(16);
    tokio::spawn(produce(worker, env, request, lines));
    let stream = futures::stream::poll_fn(move |cx| {
        receiver.poll_recv(cx).map(|line| line.map(Ok::<_, std::convert::Infallible>))
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response()
}

/// Rolls out every group of a request, sending each as one NDJSON line as it finishes; stops all
/// work when the client goes away (the line channel closes).
async fn produce(
    worker: Arc<Worker>,
    env: Arc<dyn Environment>,
    request: RolloutRequest,
    lines: mpsc::Sender<String>,
) {
    let mut groups = tokio::task::JoinSet::new();
    for task in request.prompts {
        let (worker, env, lines, sampling) =
            (worker.clone(), env.clone(), lines.clone(), request.sampling.clone());
        let n = request.n;
        groups.spawn(async move {
            let Ok(_permit) = worker.groups.clone().acquire_owned().await else { return };
            let line = match run_group(&worker.ctx, env.as_ref(), &task, n, &sampling, Some(&worker.metrics))
                .await
            {
                Ok(group) => serde_json::to_string(&group),
                Err(e) => serde_json::to_string(&json!({"prompt_id": task.id, "error": e.to_string()})),
            };
            let _ = lines.send(line.expect("groups serialise") + "\n").await;
        });
    }
    tokio::select! {
        () = lines.closed() => {
            tracing::info!(pending = groups.len(), "client disconnected; cancelling its rollouts");
            groups.abort_all();
        }
        () = async { while groups.join_next().await.is_some() {} } => {}
    }
}

/// A `/weights` request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsRequest {
    version: i64,
    url: Option<String>,
    path: Option<std::path::PathBuf>,
}

async fn weights(State(worker): State<Arc<Worker>>, body: Body) -> Response {
    match load_weights(&worker, body).await {
        Ok(version) => Json(json!({"version": version})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn load_weights(worker: &Worker, body: Body) -> Result<i64, ApiError> {
    let body = http::read_json(body, worker.config.max_body_bytes).await?;
    let request: WeightsRequest =
        serde_json::from_value(body).map_err(|e| ApiError::invalid("body", e.to_string()))?;
    let engine = worker.embedded.as_ref().ok_or_else(|| ApiError {
        status: StatusCode::CONFLICT,
        field: "engine".into(),
        message: format!(
            "the {} engine loads weights itself; only the embedded engine loads through the worker",
            worker.ctx.engine.name()
        ),
    })?;
    let (file, downloaded) = match (&request.url, &request.path) {
        (Some(url), None) => (download(url).await?, true),
        (None, Some(path)) if path.is_dir() => (path.join("model.safetensors"), false),
        (None, Some(path)) => (path.clone(), false),
        _ => return Err(ApiError::invalid("url", "give exactly one of `url` and `path`")),
    };
    let read = file.clone();
    let tensors = tokio::task::spawn_blocking(move || tch::Tensor::read_safetensors(&read)).await;
    if downloaded {
        let _ = tokio::fs::remove_file(&file).await;
    }
    let tensors = tensors
        .map_err(|e| ApiError::invalid("path", e.to_string()))?
        .map_err(|e| ApiError::invalid("path", format!("{}: not a safetensors file: {e}", file.display())))?;
    engine
        .load_weights(tensors, request.version)
        .await
        .map_err(|e| ApiError::invalid("version", e.to_string()))?;
    tracing::info!(version = request.version, "loaded new weights");
    Ok(request.version)
}

/// Fetches a safetensors file into a temporary file.
async fn download(url: &str) -> Result<std::path::PathBuf, ApiError> {
    let fetch_error = |e: String| ApiError {
        status: StatusCode::BAD_GATEWAY,
        field: "url".into(),
        message: format!("{url}: {e}"),
    };
    let response = reqwest::get(url).await.map_err(|e| fetch_error(e.to_string()))?;
    if !response.status().is_success() {
        return Err(fetch_error(format!("answered {}", response.status())));
    }
    let bytes = response.bytes().await.map_err(|e| fetch_error(e.to_string()))?;
    let file = std::env::temp_dir().join(format!(
        "kart-weights-{}-{}.safetensors",
        std::process::id(),
        rand::random::<u64>()
    ));
    tokio::fs::write(&file, &bytes).await.map_err(|e| fetch_error(e.to_string()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::env::search_r1::SearchR1Config;
    use crate::rollout::fake::{Reply, ScriptedEngine};
    use crate::rollout::retry::RetryPolicy;
    use futures::StreamExt;
    use serde_json::Value;
    use std::path::Path;
    use tower::ServiceExt;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/models/tiny-qwen2")
    }

    fn worker(engine: Arc<ScriptedEngine>, max_concurrent_groups: usize) -> (Arc<Worker>, Registry) {
        let registry = Registry::new();
        let ctx = Context {
            engine,
            tokenizer: Tokenizer::load(fixture()).unwrap(),
            chat_template: ChatTemplate::load(fixture()).unwrap(),
            search: None,
            access: None,
            python: None,
            retry: RetryPolicy { retries: 0, backoff_ms: 1 },
        };
        let config = RolloutConfig { max_concurrent_groups, ..RolloutConfig::default() };
        let worker = Worker {
            env: EnvConfig::SearchR1(SearchR1Config::default()).build(),
            ctx,
            embedded: None,
            metrics: RolloutMetrics::new(&registry),
            groups: Arc::new(Semaphore::new(max_concurrent_groups)),
            config,
        };
        (Arc::new(worker), registry)
    }

    fn answering() -> Arc<ScriptedEngine> {
        Arc::new(answering_engine())
    }

    fn answering_engine() -> ScriptedEngine {
        ScriptedEngine::new(Tokenizer::load(fixture()).unwrap(), |context, _| {
            let answer = if context.contains("France") { "Paris" } else { "Rome" };
            Reply::Text(format!("<think>easy</think>\n<answer> {answer} </answer>"))
        })
    }

    async fn post(router: Router, uri: &str, body: Value) -> Response {
        let request = axum::http::Request::post(uri).body(Body::from(body.to_string())).unwrap();
        router.oneshot(request).await.unwrap()
    }

    fn prompts(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"id": format!("p{i}"), "prompt": "What is the capital of France", "ground_truth": ["Paris"], "data_source": "nq"}))
            .collect()
    }

    #[tokio::test]
    async fn streams_one_line_per_group() {
        let (worker, registry) = worker(answering(), 8);
        let response = post(
            router(worker, registry.clone()),
            "/rollout",
            json!({"prompts": prompts(3), "n": 2, "sampling": {"temperature": 1.0, "seed": 7}}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/x-ndjson");
        let body = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        let lines: Vec<Value> =
            std::str::from_utf8(&body).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        let mut ids: Vec<&str> = lines.iter().map(|g| g["prompt_id"].as_str().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, ["p0", "p1", "p2"]);
        for group in &lines {
            let trajectories = group["trajectories"].as_array().unwrap();
            assert_eq!(trajectories.len(), 2);
            assert_eq!(trajectories[0]["reward"], 1.0);
            assert_eq!(trajectories[1]["status"], "completed");
            let t: crate::agent::trajectory::Trajectory =
                serde_json::from_value(trajectories[0].clone()).unwrap();
            assert!(t.loss_mask().contains(&1));
        }
        let text = crate::metrics::encode(&registry);
        assert!(
            text.contains("kart_rollout_trajectories_total{env=\"search-r1\",status=\"completed\"} 6"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn bad_requests_name_the_field() {
        let (worker, registry) = worker(answering(), 8);
        let app = router(worker, registry);
        for (body, field) in [
            (json!({"prompts": prompts(1), "n": 0}), "n"),
            (json!({"prompts": [{"id": "a", "ground_truth": []}]}), "prompts[0]"),
            (json!({"prompts": [prompts(1)[0].clone(), prompts(1)[0].clone()]}), "prompts[1].id"),
            (json!({"prompts": prompts(1), "sampling": {"top_p": 2.0}}), "sampling"),
            (json!({"prompt": []}), "body"),
        ] {
            let response = post(app.clone(), "/rollout", body.clone()).await;
            assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            let v: Value =
                serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap())
                    .unwrap();
            assert_eq!(v["error"]["field"], field, "{body}");
        }
        let response = post(app, "/weights", json!({"version": 1, "path": "/nowhere"})).await;
        assert_eq!(response.status(), StatusCode::CONFLICT, "a scripted engine loads no weights");
    }

    #[tokio::test]
    async fn a_client_that_disconnects_cancels_its_work() {
        let engine = Arc::new(answering_engine().with_latency(Duration::from_millis(20)));
        let (worker, registry) = worker(engine.clone(), 1);
        let response =
            post(router(worker.clone(), registry), "/rollout", json!({"prompts": prompts(50), "n": 1})).await;
        let mut body = response.into_body().into_data_stream();
        let first = body.next().await.unwrap().unwrap();
        assert!(std::str::from_utf8(&first).unwrap().contains("prompt_id"));
        drop(body);
        // The producer notices the closed stream and aborts the remaining groups.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while worker.metrics.in_flight.get() > 0 || Arc::strong_count(&worker) > 1 {
            assert!(std::time::Instant::now() < deadline, "work still running after the client left");
            tokio::task::yield_now().await;
        }
        assert!(engine.calls() < 50, "only the groups started before the disconnect ran: {}", engine.calls());
    }
}
