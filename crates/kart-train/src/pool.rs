//! Where the trainer's trajectories come from: a RolloutPool behind one trait.
//!
//! - [`InProcessPool`]: the rollout code in this process (the embedded engine, a local or HTTP
//!   retriever), as `kart local` and single-machine runs use it;
//! - [`RemotePool`]: `kart rollout serve` workers over their NDJSON `/rollout` API, one request per
//!   task spread over the URLs (so a Service balances a step over all its workers); groups a
//!   broken connection lost are asked for again on the next URL. Each request names the version's
//!   weights, which a worker that is behind loads first.

use super::weights::PullFrom;
use futures::StreamExt;
use futures::stream::BoxStream;
use kart_core::wire::{Group, RolloutLine, RolloutRequest};
use kart_rollout::env::{self, Context};
use kart_rollout::group::run_group;
use kart_rollout::metrics::RolloutMetrics;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

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
    attempts: usize,
}

impl RemotePool {
    /// A pool over worker base URLs whose requests name the weights at `weights`; one request may
    /// take `timeout` in all.
    pub fn new(urls: Vec<String>, weights: Option<PullFrom>, timeout: Duration) -> Self {
        let client = reqwest::Client::builder().timeout(timeout).build().expect("an HTTP client");
        RemotePool {
            urls: urls.into_iter().map(|u| u.trim_end_matches('/').to_string()).collect(),
            weights,
            client,
            attempts: 3,
        }
    }
}

impl RolloutPool for RemotePool {
    fn rollout(&self, request: RolloutRequest) -> BoxStream<'static, Result<Group, PoolError>> {
        let (tx, rx) = mpsc::channel(request.prompts.len().max(1));
        let (urls, client, attempts) = (self.urls.clone(), self.client.clone(), self.attempts);
        let weights = self.weights.as_ref().zip(request.policy_version).map(|(from, v)| from.source(v));
        let request = RolloutRequest { weights, ..request };
        tokio::spawn(async move {
            let mut jobs = tokio::task::JoinSet::new();
            for (i, task) in request.prompts.iter().enumerate() {
                let request = RolloutRequest { prompts: vec![task.clone()], ..request.clone() };
                let (urls, client, tx) = (urls.clone(), client.clone(), tx.clone());
                jobs.spawn(async move { shard(&client, &urls, i, request, attempts, &tx).await });
            }
            while jobs.join_next().await.is_some() {}
        });
        receiver_stream(rx)
    }
}

/// Rolls out one shard of tasks starting at URL `first`, moving to the next URL for the tasks a
/// failed connection did not deliver.
async fn shard(
    client: &reqwest::Client,
    urls: &[String],
    first: usize,
    mut request: RolloutRequest,
    attempts: usize,
    tx: &mpsc::Sender<Result<Group, PoolError>>,
) {
    let mut last_error = String::from("no rollout URL configured");
    for attempt in 0..attempts {
        if request.prompts.is_empty() || urls.is_empty() {
            break;
        }
        let url = &urls[(first + attempt) % urls.len()];
        let mut delivered = HashSet::new();
        match stream_groups(client, url, &request, tx, &mut delivered).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(%url, attempt, error = %e, "rollout request failed; retrying the undelivered groups");
                last_error = format!("{url}: {e}");
            }
        }
        request.prompts.retain(|t| !delivered.contains(&t.id));
        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
    }
    for task in request.prompts {
        let _ = tx.send(Err(PoolError { prompt_id: task.id, reason: last_error.clone() })).await;
    }
}

/// One `/rollout` call, forwarding each NDJSON line as it arrives.
async fn stream_groups(
    client: &reqwest::Client,
    url: &str,
    request: &RolloutRequest,
    tx: &mpsc::Sender<Result<Group, PoolError>>,
    delivered: &mut HashSet<String>,
) -> Result<(), String> {
    let response =
        client.post(format!("{url}/rollout")).json(request).send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        let status = response.status();
        return Err(format!("answered {status}: {}", response.text().await.unwrap_or_default()));
    }
    let mut bytes = response.bytes_stream();
    let mut buffer = Vec::new();
    while let Some(chunk) = bytes.next().await {
        buffer.extend_from_slice(&chunk.map_err(|e| e.to_string())?);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let line: RolloutLine =
                serde_json::from_slice(&line).map_err(|e| format!("bad /rollout line: {e}"))?;
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
        return Err(format!(
            "the stream ended after {} of {} groups",
            delivered.len(),
            request.prompts.len()
        ));
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

    #[tokio::test]
    async fn each_task_is_a_request_naming_the_weights_of_its_version() {
        let (url, bodies) = recording_worker().await;
        let prompts: Vec<Task> = (0..3)
            .map(|i| Task {
                id: format!("q{i}"),
                messages: None,
                prompt: Some("Capital of Peru?".into()),
                ground_truth: vec!["Lima".into()],
                data_source: "nq".into(),
            })
            .collect();
        let request = RolloutRequest {
            prompts,
            n: 2,
            sampling: SamplingParams::default(),
            policy_version: Some(4),
            env: Some(EnvConfig::default()),
            weights: None,
        };
        for trainer in [Some(PullFrom::new("http://trainer:8002/".into())), None] {
            let pool = RemotePool::new(vec![url.clone()], trainer.clone(), Duration::from_secs(10));
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
}
