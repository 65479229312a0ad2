//! The rollout worker's HTTP service (`kart rollout serve`), the stateless, horizontally scaled
//! piece of a RolloutPool.
//!
//! - `POST /rollout` `{prompts: [{id, messages | prompt, ground_truth, data_source}], n, sampling,
//!   policy_version, env, weights}` streams NDJSON: one line per finished group of `n`
//!   trajectories, in completion order. A client that disconnects cancels the work of its request.
//!   `weights: {version, url | path}` names the version the request wants and where its weights
//!   are: an embedded engine behind it loads them before generating (see [`crate::weights`]);
//!   engines that load weights themselves (SGLang, vLLM) ignore the field.
//! - `POST /weights` `{version, url | path}` makes the embedded engine load new weights now (a
//!   safetensors file, fetched from the trainer's `/weights/{version}` or read from a shared path).
//!   It reaches one worker of a Service; the `weights` field of `/rollout` reaches the others.
//! - `GET /healthz`, `/readyz`, `/metrics`.

use crate::descriptors::{self, DescriptorError};
use crate::env::{self, Context, ContextError, Environment};
use crate::group::run_group;
use crate::metrics::RolloutMetrics;
use crate::weights::{Downloader, LoadError, WeightLoader};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use kart_core::config::ConfigError;
use kart_core::config::env::EnvConfig;
use kart_core::config::rollout::RolloutConfig;
use kart_core::engine::{Engine, LoadWeights};
use kart_core::wire::{RolloutLine, RolloutRequest, WeightSource};
use kart_http::token::{Token, TokenError};
use kart_http::{self as http, ApiError, Readiness};
use prometheus::Registry;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{Semaphore, mpsc};

/// Seconds a client told 429 waits before it asks again.
const RETRY_AFTER_SECS: u32 = 1;

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Descriptors(#[from] DescriptorError),
    #[error("read the open-file limit: {0}")]
    Rlimit(std::io::Error),
    #[error("listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
}

/// The engine a worker generates with and, when the worker loads its weights (the embedded
/// engine), the same engine as a weights target; SGLang and vLLM load their own.
#[derive(Clone)]
pub struct WorkerEngine {
    pub engine: Arc<dyn Engine>,
    pub weights: Option<Arc<dyn LoadWeights>>,
}

/// One rollout worker: the context environments run in, and its default environment.
pub struct Worker {
    ctx: Context,
    env: Arc<dyn Environment>,
    /// The engine's weights; `None` for engines that load weights themselves.
    weights: Option<Arc<WeightLoader>>,
    metrics: RolloutMetrics,
    groups: Arc<Semaphore>,
    /// Trajectories of the requests being answered.
    in_flight: Arc<AtomicUsize>,
    /// What `/rollout` and `/weights` requests must bear.
    token: Option<Token>,
    config: RolloutConfig,
}

/// A request's share of [`Worker::in_flight`], given back when dropped.
struct Reservation {
    in_flight: Arc<AtomicUsize>,
    trajectories: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.trajectories, Ordering::SeqCst);
    }
}

impl Worker {
    /// A worker generating with `engine`: loads the tokenizer and chat template and connects the
    /// tools of `config`; registers its metrics in `registry`.
    pub async fn build(
        config: RolloutConfig,
        engine: WorkerEngine,
        token: Option<Token>,
        registry: &Registry,
    ) -> Result<Self, WorkerError> {
        descriptors::check(&config, descriptors::raise_limit().map_err(WorkerError::Rlimit)?)?;
        let metrics = RolloutMetrics::new(registry);
        let ctx = Context::build(&config.context, &config.env, engine.engine, &config.model, None).await?;
        config.weight_sources.validate()?;
        let downloader = Downloader::new(config.weight_download.clone(), token.as_ref())?;
        let weights = engine
            .weights
            .map(|target| WeightLoader::new(target, 0, downloader, metrics.weight_loads.clone()));
        Ok(Worker {
            env: env::build(&config.env),
            ctx,
            weights,
            metrics,
            groups: Arc::new(Semaphore::new(config.max_concurrent_groups.max(1))),
            in_flight: Arc::default(),
            token,
            config,
        })
    }
}

impl Worker {
    /// Reserves the trajectories of `request` (in `env`) within `max_trajectories`: a 422 for a
    /// request larger than the limit, a 429 while others hold too much of it.
    fn reserve(&self, request: &RolloutRequest, env: &EnvConfig) -> Result<Reservation, ApiError> {
        let limit = self.config.max_trajectories;
        let per_episode = env.trajectories_per_episode();
        let trajectories = request.prompts.len().saturating_mul(request.n).saturating_mul(per_episode);
        if trajectories > limit {
            let message = format!(
                "{} prompts x n {} x {per_episode} per episode = {trajectories} trajectories; a worker takes at most {limit} (max_trajectories)",
                request.prompts.len(),
                request.n
            );
            return Err(ApiError::invalid("n", message));
        }
        let reserved = self.in_flight.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
            held.checked_add(trajectories).filter(|&total| total <= limit)
        });
        match reserved {
            Ok(_) => Ok(Reservation { in_flight: self.in_flight.clone(), trajectories }),
            Err(held) => {
                let message = format!(
                    "{held} trajectories in flight; {trajectories} more would pass max_trajectories ({limit})"
                );
                Err(ApiError { status: StatusCode::TOO_MANY_REQUESTS, field: "prompts".into(), message })
            }
        }
    }

    /// The environment of `request`: its own settings, of the kind this worker runs (its tools
    /// are the worker's), or the worker's default.
    fn environment(&self, request: &RolloutRequest) -> Result<Arc<dyn Environment>, ApiError> {
        let Some(config) = &request.env else { return Ok(self.env.clone()) };
        let env = env::build(config);
        if env.name() != self.env.name() {
            return Err(ApiError::invalid(
                "env.kind",
                format!(
                    "this worker runs the {} environment; a request may change its settings, not its kind ({})",
                    self.env.name(),
                    env.name()
                ),
            ));
        }
        if config.agent_functions() != self.config.env.agent_functions() {
            return Err(ApiError::invalid(
                "env.functions",
                "a request may not change this worker's functions: their back ends are connected when it starts",
            ));
        }
        if config.runs_python() && self.ctx.python.is_none() {
            return Err(ApiError::invalid(
                "env.tools",
                "this worker's environment runs no Python, so it has no sandbox; a request may not add the python tool",
            ));
        }
        Ok(env)
    }
}

/// A `/rollout` body, checked.
fn parse_request(body: serde_json::Value) -> Result<RolloutRequest, ApiError> {
    let request: RolloutRequest = http::from_json(body)?;
    request.validate().map_err(ApiError::from)?;
    Ok(request)
}

/// The complete router: `/rollout`, `/weights`, `/healthz`, `/readyz`, `/metrics`.
pub fn router(worker: Arc<Worker>, registry: Registry) -> Router {
    let ready = Readiness::default();
    ready.set(true);
    let token = worker.token.clone();
    Router::new()
        .route("/rollout", post(rollout))
        .route("/weights", post(weights))
        .route_layer(axum::middleware::from_fn(http::panics::contain))
        .route_layer(axum::middleware::from_fn_with_state(token, kart_http::token::require))
        .with_state(worker)
        .merge(http::ops_routes(registry, ready))
}

/// Runs a worker generating with `engine` until SIGINT/SIGTERM.
pub async fn run(config: RolloutConfig, engine: WorkerEngine) -> Result<(), WorkerError> {
    let registry = Registry::new();
    let addr = http::bind_address(&config.host, config.port);
    let token = Token::from_env()?;
    http::token::log_state("rollout worker", token.as_ref());
    let worker = Worker::build(config, engine, token, &registry).await?;
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
    let env = match worker.environment(&request) {
        Ok(env) => env,
        Err(e) => return e.into_response(),
    };
    let reservation = match worker.reserve(&request, request.env.as_ref().unwrap_or(&worker.config.env)) {
        Ok(r) => r,
        Err(busy) if busy.status == StatusCode::TOO_MANY_REQUESTS => {
            return ([(header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())], busy).into_response();
        }
        Err(e) => return e.into_response(),
    };
    if let Some(source) = &request.weights
        && let Err(e) = worker.config.weight_sources.admits(source)
    {
        return ApiError::from(e.within("weights")).into_response();
    }
    if let (Some(loader), Some(source)) = (&worker.weights, &request.weights)
        && let Err(e) = loader.ensure(source).await
    {
        return load_error(e, "weights.").into_response();
    }
    let (lines, mut receiver) = mpsc::channel::<String>(16);
    tokio::spawn(async move {
        produce(worker, env, request, lines).await;
        drop(reservation);
    });
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
                Ok(group) => RolloutLine::Group(group),
                Err(e) => RolloutLine::Failed { prompt_id: task.id, error: e.to_string() },
            };
            let line = serde_json::to_string(&line).expect("rollout lines serialise");
            let _ = lines.send(line + "\n").await;
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

async fn weights(State(worker): State<Arc<Worker>>, body: Body) -> Response {
    match load_weights(&worker, body).await {
        Ok(version) => Json(json!({"version": version})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn load_weights(worker: &Worker, body: Body) -> Result<i64, ApiError> {
    let body = http::read_json(body, worker.config.max_body_bytes).await?;
    let source: WeightSource = http::from_json(body)?;
    source.validate().map_err(ApiError::from)?;
    worker.config.weight_sources.admits(&source).map_err(ApiError::from)?;
    let loader = worker.weights.as_ref().ok_or_else(|| ApiError {
        status: StatusCode::CONFLICT,
        field: "engine".into(),
        message: format!(
            "the {} engine loads weights itself; only the embedded engine loads through the worker",
            worker.ctx.engine.name()
        ),
    })?;
    loader.load(&source).await.map_err(|e| load_error(e, ""))?;
    Ok(source.version)
}

/// The answer to a failed load, naming the field of the weight source (after `prefix`).
fn load_error(error: LoadError, prefix: &str) -> ApiError {
    let (status, field) = match &error {
        LoadError::Invalid(e) => (StatusCode::UNPROCESSABLE_ENTITY, e.field.as_str()),
        LoadError::Fetch { .. } => (StatusCode::BAD_GATEWAY, "url"),
        LoadError::Read { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "path"),
        LoadError::Engine { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "version"),
    };
    ApiError { status, field: format!("{prefix}{field}"), message: error.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Reply, ScriptedEngine};
    use crate::weights::testing;
    use futures::StreamExt;
    use kart_core::config::retry::RetryPolicy;
    use kart_tokenizer::Tokenizer;
    use serde_json::Value;
    use std::collections::HashSet;
    use std::time::Duration;
    use tower::ServiceExt;

    fn worker(engine: Arc<ScriptedEngine>, max_concurrent_groups: usize) -> (Arc<Worker>, Registry) {
        worker_on(WorkerEngine { engine, weights: None }, |c| c.max_concurrent_groups = max_concurrent_groups)
    }

    /// A worker whose engine loads weights through it (as the embedded engine does), at version 0.
    fn loading_worker() -> (Arc<Worker>, Registry) {
        let engine = testing::engine();
        worker_on(WorkerEngine { engine: engine.clone(), weights: Some(engine) }, |c| {
            c.max_concurrent_groups = 8
        })
    }

    /// A worker on the fixture model whose config `configure` adjusts.
    fn worker_on(
        engine: WorkerEngine,
        configure: impl FnOnce(&mut RolloutConfig),
    ) -> (Arc<Worker>, Registry) {
        let registry = Registry::new();
        let mut config =
            RolloutConfig { model: kart_testing::model("tiny-qwen2"), ..RolloutConfig::default() };
        config.context.retry = RetryPolicy { retries: 0, backoff_ms: 1 };
        configure(&mut config);
        // Nothing in this config waits on I/O while building.
        let worker = futures::executor::block_on(Worker::build(config, engine, None, &registry)).unwrap();
        (Arc::new(worker), registry)
    }

    fn answering() -> Arc<ScriptedEngine> {
        Arc::new(answering_engine())
    }

    fn answering_engine() -> ScriptedEngine {
        ScriptedEngine::new(Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap(), |context, _| {
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
            let t: kart_core::agent::trajectory::Trajectory =
                serde_json::from_value(trajectories[0].clone()).unwrap();
            assert!(t.loss_mask().contains(&1));
        }
        let text = kart_http::metrics::encode(&registry);
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
            (json!({"prompt": []}), "prompt"),
            (json!({"prompts": prompts(1), "weights": {"version": 1}}), "weights.url"),
            (json!({"prompts": prompts(1), "weights": {"version": -2, "path": "/w"}}), "weights.version"),
            (
                json!({"prompts": prompts(1), "policy_version": 2, "weights": {"version": 3, "path": "/w"}}),
                "weights.version",
            ),
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

    /// The status and the error's field of a `/rollout` answer.
    async fn refusal(app: &Router, body: Value) -> (StatusCode, Value) {
        let response = post(app.clone(), "/rollout", body).await;
        let status = response.status();
        let v: Value =
            serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap())
                .unwrap();
        (status, v["error"]["field"].clone())
    }

    #[tokio::test]
    async fn type_errors_name_the_field_by_its_path() {
        let (worker, registry) = worker(answering(), 8);
        let app = router(worker, registry);
        let message = json!({"id": "a", "messages": [{"role": "user", "content": null}], "ground_truth": []});
        for (body, field) in [
            (json!({"prompts": prompts(1), "n": -1}), "n"),
            (json!({"prompts": prompts(1), "n": "2"}), "n"),
            (json!({"prompts": "x"}), "prompts"),
            (json!({"prompts": [message]}), "prompts[0].messages[0].content"),
        ] {
            assert_eq!(
                refusal(&app, body.clone()).await,
                (StatusCode::UNPROCESSABLE_ENTITY, json!(field)),
                "{body}"
            );
        }
    }

    #[tokio::test]
    async fn a_request_may_not_change_the_environment_kind() {
        let (worker, registry) = worker(answering(), 8);
        let app = router(worker, registry);
        let tir = json!({"prompts": prompts(1), "env": {"kind": "tir"}});
        assert_eq!(refusal(&app, tir).await, (StatusCode::UNPROCESSABLE_ENTITY, json!("env.kind")));
        let bad = json!({"prompts": prompts(1), "env": {"kind": "tools", "max_turns": 0}});
        assert_eq!(refusal(&app, bad).await, (StatusCode::UNPROCESSABLE_ENTITY, json!("env.max_turns")));
        let settings = json!({"prompts": prompts(1), "env": {"kind": "search-r1", "max_turns": 1}});
        let response = post(app, "/rollout", settings).await;
        assert_eq!(response.status(), StatusCode::OK, "the same kind with other settings");
    }

    #[tokio::test]
    async fn a_workflow_worker_returns_every_role_in_the_group_and_counts_them_all() {
        let role = |name: &str, extra: Value| {
            let mut r = json!({"name": name, "env": {"kind": "tools", "functions": []}});
            r.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            r
        };
        let workflow: EnvConfig = serde_json::from_value(json!({"kind": "workflow", "roles": [
            role("solver", json!({"count": 2})),
            role("judge", json!({"input": "{question}\n{solver}", "select": {"from": "solver"}})),
        ]}))
        .unwrap();
        let engine = Arc::new(answering_engine());
        let (worker, registry) = worker_on(WorkerEngine { engine, weights: None }, |c| {
            c.env = workflow;
            c.max_trajectories = 5;
        });
        let app = router(worker, registry);
        let response = post(app.clone(), "/rollout", json!({"prompts": prompts(1)})).await;
        let body = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        let group: Value = serde_json::from_slice(&body).unwrap();
        let roles: Vec<(&str, f64)> = group["trajectories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["stats"]["role"].as_str().unwrap(), t["reward"].as_f64().unwrap()))
            .collect();
        assert_eq!(roles, [("solver", 1.0), ("solver", 1.0), ("judge", 0.0)], "{group}");
        let two = json!({"prompts": prompts(1), "n": 2});
        assert_eq!(refusal(&app, two).await, (StatusCode::UNPROCESSABLE_ENTITY, json!("n")), "2 x 3 > 5");
    }

    #[tokio::test]
    async fn rollouts_and_weights_need_the_token_and_weights_an_admitted_source() {
        let token = Token::new("pool-token", "test").unwrap();
        let mut config =
            RolloutConfig { model: kart_testing::model("tiny-qwen2"), ..RolloutConfig::default() };
        config.weight_sources.url_prefixes = vec!["http://trainer:8002/weights/".into()];
        let (engine, registry) = (Arc::new(answering_engine()), Registry::new());
        let target: Arc<dyn LoadWeights> = engine.clone();
        let engine = WorkerEngine { engine, weights: Some(target) };
        let worker = Worker::build(config, engine, Some(token.clone()), &registry).await.unwrap();
        let app = router(Arc::new(worker), registry);
        let send = |uri: &'static str, body: serde_json::Value, bearer: bool| {
            let mut request = axum::http::Request::post(uri).header(header::CONTENT_TYPE, "application/json");
            if bearer {
                request = request.header(header::AUTHORIZATION, token.authorization());
            }
            app.clone().oneshot(request.body(Body::from(body.to_string())).unwrap())
        };
        let evil = json!({"version": 999999, "url": "http://attacker/evil.safetensors"});
        for (uri, body) in [("/weights", evil.clone()), ("/rollout", json!({"prompts": prompts(1)}))] {
            let response = send(uri, body, false).await.unwrap();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{uri}");
            assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        }
        // With the token, a source outside weight_sources is still refused, naming the field.
        let response = send("/weights", evil.clone(), true).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"]["field"], "url");
        let rollout = json!({"prompts": prompts(1), "weights": evil});
        let response = send("/rollout", rollout, true).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let response = send("/rollout", json!({"prompts": prompts(1)}), true).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let probe = axum::http::Request::get("/readyz").body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(probe).await.unwrap().status(), StatusCode::OK, "probes stay open");
    }

    #[tokio::test]
    async fn a_request_may_not_add_python_to_a_worker_without_a_sandbox() {
        let calculator = serde_json::from_value(json!({"kind": "tir", "tools": ["calculator"]})).unwrap();
        let engine = Arc::new(answering_engine());
        let (worker, registry) = worker_on(WorkerEngine { engine, weights: None }, |c| c.env = calculator);
        let app = router(worker, registry);
        let python =
            json!({"prompts": prompts(1), "env": {"kind": "tir", "tools": ["python", "calculator"]}});
        assert_eq!(refusal(&app, python).await, (StatusCode::UNPROCESSABLE_ENTITY, json!("env.tools")));
        let settings =
            json!({"prompts": prompts(1), "env": {"kind": "tir", "tools": ["calculator"], "max_turns": 1}});
        assert_eq!(post(app, "/rollout", settings).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_request_may_not_change_the_functions_of_a_tools_worker() {
        let calculator: EnvConfig =
            serde_json::from_value(json!({"kind": "tools", "functions": [{"builtin": "calculator"}]}))
                .unwrap();
        let engine = Arc::new(answering_engine());
        let (worker, registry) = worker_on(WorkerEngine { engine, weights: None }, |c| c.env = calculator);
        let app = router(worker, registry);
        let other =
            json!({"prompts": prompts(1), "env": {"kind": "tools", "functions": [{"builtin": "python"}]}});
        assert_eq!(refusal(&app, other).await, (StatusCode::UNPROCESSABLE_ENTITY, json!("env.functions")));
        let role = |functions| json!({"name": "solver", "env": {"kind": "tools", "functions": functions}});
        let workflow = json!({"prompts": prompts(1),
            "env": {"kind": "workflow", "roles": [role(json!([{"builtin": "calculator"}]))]}});
        assert_eq!(refusal(&app, workflow).await, (StatusCode::UNPROCESSABLE_ENTITY, json!("env.kind")));
        let settings = json!({"prompts": prompts(1),
            "env": {"kind": "tools", "functions": [{"builtin": "calculator"}], "max_turns": 1}});
        assert_eq!(post(app, "/rollout", settings).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn trajectories_in_flight_stay_within_max_trajectories() {
        let engine = Arc::new(answering_engine().with_latency(Duration::from_millis(50)));
        let (worker, registry) =
            worker_on(WorkerEngine { engine, weights: None }, |c| c.max_trajectories = 5);
        let app = router(worker.clone(), registry);
        assert_eq!(
            refusal(&app, json!({"prompts": prompts(3), "n": 2})).await,
            (StatusCode::UNPROCESSABLE_ENTITY, json!("n")),
            "6 trajectories can never fit"
        );
        let holding = post(app.clone(), "/rollout", json!({"prompts": prompts(4), "n": 1})).await;
        assert_eq!(holding.status(), StatusCode::OK);
        let busy = post(app.clone(), "/rollout", json!({"prompts": prompts(2), "n": 1})).await;
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        assert_eq!(lines(holding).await.len(), 4);
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while worker.in_flight.load(Ordering::SeqCst) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the finished request still holds its trajectories"
            );
            tokio::task::yield_now().await;
        }
        let again = post(app, "/rollout", json!({"prompts": prompts(2), "n": 1})).await;
        assert_eq!(again.status(), StatusCode::OK, "room again once the first request finished");
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
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while worker.metrics.in_flight.get() > 0 || Arc::strong_count(&worker) > 1 {
            assert!(std::time::Instant::now() < deadline, "work still running after the client left");
            tokio::task::yield_now().await;
        }
        assert!(engine.calls() < 50, "only the groups started before the disconnect ran: {}", engine.calls());
    }

    /// The NDJSON lines of a `/rollout` answer.
    async fn lines(response: Response) -> Vec<Value> {
        let body = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        std::str::from_utf8(&body).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The policy versions that sampled the tokens of a group's trajectories.
    fn versions(group: &Value) -> HashSet<i64> {
        let trajectories = group["trajectories"].as_array().unwrap_or_else(|| panic!("{group}"));
        trajectories
            .iter()
            .flat_map(|t| {
                let t: kart_core::agent::trajectory::Trajectory = serde_json::from_value(t.clone()).unwrap();
                t.versions().to_vec()
            })
            .filter(|&v| v != kart_core::agent::trajectory::NO_VERSION)
            .collect()
    }

    fn short_rollout(weights: Value) -> Value {
        let env = json!({"kind": "search-r1", "max_turns": 1, "max_response_length": 4});
        json!({"prompts": prompts(2), "n": 2, "env": env, "weights": weights})
    }

    #[tokio::test]
    async fn requests_naming_newer_weights_load_them_once_before_generating() {
        let (url, fetches) = testing::serve(StatusCode::OK).await;
        let (worker, registry) = loading_worker();
        let app = router(worker, registry.clone());
        let weights = json!({"version": 2, "url": format!("{url}/weights/2")});
        let responses = futures::future::join_all(
            (0..3).map(|_| post(app.clone(), "/rollout", short_rollout(weights.clone()))),
        )
        .await;
        for response in responses {
            assert_eq!(response.status(), StatusCode::OK);
            for group in lines(response).await {
                assert_eq!(versions(&group), HashSet::from([2]), "{group}");
            }
        }
        assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1, "one load for three requests");
        // A late request for an older version runs on the newer weights.
        let old = json!({"version": 1, "url": format!("{url}/weights/1")});
        let response = post(app, "/rollout", short_rollout(old)).await;
        for group in lines(response).await {
            assert_eq!(versions(&group), HashSet::from([2]), "{group}");
        }
        assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1);
        let text = kart_http::metrics::encode(&registry);
        assert!(
            text.contains("kart_rollout_weight_loads_total{outcome=\"ok\",trigger=\"pull\"} 1"),
            "{text}"
        );
        assert!(text.contains("\nkart_rollout_policy_version 2\n"), "{text}");
    }

    #[tokio::test]
    async fn a_failed_pull_fails_the_request_naming_the_field() {
        let (url, _) = testing::serve(StatusCode::NOT_FOUND).await;
        let (worker, registry) = loading_worker();
        let weights = json!({"version": 1, "url": format!("{url}/weights/1")});
        let response = post(router(worker, registry.clone()), "/rollout", short_rollout(weights)).await;
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        let v: Value =
            serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap())
                .unwrap();
        assert_eq!(v["error"]["field"], "weights.url", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("404"), "{v}");
        let text = kart_http::metrics::encode(&registry);
        assert!(!text.contains("kart_rollout_trajectories_total{"), "nothing was generated: {text}");
        assert!(
            text.contains("kart_rollout_weight_loads_total{outcome=\"error\",trigger=\"pull\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_request_for_the_held_version_completes_while_another_download_hangs() {
        let (good, _) = testing::serve(StatusCode::OK).await;
        let (silent, hanging) = testing::serve_silence().await;
        let (worker, registry) = loading_worker();
        let app = router(worker, registry);
        let held = json!({"version": 1, "url": format!("{good}/weights/1")});
        assert_eq!(lines(post(app.clone(), "/rollout", short_rollout(held.clone())).await).await.len(), 2);
        let newer = json!({"version": 2, "url": format!("{silent}/weights/2")});
        let stuck = tokio::spawn(post(app.clone(), "/rollout", short_rollout(newer)));
        testing::until_count(&hanging, 1).await;
        let response = post(app, "/rollout", short_rollout(held)).await;
        assert_eq!(response.status(), StatusCode::OK);
        for group in lines(response).await {
            assert_eq!(versions(&group), HashSet::from([1]), "{group}");
        }
        assert!(!stuck.is_finished(), "the request for version 2 still waits for its download");
    }

    #[test]
    fn weight_download_limits_out_of_range_stop_the_worker() {
        let engine = testing::engine();
        let mut config =
            RolloutConfig { model: kart_testing::model("tiny-qwen2"), ..RolloutConfig::default() };
        config.weight_download.max_bytes = 0;
        let weights = WorkerEngine { engine: engine.clone(), weights: Some(engine) };
        let built = futures::executor::block_on(Worker::build(config, weights, None, &Registry::new()));
        let error = built.err().unwrap().to_string();
        assert!(error.starts_with("weight_download.max_bytes = 0"), "{error}");
    }

    #[tokio::test]
    async fn engines_that_load_weights_themselves_ignore_the_field() {
        let (worker, registry) = worker(answering(), 8);
        // Nothing listens there: a fetch would fail the request.
        let weights = json!({"version": 7, "url": "http://127.0.0.1:9/weights/7"});
        let response = post(router(worker, registry), "/rollout", short_rollout(weights)).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(lines(response).await.len(), 2);
    }
}
