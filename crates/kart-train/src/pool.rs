//! Where the trainer's trajectories come from: a RolloutPool behind one trait.
//!
//! - [`InProcessPool`]: the rollout code in this process (the embedded engine, a local or HTTP
//!   retriever), as `kart local` and single-machine runs use it;
//! - [`RemotePool`]: `kart rollout serve` workers over their NDJSON `/rollout` API, one request per
//!   task spread over the URLs (so a Service balances a step over all its workers). The groups a
//!   failed request did not deliver (a worker down or restarting, a connection lost, an answer
//!   5xx, 408 or 429) are asked for again, with backoff, from the next URL whose `/readyz` answers,
//!   until `rollout.retry_deadline_secs` has passed. Each request names the version's weights,
//!   which a worker that is behind (a restarted one) loads first.

use super::weights::PullFrom;
use futures::StreamExt;
use futures::stream::BoxStream;
use kart_core::config::retry::Backoff;
use kart_core::wire::{Group, RolloutLine, RolloutRequest};
use kart_http::token::Token;
use kart_rollout::env::{self, Context};
use kart_rollout::group::run_group;
use kart_rollout::metrics::RolloutMetrics;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The first wait before the groups of a failed request are sent again; doubled after each
/// failure, up to [`RETRY_BACKOFF_MAX`].
const RETRY_BACKOFF_FIRST: Duration = Duration::from_millis(200);
/// The longest wait between two tries.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long one `/readyz` probe may take.
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A group that could not be rolled out.
#[derive(Debug, Clone, thiserror::Error)]
#[error("rollout of prompt `{prompt_id}`: {reason}")]
pub struct PoolError {
    pub prompt_id: String,
    pub reason: String,
}

/// A source of trajectory groups.
pub trait RolloutPool: Send + Sync {
    /// Rolls out every prompt of `request`; each group (or its failure) arrives as it finishes.
    fn rollout(&self, request: RolloutRequest) -> BoxStream<'static, Result<Group, PoolError>>;
}

/// The rollout code in this process.
pub struct InProcessPool {
    ctx: Arc<Context>,
    metrics: Option<RolloutMetrics>,
}

impl InProcessPool {
    /// A pool running environments against `ctx`, recording rollout metrics when given.
    pub fn new(ctx: Context, metrics: Option<RolloutMetrics>) -> Self {
        InProcessPool { ctx: Arc::new(ctx), metrics }
    }
}

impl RolloutPool for InProcessPool {
    fn rollout(&self, request: RolloutRequest) -> BoxStream<'static, Result<Group, PoolError>> {
        let (tx, rx) = mpsc::channel(request.prompts.len().max(1));
        let env = env::build(&request.env.unwrap_or_default());
        for task in request.prompts {
            let (ctx, env, tx, metrics, sampling) =
                (self.ctx.clone(), env.clone(), tx.clone(), self.metrics.clone(), request.sampling.clone());
            let n = request.n;
            tokio::spawn(async move {
                let result = run_group(&ctx, env.as_ref(), &task, n, &sampling, metrics.as_ref())
                    .await
                    .map_err(|e| PoolError { prompt_id: task.id.clone(), reason: e.to_string() });
                let _ = tx.send(result).await;
            });
        }
        receiver_stream(rx)
    }
}

/// `kart rollout serve` workers.
pub struct RemotePool {
    urls: Vec<String>,
    /// Where the trainer serves `/weights/{version}`, named in every request; `None` when the
    /// engines load weights themselves.
    weights: Option<PullFrom>,
    client: reqwest::Client,
    retry_deadline: Duration,
}

impl RemotePool {
    /// A pool over worker base URLs whose requests name the weights at `weights` and bear
    /// `token`; one request may take `timeout` in all, and the groups of a failed one are retried
    /// for `retry_deadline`.
    pub fn new(
        urls: Vec<String>,
        weights: Option<PullFrom>,
        timeout: Duration,
        retry_deadline: Duration,
        token: Option<&Token>,
    ) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .default_headers(Token::client_headers(token))
            .build()
            .expect("an HTTP client");
        RemotePool {
            urls: urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect(),
            weights,
            client,
            retry_deadline,
        }
    }
}

impl RolloutPool for RemotePool {
    fn rollout(&self, request: RolloutRequest) -> BoxStream<'static, Result<Group, PoolError>> {
        let (tx, rx) = mpsc::channel(request.prompts.len().max(1));
        let (urls, client, deadline) = (self.urls.clone(), self.client.clone(), self.retry_deadline);
        let weights = self.weights.as_ref().zip(request.policy_version).map(|(from, v)| from.source(v));
        let request = RolloutRequest { weights, ..request };
        tokio::spawn(async move {
            let mut jobs = tokio::task::JoinSet::new();
            for (i, task) in request.prompts.iter().enumerate() {
                let request = RolloutRequest { prompts: vec![task.clone()], ..request.clone() };
                let (urls, client, tx) = (urls.clone(), client.clone(), tx.clone());
                jobs.spawn(async move { shard(&client, &urls, i, request, deadline, &tx).await });
            }
            while jobs.join_next().await.is_some() {}
        });
        receiver_stream(rx)
    }
}

/// Rolls out one shard of tasks starting at URL `first`; after a transient failure, sends the
/// tasks it did not deliver again to the next ready URL until `retry_deadline` after the first
/// failure, then reports them failed.
async fn shard(
    client: &reqwest::Client,
    urls: &[String],
    first: usize,
    mut request: RolloutRequest,
    retry_deadline: Duration,
    tx: &mpsc::Sender<Result<Group, PoolError>>,
) {
    let Some(mut url) = (!urls.is_empty()).then(|| first % urls.len()) else {
        return fail(request, "no rollout URL configured", tx).await;
    };
    let mut retry: Option<(Instant, Backoff)> = None;
    loop {
        let mut delivered = HashSet::new();
        let Err(failure) = stream_groups(client, &urls[url], &request, tx, &mut delivered).await else {
            return;
        };
        request.prompts.retain(|t| !delivered.contains(&t.id));
        let reason = format!("{}: {}", urls[url], failure.reason);
        if request.prompts.is_empty() {
            return;
        }
        if !failure.transient {
            return fail(request, &reason, tx).await;
        }
        let (deadline, backoff) = retry.get_or_insert_with(|| {
            (Instant::now() + retry_deadline, Backoff::new(RETRY_BACKOFF_FIRST, RETRY_BACKOFF_MAX))
        });
        tracing::warn!(
            url = %urls[url],
            error = %failure.reason,
            groups = request.prompts.len(),
            "rollout request failed; retrying the undelivered groups once a worker is ready"
        );
        match ready_worker(client, urls, url + 1, backoff, *deadline).await {
            Some(next) => url = next,
            None => {
                let secs = retry_deadline.as_secs_f64();
                let reason = format!("{reason} (still failing after rollout.retry_deadline_secs = {secs})");
                return fail(request, &reason, tx).await;
            }
        }
    }
}

/// Reports every task of `request` failed for `reason`.
async fn fail(request: RolloutRequest, reason: &str, tx: &mpsc::Sender<Result<Group, PoolError>>) {
    for task in request.prompts {
        let _ = tx.send(Err(PoolError { prompt_id: task.id, reason: reason.to_owned() })).await;
    }
}

/// After each wait of `backoff` (the last one cut short at `deadline`), probes the `/readyz` of
/// every URL, starting at `from`: the index of the first that is ready, `None` when none was by
/// `deadline`.
async fn ready_worker(
    client: &reqwest::Client,
    urls: &[String],
    from: usize,
    backoff: &mut Backoff,
    deadline: Instant,
) -> Option<usize> {
    loop {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
        tokio::time::sleep(backoff.next().expect("backoff never ends").min(left)).await;
        for i in (0..urls.len()).map(|k| (from + k) % urls.len()) {
            let probe = client.get(format!("{}/readyz", urls[i])).timeout(READY_PROBE_TIMEOUT).send();
            if probe.await.is_ok_and(|r| r.status().is_success()) {
                return Some(i);
            }
        }
    }
}

/// A `/rollout` call that did not deliver every group.
struct Failure {
    reason: String,
    /// Whether the same request may succeed later (the worker was unreachable, lost the
    /// connection, or answered 5xx, 408 or 429).
    transient: bool,
}

impl Failure {
    fn transient(reason: String) -> Self {
        Failure { reason, transient: true }
    }

    /// A failed HTTP exchange, with the causes reqwest's message leaves out (refused, reset, ...);
    /// transient unless the request could not even be built.
    fn http(e: reqwest::Error) -> Self {
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        Failure { reason, transient: !e.is_builder() }
    }
}

/// One `/rollout` call, forwarding each NDJSON line as it arrives.
async fn stream_groups(
    client: &reqwest::Client,
    url: &str,
    request: &RolloutRequest,
    tx: &mpsc::Sender<Result<Group, PoolError>>,
    delivered: &mut HashSet<String>,
) -> Result<(), Failure> {
    let response = client.post(format!("{url}/rollout")).json(request).send().await.map_err(Failure::http)?;
    if !response.status().is_success() {
        let status = response.status();
        let transient = status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT;
        let reason = format!("answered {status}: {}", response.text().await.unwrap_or_default());
        return Err(Failure { reason, transient });
    }
    let mut bytes = response.bytes_stream();
    let mut buffer = Vec::new();
    while let Some(chunk) = bytes.next().await {
        buffer.extend_from_slice(&chunk.map_err(Failure::http)?);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let line: RolloutLine = serde_json::from_slice(&line)
                .map_err(|e| Failure { reason: format!("bad /rollout line: {e}"), transient: false })?;
            delivered.insert(line.prompt_id().to_owned());
            let item = match line {
                RolloutLine::Group(group) => Ok(group),
                RolloutLine::Failed { prompt_id, error } => Err(PoolError { prompt_id, reason: error }),
            };
            if tx.send(item).await.is_err() {
                return Ok(());
            }
        }
    }
    if delivered.len() < request.prompts.len() {
        return Err(Failure::transient(format!(
            "the stream ended after {} of {} groups",
            delivered.len(),
            request.prompts.len()
        )));
    }
    Ok(())
}

fn receiver_stream<T: Send + 'static>(mut rx: mpsc::Receiver<T>) -> BoxStream<'static, T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kart_core::config::env::EnvConfig;
    use kart_core::generation::SamplingParams;
    use kart_core::wire::Task;
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A `/rollout` server answering every prompt with an error line; returns its URL and the
    /// request bodies it received.
    async fn recording_worker() -> (String, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
        let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = bodies.clone();
        let answer = move |axum::Json(body): axum::Json<serde_json::Value>| {
            let id = body["prompts"][0]["id"].as_str().unwrap_or_default().to_string();
            seen.lock().unwrap().push(body);
            async move { format!("{}\n", json!({"prompt_id": id, "error": "scripted"})) }
        };
        let app = axum::Router::new().route("/rollout", axum::routing::post(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, bodies)
    }

    /// A request for `prompts` tasks of `n` 2 at version 4.
    fn request(prompts: usize) -> RolloutRequest {
        let prompts: Vec<Task> = (0..prompts)
            .map(|i| Task {
                id: format!("q{i}"),
                messages: None,
                prompt: Some("Capital of Peru?".into()),
                ground_truth: vec!["Lima".into()],
                data_source: "nq".into(),
                tools: None,
            })
            .collect();
        RolloutRequest {
            prompts,
            n: 2,
            sampling: SamplingParams::default(),
            policy_version: Some(4),
            env: Some(EnvConfig::default()),
            weights: None,
        }
    }

    #[tokio::test]
    async fn each_task_is_a_request_naming_the_weights_of_its_version() {
        let (url, bodies) = recording_worker().await;
        let request = request(3);
        for trainer in [Some(PullFrom::new("http://trainer:8002/".into(), None)), None] {
            let pool = RemotePool::new(
                vec![url.clone()],
                trainer.clone(),
                Duration::from_secs(60),
                Duration::ZERO,
                None,
            );
            let items: Vec<_> = pool.rollout(request.clone()).collect().await;
            assert_eq!(items.len(), 3);
            assert!(items.iter().all(|i| i.as_ref().is_err_and(|e| e.reason == "scripted")), "{items:?}");
            let bodies = std::mem::take(&mut *bodies.lock().unwrap());
            assert_eq!(bodies.len(), 3, "one request per task, for a Service to balance");
            for body in bodies {
                assert_eq!(body["prompts"].as_array().map(Vec::len), Some(1), "{body}");
                let weights = trainer
                    .as_ref()
                    .map(|t| json!({"version": 4, "url": "http://trainer:8002/weights/4", "run": t.run}));
                assert_eq!(body.get("weights"), weights.as_ref(), "{body}");
            }
        }
    }

    /// A worker that is down until `up` is set: `/readyz` and `/rollout` answer 503; once up,
    /// `/rollout` answers every prompt with an empty group. Counts the calls of each.
    #[derive(Clone, Default)]
    struct Restarting {
        up: Arc<AtomicBool>,
        rollouts: Arc<AtomicUsize>,
        probes: Arc<AtomicUsize>,
    }

    impl Restarting {
        async fn serve(&self) -> String {
            let (rollout, readyz) = (self.clone(), self.clone());
            let app = axum::Router::new()
                .route(
                    "/rollout",
                    axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| async move {
                        rollout.rollouts.fetch_add(1, Ordering::SeqCst);
                        if !rollout.up.load(Ordering::SeqCst) {
                            return (axum::http::StatusCode::SERVICE_UNAVAILABLE, String::new());
                        }
                        let id = body["prompts"][0]["id"].as_str().unwrap_or_default().to_string();
                        let group = json!({"prompt_id": id, "trajectories": []});
                        (axum::http::StatusCode::OK, format!("{group}\n"))
                    }),
                )
                .route(
                    "/readyz",
                    axum::routing::get(move || async move {
                        readyz.probes.fetch_add(1, Ordering::SeqCst);
                        match readyz.up.load(Ordering::SeqCst) {
                            true => axum::http::StatusCode::OK,
                            false => axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        }
                    }),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            url
        }
    }

    /// Waits until `count` passes `n`, failing after 300 s.
    async fn until_above(count: &AtomicUsize, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while count.load(Ordering::SeqCst) <= n {
            assert!(Instant::now() < deadline, "count {count:?} did not pass {n} within 300 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_failed_group_is_sent_again_once_its_worker_is_ready() {
        let worker = Restarting::default();
        let url = worker.serve().await;
        let pool = RemotePool::new(vec![url], None, Duration::from_secs(60), Duration::from_secs(60), None);
        let items = tokio::spawn(pool.rollout(request(1)).collect::<Vec<_>>());
        until_above(&worker.probes, 1).await;
        assert_eq!(worker.rollouts.load(Ordering::SeqCst), 1, "nothing is resent before /readyz answers");
        worker.up.store(true, Ordering::SeqCst);
        let items = items.await.unwrap();
        assert!(matches!(&items[..], [Ok(group)] if group.prompt_id == "q0"), "{items:?}");
        assert_eq!(worker.rollouts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn groups_fail_once_the_retry_deadline_passes() {
        // Nothing listens at the port (reserved for this test process): every connection is refused.
        let port = kart_testing::free_port();
        let pool = RemotePool::new(
            vec![format!("http://127.0.0.1:{port}")],
            None,
            Duration::from_secs(60),
            Duration::from_millis(500),
            None,
        );
        let started = Instant::now();
        let items: Vec<_> = pool.rollout(request(2)).collect().await;
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(500), "gave up after {elapsed:?}");
        assert!(elapsed < Duration::from_secs(60), "gave up only after {elapsed:?}");
        assert_eq!(items.len(), 2);
        for item in items {
            let reason = item.unwrap_err().reason;
            assert!(reason.contains("rollout.retry_deadline_secs = 0.5"), "{reason}");
            assert!(reason.to_lowercase().contains("refused"), "{reason}");
        }
    }

    #[tokio::test]
    async fn a_refused_request_fails_at_once() {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let app = axum::Router::new().route(
            "/rollout",
            axum::routing::post(move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (axum::http::StatusCode::UNPROCESSABLE_ENTITY, "n: must be at least 1")
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let pool = RemotePool::new(vec![url], None, Duration::from_secs(60), Duration::from_secs(60), None);
        let items: Vec<_> = pool.rollout(request(1)).collect().await;
        let reason = &items[0].as_ref().unwrap_err().reason;
        assert!(reason.contains("422") && reason.contains("must be at least 1"), "{reason}");
        assert_eq!(requests.load(Ordering::SeqCst), 1);
    }
}
