//! An MLflow run through the tracking server's REST API (`/api/2.0/mlflow/…`, what MLflow's own
//! client calls): the experiment found by name or created, a run created (or, for a resumed
//! training run, the run it started continued: its id is kept in `output_dir`), the parameters
//! and each step's metrics sent with `runs/log-batch`, tags with `runs/set-tag`, and the outcome
//! with `runs/update`.
//!
//! Nothing here waits on the server: what the trainer logs goes into a queue that a task sends in
//! order, a batch at a time. While the server cannot be reached (or answers 5xx or 429), the task
//! keeps the queue and tries again after a growing pause; past `buffer_steps` steps the oldest
//! steps' metrics are dropped. An answer of 4xx is the server refusing that batch, which is
//! dropped and named in a warning. At the end, [`MlflowRun::finish`] waits at most `flush_secs`
//! for the rest and reports what was lost.

use crate::RunStatus;
use kart_core::config::tracking::MlflowConfig;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The file in `output_dir` naming the MLflow run of a training run, so a resumed run continues
/// it.
pub const RUN_FILE: &str = "mlflow-run.json";

/// MLflow's limits on one `runs/log-batch` request.
const MAX_METRICS_PER_BATCH: usize = 1000;
const MAX_PARAMS_PER_BATCH: usize = 100;
/// The longest parameter value MLflow keeps, in characters (longer ones are cut to it).
const MAX_PARAM_VALUE: usize = 6000;
/// The longest name of a metric, parameter or tag.
const MAX_KEY: usize = 250;

/// The pauses between tries while the server cannot be reached.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// What is known of the run on the server, kept in [`RUN_FILE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFile {
    pub tracking_uri: String,
    pub experiment_id: String,
    pub run_id: String,
}

impl RunFile {
    /// The run file of `output_dir`, if it names a run on `tracking_uri`.
    pub fn read(output_dir: &Path, tracking_uri: &str) -> Option<RunFile> {
        let text = std::fs::read_to_string(output_dir.join(RUN_FILE)).ok()?;
        serde_json::from_str::<RunFile>(&text).ok().filter(|f| f.tracking_uri == tracking_uri)
    }
}

/// One thing to send, in the order it was logged.
#[derive(Debug, Clone)]
enum Op {
    Params(Vec<(String, String)>),
    Metrics { step: u64, timestamp_ms: i64, values: Vec<(String, f64)> },
    Tag { key: String, value: String },
    End { status: RunStatus, end_ms: i64 },
}

#[derive(Debug, Default)]
struct Queue {
    ops: VecDeque<Op>,
    /// Metrics ops in `ops`.
    steps: usize,
    /// Ops at the front being sent (never dropped for room).
    in_flight: usize,
    /// Steps whose metrics were dropped to keep the buffer within `buffer_steps`.
    dropped: Vec<u64>,
    /// Steps whose metrics the server refused.
    refused: Vec<u64>,
    /// No more ops come.
    closed: bool,
}

/// What [`MlflowRun::finish`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flushed {
    /// The run's id, once it was created or found.
    pub run_id: Option<String>,
    /// Steps whose metrics never reached the server: dropped from a full buffer, refused, or
    /// still unsent when `flush_secs` ran out.
    pub lost_steps: Vec<u64>,
    /// Whether the run's outcome reached the server.
    pub ended: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    buffer_steps: usize,
    /// The run's id once known.
    run_id: Mutex<Option<String>>,
}

/// A run on an MLflow tracking server, sent to by a background task.
pub struct MlflowRun {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    flush: Duration,
}

/// Where and how the run is created or continued.
struct Target {
    client: Client,
    config: MlflowConfig,
    run_name: String,
    output_dir: PathBuf,
    /// The run to continue (a resumed training run's).
    resume: Option<RunFile>,
}

impl MlflowRun {
    /// Starts the task that creates (or, with `resume`, continues) the run of `config` and sends
    /// what is logged; `run_name` names a new run unless the config does. Must be called within
    /// a tokio runtime.
    pub fn start(config: &MlflowConfig, run_name: &str, output_dir: &Path, resume: bool) -> MlflowRun {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            buffer_steps: config.buffer_steps,
            run_id: Mutex::new(None),
        });
        let target = Target {
            client: Client::new(&config.tracking_uri),
            run_name: config.run_name.clone().unwrap_or_else(|| run_name.to_string()),
            resume: resume.then(|| RunFile::read(output_dir, &config.tracking_uri)).flatten(),
            output_dir: output_dir.to_path_buf(),
            config: config.clone(),
        };
        let worker = tokio::spawn(work(shared.clone(), target));
        MlflowRun {
            shared,
            worker: Mutex::new(Some(worker)),
            flush: Duration::from_secs_f64(config.flush_secs),
        }
    }

    /// Logs the run's parameters.
    pub fn params(&self, params: Vec<(String, String)>) {
        self.push(Op::Params(params));
    }

    /// Logs the metrics of `step`.
    pub fn metrics(&self, step: u64, values: &[(String, f64)]) {
        let values: Vec<_> = values.iter().filter(|(_, v)| v.is_finite()).cloned().collect();
        if !values.is_empty() {
            self.push(Op::Metrics { step, timestamp_ms: now_ms(), values });
        }
    }

    /// Sets the tag `key`.
    pub fn tag(&self, key: &str, value: &str) {
        self.push(Op::Tag { key: key.into(), value: value.into() });
    }

    fn push(&self, op: Op) {
        let mut q = self.shared.queue.lock().expect("queue lock");
        if q.closed {
            return;
        }
        if matches!(op, Op::Metrics { .. }) {
            if q.steps == self.shared.buffer_steps
                && let Some(i) = q
                    .ops
                    .iter()
                    .skip(q.in_flight)
                    .position(|o| matches!(o, Op::Metrics { .. }))
                    .map(|i| i + q.in_flight)
                && let Some(Op::Metrics { step, .. }) = q.ops.remove(i)
            {
                if q.dropped.is_empty() {
                    tracing::warn!(
                        buffer_steps = self.shared.buffer_steps,
                        "MLflow: the server has not taken the last {} steps' metrics; dropping the oldest",
                        self.shared.buffer_steps
                    );
                }
                q.dropped.push(step);
                q.steps -= 1;
            }
            q.steps += 1;
        }
        q.ops.push_back(op);
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Ends the run with `status`, waiting at most `flush_secs` for what is unsent, and reports
    /// (and warns of) what was lost.
    pub async fn finish(&self, status: RunStatus) -> Flushed {
        self.push(Op::End { status, end_ms: now_ms() });
        self.shared.queue.lock().expect("queue lock").closed = true;
        self.shared.wake.notify_one();
        let worker = self.worker.lock().expect("worker lock").take();
        if let Some(mut worker) = worker
            && tokio::time::timeout(self.flush, &mut worker).await.is_err()
        {
            worker.abort();
        }
        let q = self.shared.queue.lock().expect("queue lock");
        let unsent = q.ops.iter().filter_map(|o| match o {
            Op::Metrics { step, .. } => Some(*step),
            _ => None,
        });
        let mut lost_steps: Vec<u64> = q.dropped.iter().chain(&q.refused).copied().chain(unsent).collect();
        lost_steps.sort_unstable();
        let flushed = Flushed {
            run_id: self.shared.run_id.lock().expect("run id lock").clone(),
            ended: !q.ops.iter().any(|o| matches!(o, Op::End { .. })),
            lost_steps,
        };
        if !flushed.lost_steps.is_empty() || !flushed.ended {
            tracing::warn!(
                lost = flushed.lost_steps.len(),
                steps = %describe_steps(&flushed.lost_steps),
                ended = flushed.ended,
                "MLflow: the metrics of {} steps did not reach the server{}",
                flushed.lost_steps.len(),
                if flushed.ended { "" } else { ", nor the run's outcome" }
            );
        }
        flushed
    }
}

/// `1-3, 7` for `[1, 2, 3, 7]`.
fn describe_steps(steps: &[u64]) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &s in steps {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == s || *end == s => *end = s,
            _ => runs.push((s, s)),
        }
    }
    let parts: Vec<String> =
        runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    parts.join(", ")
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Sends the queue in order until it is closed and empty.
async fn work(shared: Arc<Shared>, target: Target) {
    let mut run_id: Option<String> = None;
    let mut pause = FIRST_PAUSE;
    let mut away: Option<String> = None;
    loop {
        let batch = {
            let mut q = shared.queue.lock().expect("queue lock");
            if q.ops.is_empty() && q.closed {
                return;
            }
            let batch = next_batch(&q.ops);
            q.in_flight = batch.len();
            batch
        };
        if batch.is_empty() {
            shared.wake.notified().await;
            continue;
        }
        let sent = async {
            let id = match &run_id {
                Some(id) => id.clone(),
                None => {
                    let id = target.open().await?;
                    *shared.run_id.lock().expect("run id lock") = Some(id.clone());
                    run_id = Some(id.clone());
                    id
                }
            };
            target.client.send(&id, &batch).await
        };
        match sent.await {
            Ok(()) => {
                if let Some(error) = away.take() {
                    tracing::info!(%error, "MLflow: the server is reachable again; sending what it missed");
                }
                pause = FIRST_PAUSE;
                remove(&shared, batch.len(), false);
            }
            Err(CallError::Unreachable(error)) => {
                if away.is_none() {
                    tracing::warn!(
                        uri = %target.config.tracking_uri,
                        %error,
                        "MLflow: the server cannot be reached; holding the metrics and trying again"
                    );
                }
                away = Some(error);
                shared.queue.lock().expect("queue lock").in_flight = 0;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
            Err(CallError::Refused(error)) if run_id.is_none() => {
                tracing::warn!(%error, "MLflow: the run could not be created; nothing more is sent");
                let mut q = shared.queue.lock().expect("queue lock");
                let steps: Vec<u64> = q
                    .ops
                    .drain(..)
                    .filter_map(|o| match o {
                        Op::Metrics { step, .. } => Some(step),
                        _ => None,
                    })
                    .collect();
                q.refused.extend(steps);
                q.steps = 0;
                // The outcome cannot be sent either: finish reports it as not ended.
                q.ops.push_back(Op::End { status: RunStatus::Failed, end_ms: 0 });
                q.closed = true;
                return;
            }
            Err(CallError::Refused(error)) => {
                tracing::warn!(%error, "MLflow: the server refused a batch; dropping it");
                remove(&shared, batch.len(), true);
            }
        }
    }
}

/// Removes the first `n` ops (sent, or refused when `refused`).
fn remove(shared: &Shared, n: usize, refused: bool) {
    let mut q = shared.queue.lock().expect("queue lock");
    q.in_flight = 0;
    for op in q.ops.drain(..n).collect::<Vec<_>>() {
        if let Op::Metrics { step, .. } = op {
            q.steps -= 1;
            if refused {
                q.refused.push(step);
            }
        }
    }
}

/// The ops at the front that go in one request: consecutive steps' metrics up to MLflow's limit
/// of a batch, or one other op.
fn next_batch(ops: &VecDeque<Op>) -> Vec<Op> {
    let mut batch = Vec::new();
    let mut metrics = 0;
    for op in ops {
        match op {
            Op::Metrics { values, .. } => {
                if !batch.is_empty() && metrics + values.len() > MAX_METRICS_PER_BATCH {
                    break;
                }
                metrics += values.len();
                batch.push(op.clone());
            }
            _ if batch.is_empty() => return vec![op.clone()],
            _ => break,
        }
    }
    batch
}

impl Target {
    /// The run's id: the run to continue, marked running again (a new one when it is gone), or a
    /// new run in the experiment, recorded in [`RUN_FILE`].
    async fn open(&self) -> Result<String, CallError> {
        if let Some(run) = &self.resume {
            let update = json!({"run_id": run.run_id, "status": "RUNNING"});
            match self.client.post("runs/update", &update).await {
                Ok(_) => {
                    tracing::info!(run_id = %run.run_id, "MLflow: continuing the run");
                    return Ok(run.run_id.clone());
                }
                Err(CallError::Refused(error)) => {
                    tracing::warn!(run_id = %run.run_id, %error, "MLflow: the run cannot be continued; starting a new one");
                }
                Err(e) => return Err(e),
            }
        }
        let experiment_id = self.experiment().await?;
        let body = json!({
            "experiment_id": experiment_id,
            "run_name": self.run_name,
            "start_time": now_ms(),
            "tags": [{"key": "mlflow.source.name", "value": "kart train"},
                     {"key": "mlflow.source.type", "value": "JOB"}],
        });
        let created = self.client.post("runs/create", &body).await?;
        let run_id = created["run"]["info"]["run_id"]
            .as_str()
            .ok_or_else(|| CallError::Refused(format!("runs/create answered without a run id: {created}")))?
            .to_string();
        let file =
            RunFile { tracking_uri: self.config.tracking_uri.clone(), experiment_id, run_id: run_id.clone() };
        let path = self.output_dir.join(RUN_FILE);
        if let Err(e) = std::fs::write(&path, serde_json::to_string(&file).expect("serialises")) {
            tracing::warn!(path = %path.display(), error = %e, "MLflow: the run's id could not be kept; a resumed run will start a new MLflow run");
        }
        tracing::info!(%run_id, experiment = %self.config.experiment, "MLflow: created the run");
        Ok(run_id)
    }

    /// The id of the experiment named in the config, created when missing.
    async fn experiment(&self) -> Result<String, CallError> {
        let name = &self.config.experiment;
        for _ in 0..2 {
            match self.client.get("experiments/get-by-name", &[("experiment_name", name)]).await {
                Ok(found) => {
                    let experiment = &found["experiment"];
                    if experiment["lifecycle_stage"] == "deleted" {
                        return Err(CallError::Refused(format!(
                            "experiment {name:?} is deleted: restore it or name another"
                        )));
                    }
                    return id_of(&experiment["experiment_id"], "experiments/get-by-name");
                }
                Err(CallError::Refused(e)) if e.contains("RESOURCE_DOES_NOT_EXIST") => {}
                Err(e) => return Err(e),
            }
            match self.client.post("experiments/create", &json!({"name": name})).await {
                Ok(created) => return id_of(&created["experiment_id"], "experiments/create"),
                // Another run created it meanwhile: look it up again.
                Err(CallError::Refused(e)) if e.contains("RESOURCE_ALREADY_EXISTS") => {}
                Err(e) => return Err(e),
            }
        }
        Err(CallError::Refused(format!("experiment {name:?} could neither be found nor created")))
    }
}

fn id_of(value: &Value, route: &str) -> Result<String, CallError> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| CallError::Refused(format!("{route} answered no id: {value}")))
}

/// Why a request did not succeed.
#[derive(Debug)]
enum CallError {
    /// No answer, or 5xx or 429: tried again.
    Unreachable(String),
    /// The server answered 4xx: not tried again.
    Refused(String),
}

/// The REST API's client, with MLflow's credentials from the environment.
struct Client {
    http: reqwest::Client,
    base: String,
    auth: Option<Auth>,
}

/// Credentials, as MLflow's client takes them from the environment: `MLFLOW_TRACKING_TOKEN`
/// (bearer), or `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD` (basic).
enum Auth {
    Bearer(String),
    Basic { user: String, password: String },
}

impl Auth {
    fn from_env() -> Option<Auth> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        if let Some(token) = var("MLFLOW_TRACKING_TOKEN") {
            return Some(Auth::Bearer(token));
        }
        Some(Auth::Basic {
            user: var("MLFLOW_TRACKING_USERNAME")?,
            password: var("MLFLOW_TRACKING_PASSWORD")?,
        })
    }
}

impl Client {
    fn new(tracking_uri: &str) -> Client {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client builds");
        let base = format!("{}/api/2.0/mlflow", tracking_uri.trim_end_matches('/'));
        Client { http, base, auth: Auth::from_env() }
    }

    async fn post(&self, route: &str, body: &Value) -> Result<Value, CallError> {
        self.answer(route, self.http.post(format!("{}/{route}", self.base)).json(body)).await
    }

    async fn get(&self, route: &str, query: &[(&str, &str)]) -> Result<Value, CallError> {
        let url = reqwest::Url::parse_with_params(&format!("{}/{route}", self.base), query)
            .map_err(|e| CallError::Refused(format!("{route}: {e}")))?;
        self.answer(route, self.http.get(url)).await
    }

    async fn answer(&self, route: &str, request: reqwest::RequestBuilder) -> Result<Value, CallError> {
        let request = match &self.auth {
            Some(Auth::Bearer(token)) => request.bearer_auth(token),
            Some(Auth::Basic { user, password }) => request.basic_auth(user, Some(password)),
            None => request,
        };
        let response = request.send().await.map_err(|e| CallError::Unreachable(format!("{route}: {e}")))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| CallError::Unreachable(format!("{route}: {e}")))?;
        if status.is_success() {
            return Ok(serde_json::from_str(&text).unwrap_or(Value::Null));
        }
        let error = format!("{route}: {status}: {}", text.chars().take(500).collect::<String>());
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            Err(CallError::Unreachable(error))
        } else {
            Err(CallError::Refused(error))
        }
    }

    /// Sends `batch` (see [`next_batch`]) to run `run_id`.
    async fn send(&self, run_id: &str, batch: &[Op]) -> Result<(), CallError> {
        let mut metrics = Vec::new();
        for op in batch {
            match op {
                Op::Metrics { step, timestamp_ms, values } => {
                    metrics.extend(values.iter().map(|(key, value)| {
                        json!({"key": key_of(key), "value": value, "timestamp": timestamp_ms, "step": step})
                    }));
                }
                Op::Params(params) => {
                    for chunk in params.chunks(MAX_PARAMS_PER_BATCH) {
                        let params: Vec<Value> = chunk
                            .iter()
                            .map(|(k, v)| json!({"key": key_of(k), "value": v.chars().take(MAX_PARAM_VALUE).collect::<String>()}))
                            .collect();
                        self.post("runs/log-batch", &json!({"run_id": run_id, "params": params})).await?;
                    }
                }
                Op::Tag { key, value } => {
                    let tag = json!({"run_id": run_id, "key": key_of(key), "value": value});
                    self.post("runs/set-tag", &tag).await?;
                }
                Op::End { status, end_ms } => {
                    let update = json!({"run_id": run_id, "status": status.as_str(), "end_time": end_ms});
                    self.post("runs/update", &update).await?;
                }
            }
        }
        if !metrics.is_empty() {
            self.post("runs/log-batch", &json!({"run_id": run_id, "metrics": metrics})).await?;
        }
        Ok(())
    }
}

/// `key` as MLflow accepts a name: letters, digits and `_-. /`, at most [`MAX_KEY`] characters;
/// other characters become `_`.
fn key_of(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_alphanumeric() || "_-. /".contains(c) { c } else { '_' })
        .take(MAX_KEY)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(step: u64, n: usize) -> Op {
        Op::Metrics { step, timestamp_ms: 0, values: (0..n).map(|i| (format!("m{i}"), 1.0)).collect() }
    }

    #[test]
    fn a_batch_is_consecutive_steps_within_mlflow_s_limit_or_one_other_op() {
        let ops: VecDeque<Op> = [
            metrics(1, 400),
            metrics(2, 400),
            metrics(3, 400),
            Op::Tag { key: "k".into(), value: "v".into() },
        ]
        .into();
        assert_eq!(next_batch(&ops).len(), 2, "800 values fit, 1200 do not");
        let ops: VecDeque<Op> = [Op::Params(vec![]), metrics(1, 1)].into();
        assert!(matches!(next_batch(&ops)[..], [Op::Params(_)]));
        let ops: VecDeque<Op> = [metrics(1, 1), Op::Tag { key: "k".into(), value: "v".into() }].into();
        assert!(matches!(next_batch(&ops)[..], [Op::Metrics { .. }]));
        // A step of more values than a batch holds still goes alone.
        assert_eq!(next_batch(&[metrics(1, 1500)].into()).len(), 1);
    }

    #[tokio::test]
    async fn a_server_that_never_answers_costs_the_oldest_steps_beyond_the_buffer_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        // Port 9 (discard) on loopback: nothing listens, every try is refused at once.
        let config = MlflowConfig {
            tracking_uri: "http://127.0.0.1:9".into(),
            buffer_steps: 3,
            flush_secs: 0.2,
            ..MlflowConfig::default()
        };
        let run = MlflowRun::start(&config, "run", dir.path(), false);
        run.params(vec![("seed".into(), "1".into())]);
        for step in 1..=5 {
            run.metrics(step, &[("reward/mean".into(), step as f64), ("actor/kl".into(), f64::NAN)]);
        }
        // A step of only non-finite values sends nothing.
        run.metrics(6, &[("actor/kl".into(), f64::NAN)]);
        let flushed = run.finish(RunStatus::Finished).await;
        assert_eq!(flushed, Flushed { run_id: None, lost_steps: vec![1, 2, 3, 4, 5], ended: false });
        assert!(!dir.path().join(RUN_FILE).exists());
        // Logging after the end is ignored.
        run.metrics(7, &[("reward/mean".into(), 1.0)]);
        assert_eq!(run.shared.queue.lock().unwrap().steps, 3);
    }

    #[test]
    fn names_are_as_mlflow_takes_them() {
        assert_eq!(key_of("eval/nq/exact_match"), "eval/nq/exact_match");
        assert_eq!(key_of("reward_scores/judge:score"), "reward_scores/judge_score");
        assert_eq!(key_of(&"x".repeat(300)).len(), MAX_KEY);
        assert_eq!(describe_steps(&[1, 2, 3, 7, 9, 10]), "1-3, 7, 9-10");
    }
}
