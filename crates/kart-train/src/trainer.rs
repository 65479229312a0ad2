//! The training loop: ask the pool for groups (keeping at most `max_staleness` versions in
//! flight), update, publish weights, evaluate, checkpoint.

use super::batch::Sample;
use super::broadcast::{BroadcastConfig, Broadcaster};
use super::checkpoint::{self, CheckpointError, Loaded, Parts, TrainerState};
use super::data::{DataError, Dataset, Sampler};
use super::data_parallel::DataParallel;
use super::dump::RolloutDump;
use super::eval::{self, Evaluation, Report};
use super::follower::Order;
use super::metrics::{MetricsLog, TrainerMetrics};
use super::pool::{InProcessPool, RemotePool, RolloutPool};
use super::record::{Key, StepRecord, keys};
use super::replay::{Replay, ReplayError};
use super::replica_watch::ReplicaWatch;
use super::server::{Phase, StatusHandle};
use super::update::{Learner, LearnerError};
use super::weights::{Publisher, PullFrom, SyncError, WeightStore};
use futures::{FutureExt, StreamExt};
use kart_core::agent::trajectory::{Status, Trajectory};
use kart_core::config::ConfigError;
use kart_core::config::train::{TrainConfig, WeightSync};
use kart_core::generation::SamplingParams;
use kart_core::wire::{Group, RolloutRequest, Task};
use kart_http::token::Token;
use kart_model::{CausalLm, EmbeddedEngine, ModelError, save_pretrained};
use kart_retriever::{InProcess, RetrieverError};
use kart_rollout::env::{Context, ContextError};
use kart_rollout::metrics::RolloutMetrics;
use kart_tokenizer::{Tokenizer, TokenizerError};
use kart_torch::{DeviceError, DistError, ProcessGroup, Ranks};
use kart_tracking::{Run, Tracker};
use prometheus::Registry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a run could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error("model: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Learner(#[from] LearnerError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{path}: data cursor: {source}")]
    Cursor { path: PathBuf, source: serde_json::Error },
    #[error("rollout.index {path}: {source}")]
    Index { path: PathBuf, source: Box<RetrieverError> },
    #[error("rollout: {0}")]
    Context(#[from] ContextError),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("step {step}: {reason}")]
    Rollout { step: u64, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "output_dir {dir}: holds an earlier run ({what}); pass --resume to continue it, or choose an empty output_dir"
    )]
    EarlierRun { dir: PathBuf, what: String },
    #[error("config: {0}")]
    Device(#[from] DeviceError),
    #[error("data parallel: {0}")]
    Dist(#[from] DistError),
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("data parallel: rank 0's order does not parse: {0}")]
    Order(serde_json::Error),
    #[error("data parallel: rank 0 stopped: {reason}")]
    LeaderStopped { reason: String },
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Steps completed.
    pub steps: u64,
    /// The evaluation before the first step (absent on a resumed run or without a test split).
    pub first_eval: Option<Evaluation>,
    /// The last evaluation.
    pub last_eval: Option<Evaluation>,
    /// The final model's Hugging Face folder.
    pub model_dir: PathBuf,
    /// The newest checkpoint.
    pub checkpoint: Option<PathBuf>,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub enum Ending {
    /// It reached `total_steps`.
    Finished(Box<RunSummary>),
    /// The stop signal came first: the run holds a checkpoint of `step`, the last step it
    /// finished (none before the first step), which `--resume` continues from.
    Stopped { step: u64, checkpoint: Option<PathBuf> },
}

/// A batch of groups for one step.
struct Batch {
    groups: Vec<Group>,
    failed: usize,
    filtered: usize,
    /// Groups the pool returned, kept, filtered out or beyond the batch.
    generated: usize,
    cursor: Sampler,
    rollout_secs: f64,
}

/// What a rollout request needs, shareable with the task that makes it.
#[derive(Clone)]
struct Collector {
    pool: Arc<dyn RolloutPool>,
    prompts: Arc<Vec<Task>>,
    sampler: Arc<Mutex<Sampler>>,
    config: Arc<TrainConfig>,
    /// `rollout.replay`: recorded groups instead of the pool's.
    replay: Option<Arc<Replay>>,
}

/// Rounds of over-sampling to refill a batch whose groups were filtered out.
const FILTER_ROUNDS: usize = 4;

impl Collector {
    async fn collect(self, step: u64, version: i64) -> Result<Batch, TrainError> {
        let c = &self.config;
        let started = Instant::now();
        if let Some(replay) = &self.replay {
            let groups = replay.groups(step + 1)?;
            let cursor = *self.sampler.lock().expect("sampler lock");
            let generated = groups.len();
            return Ok(Batch { groups, failed: 0, filtered: 0, generated, cursor, rollout_secs: 0.0 });
        }
        let needed = c.batch.prompts;
        let (mut groups, mut failed, mut filtered, mut last_error) = (Vec::new(), 0, 0, String::new());
        let mut generated = 0;
        let mut cursor = *self.sampler.lock().expect("sampler lock");
        for round in 0..=FILTER_ROUNDS {
            let want = needed - groups.len();
            let draw = if round == 0 { want } else { want * 2 };
            let indices = {
                let mut sampler = self.sampler.lock().expect("sampler lock");
                let indices = sampler.next_batch(draw, self.prompts.len());
                cursor = *sampler;
                indices
            };
            let request = RolloutRequest {
                prompts: unique_tasks(indices.iter().map(|&i| &self.prompts[i])),
                n: c.batch.n,
                sampling: sampling(c, seed_of(c.seed, step, round)),
                policy_version: Some(version),
                env: Some(c.rollout.env.clone()),
                weights: None,
            };
            let mut stream = self.pool.rollout(request);
            while let Some(item) = stream.next().await {
                generated += usize::from(item.is_ok());
                match item {
                    Ok(g) if c.algorithm.filter_groups && !has_variance(&g) => filtered += 1,
                    Ok(g) => groups.push(g),
                    Err(e) => {
                        tracing::warn!(step, error = %e, "group failed");
                        failed += 1;
                        last_error = e.to_string();
                    }
                }
            }
            if groups.len() >= needed || !c.algorithm.filter_groups {
                break;
            }
        }
        if groups.is_empty() {
            let reason = match failed {
                0 => format!("all {filtered} groups had rewards without variance"),
                n => format!("no group could be rolled out ({n} failed; last: {last_error})"),
            };
            return Err(TrainError::Rollout { step, reason });
        }
        groups.truncate(needed);
        let rollout_secs = started.elapsed().as_secs_f64();
        Ok(Batch { groups, failed, filtered, generated, cursor, rollout_secs })
    }
}

/// The tasks of `prompts`, ids made unique within the request (a batch crossing an epoch
/// boundary can hold a prompt twice).
fn unique_tasks<'a>(prompts: impl Iterator<Item = &'a Task>) -> Vec<Task> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    prompts
        .map(|t| {
            let count = seen.entry(t.id.clone()).or_insert(0);
            *count += 1;
            let mut task = t.clone();
            if *count > 1 {
                task.id = format!("{}~{}", t.id, *count - 1);
            }
            task
        })
        .collect()
}

/// Refuses to start a new run where an earlier one left checkpoints or metrics: its checkpoints
/// would outrank the new run's when pruning and resuming, and its records would be lost.
fn refuse_earlier_run(out: &std::path::Path) -> Result<(), TrainError> {
    let earlier = |what: String| Err(TrainError::EarlierRun { dir: out.to_path_buf(), what });
    if let Some((step, _)) = checkpoint::list(&out.join("checkpoints")).pop() {
        return earlier(format!("a checkpoint of step {step}"));
    }
    let metrics = out.join("metrics.jsonl");
    if std::fs::metadata(&metrics).is_ok_and(|m| m.len() > 0) {
        return earlier(format!("{} is not empty", metrics.display()));
    }
    Ok(())
}

fn has_variance(g: &Group) -> bool {
    let mut rewards = g.trajectories.iter().filter(|t| t.status != Status::Aborted).map(|t| t.reward);
    let Some(first) = rewards.next() else { return false };
    rewards.any(|r| r != first)
}

fn seed_of(seed: u64, step: u64, round: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ step.wrapping_mul(1_000_003) ^ (round as u64) << 48
}

fn sampling(c: &TrainConfig, seed: u64) -> SamplingParams {
    let s = &c.rollout.sampling;
    SamplingParams { temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, seed: Some(seed) }
}

/// The training run.
pub struct Trainer {
    config: Arc<TrainConfig>,
    learner: Learner,
    tokenizer: Tokenizer,
    collector: Collector,
    publisher: Publisher,
    test: Vec<Task>,
    step: u64,
    version: i64,
    /// The data cursor after the last trained batch (what a checkpoint stores).
    cursor: Sampler,
    metrics: TrainerMetrics,
    log: MetricsLog,
    dump: Option<RolloutDump>,
    /// MLflow and TensorBoard (`tracking`).
    tracker: Tracker,
    status: StatusHandle,
    checkpoint: Option<PathBuf>,
    /// The step of the newest checkpoint (loaded or written).
    checkpointed: Option<u64>,
    remote: bool,
    /// The SGLang replicas' versions, watched while the run goes.
    watch: Option<ReplicaWatch>,
}

/// What the loop waits for next.
enum Next {
    Batch(Result<Result<Batch, TrainError>, tokio::task::JoinError>),
    Behind(Vec<String>),
    Stop,
}

impl Trainer {
    /// Loads data, models and optimiser state (from the newest checkpoint when `resume`; without
    /// it, an output folder holding an earlier run is refused), joins the other `ranks` of a
    /// data-parallel run, and connects the pool. `advertise_url` is where workers reach this
    /// trainer's `/weights`.
    pub fn build(
        config: TrainConfig,
        resume: bool,
        ranks: &Ranks,
        registry: &Registry,
        status: StatusHandle,
        weights: WeightStore,
        serving: Serving,
    ) -> Result<Trainer, TrainError> {
        config.validate()?;
        let out = config.output_dir.clone();
        std::fs::create_dir_all(&out).map_err(|source| TrainError::Io { path: out.clone(), source })?;
        let train = Dataset::train(&config.data)?.prompts;
        let test = Dataset::test(&config.data, config.eval.max_prompts)?.map_or_else(Vec::new, |d| d.prompts);
        let loaded = if resume {
            checkpoint::latest(&out.join("checkpoints")).map(|d| checkpoint::load(&d)).transpose()?
        } else {
            refuse_earlier_run(&out)?;
            None
        };
        let (step, version, sampler) = position(&config, loaded.as_ref())?;
        let replay = config.rollout.replay.as_deref().map(Replay::open).transpose()?.map(Arc::new);
        let learner = learner(&config, loaded.as_ref(), ranks)?;
        let device = learner.device();
        let tokenizer = Tokenizer::load(&config.model)?;
        let policy_dir = loaded.as_ref().map_or_else(|| config.model.clone(), Loaded::policy_dir);
        let endpoints = Endpoints { registry, weights, serving };
        let (pool, publisher) = connect(&config, &policy_dir, device, version, &tokenizer, endpoints)?;
        let resumed = loaded.as_ref().map(|l| l.state.step);
        let (log, dump) = open_outputs(&config, &tokenizer, resumed)?;
        let params =
            kart_tracking::params::flatten(&serde_json::to_value(&config).expect("the config serialises"));
        let run = Run { output_dir: &out, resumed: resumed.is_some(), params };
        let tracker = Tracker::start(&config.tracking, run).map_err(|source| {
            // Only the TensorBoard folder is opened here.
            let dir = config.tracking.tensorboard.as_ref().map(|t| t.dir.clone()).unwrap_or_default();
            TrainError::Io { path: out.join(dir), source }
        })?;
        let config = Arc::new(config);
        let metrics = TrainerMetrics::new(registry);
        metrics.world_size.set(ranks.world_size as f64);
        status.update(|s| {
            s.world_size = ranks.world_size;
            s.total_steps = config.total_steps;
            s.step = step;
            s.policy_version = version;
            s.checkpoint = loaded.as_ref().map(|l| l.dir.display().to_string());
        });
        Ok(Trainer {
            learner,
            tokenizer,
            collector: Collector {
                pool,
                prompts: Arc::new(train),
                sampler: Arc::new(Mutex::new(sampler)),
                config: config.clone(),
                replay,
            },
            publisher,
            test,
            step,
            version,
            cursor: sampler,
            metrics,
            log,
            dump,
            tracker,
            status,
            checkpointed: loaded.as_ref().map(|l| l.state.step),
            checkpoint: loaded.map(|l| l.dir),
            remote: !config.rollout.urls.is_empty(),
            watch: None,
            config,
        })
    }

    /// Runs to `total_steps`; returns the summary. The status phase ends `finished` or `failed`;
    /// the other ranks are told the run is over, or that it failed.
    pub async fn run(self) -> Result<RunSummary, TrainError> {
        match self.run_until(std::future::pending()).await? {
            Ending::Finished(summary) => Ok(*summary),
            Ending::Stopped { .. } => unreachable!("a run without a stop signal runs to its end"),
        }
    }

    /// Runs to `total_steps` or until `stop` resolves (a termination signal: a pod deleted,
    /// preempted or evicted). On `stop` the step in progress finishes its update, rollouts in
    /// flight are dropped, a checkpoint of the last finished step is written unless the newest is
    /// of it, and the other ranks are told the run is over: a `--resume` continues from that step.
    pub async fn run_until(mut self, stop: impl Future<Output = ()>) -> Result<Ending, TrainError> {
        let result = self.run_inner(std::pin::pin!(stop)).await;
        let last = match &result {
            Ok(_) => Order::Done,
            Err(e) => Order::Stop { reason: e.to_string() },
        };
        let told = tokio::task::block_in_place(|| self.order(&last));
        let result = result.and_then(|ending| told.map(|()| ending));
        if let Err(e) = &result {
            self.status.update(|s| {
                s.phase = Phase::Failed;
                s.error = Some(e.to_string());
            });
        }
        result
    }

    /// Broadcasts `order` to the other ranks (nothing without them).
    fn order(&self, order: &Order) -> Result<(), TrainError> {
        let Some(parallel) = &self.learner.parallel else { return Ok(()) };
        let bytes = serde_json::to_vec(order).expect("orders serialise");
        parallel.group().broadcast_bytes(&bytes, 0)?;
        Ok(())
    }

    async fn run_inner(
        &mut self,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Ending, TrainError> {
        let total = self.config.total_steps;
        if let Some((server, urls)) = self.config.weight_sync.servers().filter(|_| self.remote) {
            let lag = self.metrics.replica_version_lag.clone();
            self.watch = Some(ReplicaWatch::spawn(server, urls.to_vec(), lag));
        }
        if self.version > 0 || self.remote {
            self.publish().await?;
        }
        let first_eval = match self.step {
            0 => self.evaluate().await?,
            _ => None,
        };
        if let Some(report) = &first_eval {
            let mut record = StepRecord::default();
            record.set(keys::STEP, 0.0);
            write_eval(&mut record, report);
            self.append(&record)?;
        }
        let mut last_eval = first_eval.clone();
        let mut in_flight = VecDeque::new();
        let mut next = self.step;
        let progress = crate::progress::bar("training", total, self.step);
        while self.step < total {
            while next < total && next - self.step <= self.config.rollout.max_staleness {
                let collector = self.collector.clone();
                in_flight.push_back(tokio::spawn(collector.collect(next, self.version)));
                next += 1;
            }
            let batch = loop {
                let next = in_flight.front_mut().expect("a batch is in flight");
                let behind = async {
                    match &mut self.watch {
                        Some(watch) => watch.behind().await,
                        None => std::future::pending().await,
                    }
                };
                let next = tokio::select! {
                    batch = next => Next::Batch(batch),
                    behind = behind => Next::Behind(behind),
                    () = stop.as_mut() => Next::Stop,
                };
                match next {
                    Next::Batch(batch) => {
                        in_flight.pop_front();
                        break batch;
                    }
                    // The policy is idle while rollouts go on: bring the replicas left behind to it.
                    Next::Behind(behind) => self.catch_up(&behind).await,
                    Next::Stop => {
                        progress.finish_and_clear();
                        return self.stopped(in_flight, None).await;
                    }
                }
            };
            let batch =
                batch.map_err(|e| TrainError::Rollout { step: self.step, reason: e.to_string() })??;
            self.status.update(|s| s.phase = Phase::Training);
            let mut record = self.train_step(batch).await?;
            let step = self.step;
            let every = |n: u64| n > 0 && step.is_multiple_of(n);
            if (every(self.config.eval.every) || (step == total && !self.test.is_empty()))
                && let Some(report) = self.evaluate().await?
            {
                write_eval(&mut record, &report);
                last_eval = Some(report);
            }
            self.append(&record)?;
            if every(self.config.checkpoint.every) || step == total {
                self.save_checkpoint(record.get(&keys::REWARD_MEAN)).await?;
            }
            // A signal during the update is heeded once it finished.
            if step < total && stop.as_mut().now_or_never().is_some() {
                progress.finish_and_clear();
                return self.stopped(in_flight, record.get(&keys::REWARD_MEAN)).await;
            }
            progress.set_position(step);
            progress.set_message(format!(
                "reward {:.3}{}",
                record.get(&keys::REWARD_MEAN).unwrap_or(f64::NAN),
                last_eval
                    .as_ref()
                    .map(|r| format!(" · eval EM {:.3}", r.greedy.all.exact_match))
                    .unwrap_or_default()
            ));
        }
        progress.finish_and_clear();
        let model_dir = self.config.output_dir.join("model");
        tokio::task::block_in_place(|| self.save_policy(&model_dir))?;
        self.status.update(|s| s.phase = Phase::Finished);
        Ok(Ending::Finished(Box::new(RunSummary {
            steps: self.step,
            first_eval,
            last_eval,
            model_dir,
            checkpoint: self.checkpoint.clone(),
        })))
    }

    /// Ends a run stopped after step `self.step`: drops the rollouts `in_flight` and checkpoints
    /// that step unless the newest checkpoint is of it (`reward`: its mean reward, for the log).
    async fn stopped(
        &mut self,
        in_flight: VecDeque<tokio::task::JoinHandle<Result<Batch, TrainError>>>,
        reward: Option<f64>,
    ) -> Result<Ending, TrainError> {
        in_flight.iter().for_each(tokio::task::JoinHandle::abort);
        tracing::info!(step = self.step, "stopping on a termination signal");
        if self.step > 0 && self.checkpointed != Some(self.step) {
            self.save_checkpoint(reward).await?;
        }
        Ok(Ending::Stopped { step: self.step, checkpoint: self.checkpoint.clone() })
    }

    /// The run's MLflow and TensorBoard tracking, which the caller ends once it knows how the
    /// run ended ([`Tracker::finish`]).
    pub fn tracker(&self) -> Tracker {
        self.tracker.clone()
    }

    /// Writes a step's record to `metrics.jsonl` and the trackers.
    fn append(&self, record: &StepRecord) -> Result<(), TrainError> {
        let path = self.config.output_dir.join("metrics.jsonl");
        self.log.append(record).map_err(|source| TrainError::Io { path, source })?;
        self.tracker.log(record.step(), &record.figures());
        Ok(())
    }

    /// One step on `batch`: samples, update, weight sync, metrics.
    async fn train_step(&mut self, batch: Batch) -> Result<StepRecord, TrainError> {
        let started = Instant::now();
        let c = self.config.clone();
        let trajectories: Vec<&Trajectory> = batch.groups.iter().flat_map(|g| &g.trajectories).collect();
        let mut samples = Sample::of_groups(&batch.groups, c.algorithm.mask_observations);
        let mut record = batch_record(&trajectories, self.version, &self.metrics);
        record.set(keys::STEP, (self.step + 1) as f64);
        record.set(keys::GROUPS_FAILED, batch.failed as f64);
        record.set(keys::GROUPS_FILTERED, batch.filtered as f64);
        if self.config.algorithm.filter_groups {
            let kept = batch.groups.len().max(1) as f64;
            record.set(keys::GROUPS_GENERATED_PER_KEPT, (batch.generated as f64) / kept);
        }
        let tokens: usize = samples.iter().map(Sample::len).sum();
        let update_started = Instant::now();
        let step = self.step;
        let update = tokio::task::block_in_place(|| {
            if self.learner.parallel.is_some() {
                self.order(&Order::Step { step, groups: batch.groups.clone() })?;
            }
            Ok::<_, TrainError>(self.learner.step(&mut samples, &c, step)?)
        })?;
        record.extend(update);
        let update_secs = update_started.elapsed().as_secs_f64();
        if let Some(dump) = &self.dump {
            dump.write(self.step + 1, self.version, &batch.groups)
                .map_err(|source| TrainError::Io { path: c.output_dir.join(super::dump::FILE), source })?;
        }
        self.step += 1;
        self.version += 1;
        self.cursor = batch.cursor;
        let sync_started = Instant::now();
        self.publish().await?;
        let sync_secs = sync_started.elapsed().as_secs_f64();
        let total_secs = started.elapsed().as_secs_f64() + batch.rollout_secs;
        record.set(keys::TIMING_ROLLOUT, batch.rollout_secs);
        record.set(keys::TIMING_UPDATE, update_secs);
        record.set(keys::TIMING_SYNC, sync_secs);
        record.set(keys::TIMING_STEP, total_secs);
        record.set(keys::TOKENS_PER_SECOND, tokens as f64 / (update_secs + batch.rollout_secs).max(1e-9));
        record.set(keys::POLICY_VERSION, self.version as f64);
        self.observe(&record, sync_secs);
        Ok(record)
    }
}

impl Trainer {
    /// Publishes the policy as the current version.
    async fn publish(&self) -> Result<(), TrainError> {
        let started = Instant::now();
        let published = self.publisher.publish(&self.learner.policy, self.version).await?;
        let method = self.publisher.method();
        self.metrics
            .weight_sync_seconds
            .with_label_values(&[method])
            .observe(started.elapsed().as_secs_f64());
        if let Some(watch) = &self.watch {
            watch.published(self.version);
        }
        self.metrics.weight_sync_replicas.set(published.replicas as f64);
        self.metrics.weight_sync_bytes.inc_by(published.bytes);
        self.metrics.policy_version.set(self.version as f64);
        self.status.update(|s| s.policy_version = self.version);
        Ok(())
    }

    /// Brings the replicas `behind` to the published version; a failure is left to the next
    /// publish, which fails the step if it fails too.
    async fn catch_up(&self, behind: &[String]) {
        let version = self.version;
        match self.publisher.catch_up(&self.learner.policy, version, behind).await {
            Ok(0) => {}
            Ok(replicas) => tracing::info!(replicas, version, "inference replicas caught up"),
            Err(error) => tracing::warn!(%error, version, "catching up inference replicas failed"),
        }
    }

    /// The held-out evaluation: greedy, and sampled as in training when `eval.sampled_n` is set;
    /// `None` without a test split.
    async fn evaluate(&self) -> Result<Option<Evaluation>, TrainError> {
        if self.test.is_empty() {
            return Ok(None);
        }
        self.status.update(|s| s.phase = Phase::Evaluating);
        let argmax = SamplingParams { temperature: 0.0, top_p: 1.0, top_k: -1, seed: Some(self.config.seed) };
        let (greedy, greedy_trajectories) = self.score_test(1, argmax).await?;
        // The run's seed at every evaluation: evaluations differ by the policy, not by the draw.
        // The passes run one after the other: run concurrently, timing would decide how the
        // engine batches them together, and batch shapes can change the logits' last bits.
        let sampled = match self.config.eval.sampled_n {
            0 => None,
            n => Some(self.score_test(n, sampling(&self.config, self.config.seed)).await?.0),
        };
        for (source, summary) in greedy.sources() {
            self.metrics.eval_exact_match.with_label_values(&[source]).set(summary.exact_match);
            self.metrics.eval_f1.with_label_values(&[source]).set(summary.f1);
            self.metrics.eval_reward.with_label_values(&[source]).set(summary.reward);
        }
        for (source, summary) in sampled.iter().flat_map(Report::sources) {
            self.metrics.eval_sampled_reward.with_label_values(&[source]).set(summary.reward);
        }
        self.status.update(|s| {
            s.eval_em = Some(greedy.all.exact_match);
            s.phase = Phase::Training;
        });
        Ok(Some(Evaluation { greedy, sampled, greedy_trajectories }))
    }

    /// Rollouts of the held-out prompts, `n` per prompt, scored against their golden answers;
    /// the report and the trajectories.
    async fn score_test(
        &self,
        n: usize,
        sampling: SamplingParams,
    ) -> Result<(Report, Vec<Trajectory>), TrainError> {
        let pool = self.collector.pool.as_ref();
        let env = &self.config.rollout.env;
        let pass = eval::Pass { n, sampling, policy_version: Some(self.version) };
        Ok(eval::score(pool, &self.tokenizer, env, &self.test, &pass, None).await?)
    }

    /// Writes the policy as a Hugging Face folder (tokenizer files from the base model), or with
    /// LoRA its adapters as a PEFT folder (on `model`, the base).
    fn save_policy(&self, dir: &Path) -> Result<(), ModelError> {
        let policy = &self.learner.policy;
        if let Some(adapters) = policy.lora() {
            return adapters.save(dir, &self.config.model.to_string_lossy());
        }
        save_pretrained(
            dir,
            policy.config(),
            &policy.named_tensors(),
            Some(&self.config.model),
            policy.kind(),
        )
    }

    /// Writes a checkpoint of the current step (`reward`: its mean reward, for the log).
    async fn save_checkpoint(&mut self, reward: Option<f64>) -> Result<(), TrainError> {
        self.status.update(|s| s.phase = Phase::Checkpointing);
        // Sharded optimiser states are gathered from every rank.
        let states = tokio::task::block_in_place(|| {
            self.order(&Order::Checkpoint)?;
            Ok::<_, TrainError>(self.learner.optimizer_states()?)
        })?;
        let state = TrainerState {
            step: self.step,
            policy_version: self.version,
            seed: self.config.seed,
            data_cursor: serde_json::to_value(self.cursor).expect("the cursor serialises"),
            optimizer_steps: states.policy.1,
            critic_optimizer_steps: states.critic.as_ref().map(|(_, steps)| *steps),
            kl_coef: self.learner.kl_ctrl.as_ref().map(|c| c.value()),
        };
        let parts = Parts {
            state: &state,
            optimizer: states.policy.0,
            critic: self.learner.critic.as_ref().map(|(c, _)| c.parameters()),
            critic_optimizer: states.critic.map(|(tensors, _)| tensors),
        };
        let root = self.config.output_dir.join("checkpoints");
        let dir = tokio::task::block_in_place(|| {
            checkpoint::save(&root, |d| self.save_policy(d), parts, self.config.checkpoint.keep)
        })?;
        tracing::info!(step = self.step, checkpoint = %dir.display(), reward, "checkpoint written");
        self.metrics.checkpoints.inc();
        self.tracker.checkpoint(&dir);
        self.status.update(|s| {
            s.checkpoint = Some(dir.display().to_string());
            s.phase = Phase::Training;
        });
        self.checkpoint = Some(dir);
        self.checkpointed = Some(self.step);
        Ok(())
    }

    /// Sets the Prometheus metrics from a step's record.
    fn observe(&self, r: &StepRecord, sync_secs: f64) {
        let m = &self.metrics;
        let get = |k: Key| r.get(&k).unwrap_or(0.0);
        m.step.set(self.step as f64);
        m.reward.set(get(keys::REWARD_MEAN));
        // Without a reference there is no KL to show: the series stays absent, never 0.
        if let Some(kl) = r.get(&keys::ACTOR_KL) {
            m.kl.with_label_values::<&str>(&[]).set(kl);
            m.loss.with_label_values(&["kl"]).set(kl);
        }
        m.entropy.set(get(keys::ACTOR_ENTROPY));
        m.clip_fraction.set(get(keys::ACTOR_CLIPFRAC));
        m.grad_norm.set(get(keys::ACTOR_GRAD_NORM));
        m.learning_rate.set(get(keys::ACTOR_LR));
        m.tokens_per_second.set(get(keys::TOKENS_PER_SECOND));
        for (term, key) in [
            ("policy", keys::ACTOR_PG_LOSS),
            ("entropy", keys::ACTOR_ENTROPY),
            ("value", keys::CRITIC_VF_LOSS),
        ] {
            m.loss.with_label_values(&[term]).set(get(key));
        }
        let a = &self.config.algorithm;
        let total = get(keys::ACTOR_PG_LOSS) + a.kl_coef * get(keys::ACTOR_KL)
            - a.entropy_coef * get(keys::ACTOR_ENTROPY);
        m.loss.with_label_values(&["total"]).set(total);
        for (phase, key) in
            [("rollout", keys::TIMING_ROLLOUT), ("update", keys::TIMING_UPDATE), ("total", keys::TIMING_STEP)]
        {
            m.step_seconds.with_label_values(&[phase]).observe(get(key));
        }
        m.step_seconds.with_label_values(&["sync"]).observe(sync_secs);
        m.last_step_timestamp.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        let reward = r.get(&keys::REWARD_MEAN);
        self.status.update(|s| {
            s.step = self.step;
            s.reward = reward;
        });
    }
}

/// The figures of a batch's trajectories.
fn batch_record(trajectories: &[&Trajectory], version: i64, metrics: &TrainerMetrics) -> StepRecord {
    let mut r = StepRecord::default();
    let scored: Vec<&&Trajectory> = trajectories.iter().filter(|t| t.status != Status::Aborted).collect();
    let n = scored.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Trajectory) -> f64| scored.iter().map(|t| f(t)).fold(0.0, |a, b| a + b) / n;
    let reward = mean(&|t| t.reward);
    r.set(keys::REWARD_MEAN, reward);
    r.set(keys::REWARD_STD, (mean(&|t| (t.reward - reward).powi(2))).sqrt());
    r.set(keys::RESPONSE_LENGTH_MEAN, mean(&|t| f64::from(t.stats.response_tokens)));
    r.set(keys::TURNS_MEAN, mean(&|t| f64::from(t.stats.turns)));
    r.set(
        keys::VALID_ACTION_RATIO,
        mean(&|t| f64::from(t.stats.valid_actions) / f64::from(t.stats.turns.max(1))),
    );
    r.set(keys::TOOL_CALLS, mean(&|t| f64::from(t.stats.total_tool_calls())));
    let tools: std::collections::BTreeSet<&String> =
        scored.iter().flat_map(|t| t.stats.tool_calls.keys()).collect();
    for tool in tools {
        let calls = mean(&|t| t.stats.tool_calls.get(tool).map_or(0.0, |c| f64::from(c.ok + c.failed)));
        r.set(keys::tool_calls(tool), calls);
    }
    // Reward services' parts (`rule`, each service, its metrics), over the trajectories that have them.
    let parts: std::collections::BTreeSet<&String> =
        scored.iter().flat_map(|t| t.stats.reward_scores.keys()).collect();
    for part in parts {
        let values: Vec<f64> =
            scored.iter().filter_map(|t| t.stats.reward_scores.get(part).copied()).collect();
        r.set(keys::reward_part(part), values.iter().sum::<f64>() / values.len().max(1) as f64);
    }
    // Workflow roles' rewards.
    let roles: std::collections::BTreeSet<&String> =
        scored.iter().filter_map(|t| t.stats.role.as_ref()).collect();
    for role in roles {
        let rewards: Vec<f64> =
            scored.iter().filter(|t| t.stats.role.as_ref() == Some(role)).map(|t| t.reward).collect();
        r.set(keys::role_reward(role), rewards.iter().sum::<f64>() / rewards.len() as f64);
    }
    for status in [Status::Completed, Status::Truncated, Status::Aborted] {
        let count = trajectories.iter().filter(|t| t.status == status).count();
        let label =
            serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        metrics.trajectories.with_label_values(&[label.as_str()]).inc_by(count as u64);
        r.set(keys::trajectories(&label), count as f64);
    }
    let staleness: Vec<f64> =
        trajectories.iter().filter_map(|t| t.staleness(version)).map(|s| s as f64).collect();
    for s in &staleness {
        metrics.staleness.observe(*s);
    }
    r.set(keys::STALENESS_MEAN, staleness.iter().sum::<f64>() / staleness.len().max(1) as f64);
    r.set(keys::STALENESS_MAX, staleness.iter().copied().fold(0.0, f64::max));
    r
}

/// Adds an evaluation's figures to a record.
fn write_eval(r: &mut StepRecord, evaluation: &Evaluation) {
    use keys::{Figure, Pass};
    let reports = std::iter::once((Pass::Greedy, &evaluation.greedy))
        .chain(evaluation.sampled.as_ref().map(|s| (Pass::Sampled, s)));
    for (pass, report) in reports {
        let all = &report.all;
        r.set(keys::eval(pass, None, Figure::Trajectories), all.count as f64);
        r.set(keys::eval(pass, None, Figure::ExactMatch), all.exact_match);
        r.set(keys::eval(pass, None, Figure::F1), all.f1);
        r.set(keys::eval(pass, None, Figure::Reward), all.reward);
        r.set(keys::eval(pass, None, Figure::ToolCalls), all.tool_calls);
        r.set(keys::eval(pass, None, Figure::ValidFormat), all.valid_format);
        for (source, s) in &report.by_source {
            r.set(keys::eval(pass, Some(source), Figure::ExactMatch), s.exact_match);
            r.set(keys::eval(pass, Some(source), Figure::F1), s.f1);
            r.set(keys::eval(pass, Some(source), Figure::Reward), s.reward);
        }
    }
}

/// The learner of this rank, on its device (`device` at its local rank), joined to the other
/// ranks of a data-parallel run.
pub fn learner(config: &TrainConfig, loaded: Option<&Loaded>, ranks: &Ranks) -> Result<Learner, TrainError> {
    let device = kart_torch::choose("trainer", "device", config.device, ranks.local_rank)?;
    let parallel = match ranks.world_size {
        1 => None,
        _ => {
            let timeout = Duration::from_secs_f64(config.distributed.timeout_secs);
            let group = ProcessGroup::join(ranks, device, timeout)?;
            Some(DataParallel::new(group, config.distributed.bucket_mb))
        }
    };
    Ok(Learner::load(config, loaded, device, parallel)?)
}

/// Where a run starts: step, policy version and data cursor, from `checkpoint` when resuming.
fn position(config: &TrainConfig, checkpoint: Option<&Loaded>) -> Result<(u64, i64, Sampler), TrainError> {
    let Some(c) = checkpoint else { return Ok((0, 0, Sampler::new(config.seed))) };
    let sampler = serde_json::from_value(c.state.data_cursor.clone())
        .map_err(|source| TrainError::Cursor { path: c.dir.clone(), source })?;
    tracing::info!(checkpoint = %c.dir.display(), step = c.state.step, "resuming");
    Ok((c.state.step, c.state.policy_version, sampler))
}

/// How rollout workers and this trainer reach each other.
#[derive(Debug, Clone, Default)]
pub struct Serving {
    /// The address other machines reach this trainer at.
    pub host: String,
    /// The URL workers reach this trainer's `/weights` at.
    pub advertise_url: String,
    /// The token the trainer's requests to workers bear and its `/weights` asks for.
    pub token: Option<Token>,
}

/// What the trainer offers the outside: its metrics registry, the weights it serves, and how
/// workers reach those.
struct Endpoints<'a> {
    registry: &'a Registry,
    weights: WeightStore,
    serving: Serving,
}

/// Where trajectories come from and how new weights reach their engines: rollout workers at
/// `rollout.urls` (weights pulled over HTTP or written for SGLang), or an in-process pool on an
/// embedded engine loaded from `policy_dir` at `version`.
fn connect(
    config: &TrainConfig,
    policy_dir: &Path,
    device: tch::Device,
    version: i64,
    tokenizer: &Tokenizer,
    endpoints: Endpoints<'_>,
) -> Result<(Arc<dyn RolloutPool>, Publisher), TrainError> {
    let urls = config.rollout.urls.clone();
    let timeout = Duration::from_secs_f64(config.rollout.timeout_secs);
    let retry_deadline = Duration::from_secs_f64(config.rollout.retry_deadline_secs);
    if urls.is_empty() {
        let model = match &config.lora {
            // The engine generates with adapters over the base, as the policy does: a
            // checkpoint's, or fresh ones, which compute the base until the first publish.
            Some(lora) => {
                let mut model = CausalLm::load(&config.model, device)?;
                match policy_dir != config.model {
                    true => model.load_lora(policy_dir)?,
                    false => model.attach_lora(lora, config.seed)?,
                }
                model
            }
            None => CausalLm::load(policy_dir, device)?,
        };
        let engine =
            EmbeddedEngine::spawn(model, tokenizer.clone(), config.rollout.max_batch, version, config.seed);
        let local = config.rollout.index.as_deref().map(open_index).transpose()?;
        // Called from blocking code on the runtime (an MCP server's tools are listed now).
        let ctx = tokio::runtime::Handle::current().block_on(Context::build(
            &config.rollout.context,
            &config.rollout.env,
            Arc::new(engine.clone()),
            &config.model,
            local,
        ))?;
        let metrics = RolloutMetrics::new(endpoints.registry);
        return Ok((Arc::new(InProcessPool::new(ctx, Some(metrics))), Publisher::InProcess(engine)));
    }
    let publisher = match &config.weight_sync {
        WeightSync::HttpPull { advertise_url } => {
            let token = endpoints.serving.token;
            let url = advertise_url.clone().unwrap_or(endpoints.serving.advertise_url);
            let from = PullFrom::new(url, config.lora.clone());
            // Requests in flight name at most `max_staleness` versions before the newest.
            let keep = usize::try_from(config.rollout.max_staleness).unwrap_or(usize::MAX);
            let dir = config.output_dir.join("weights");
            let publisher = Publisher::http_pull(
                urls.clone(),
                from.clone(),
                dir,
                endpoints.weights,
                keep.saturating_add(1),
                token.as_ref(),
            );
            let pool = RemotePool::new(urls, Some(from), timeout, retry_deadline, token.as_ref());
            return Ok((Arc::new(pool), publisher));
        }
        WeightSync::SglangDisk { path, urls: servers } | WeightSync::VllmDisk { path, urls: servers } => {
            let (server, _) = config.weight_sync.servers().expect("a disk sync updates servers");
            let interrupt = config.rollout.interruptible;
            Publisher::disk(server, path.clone(), servers.clone(), config.model.clone(), interrupt)
        }
        WeightSync::SglangBroadcast {
            urls: servers,
            master_address,
            master_port,
            bucket_mb,
            timeout_secs,
        }
        | WeightSync::VllmBroadcast { urls: servers, master_address, master_port, bucket_mb, timeout_secs } =>
        {
            let (server, _) = config.weight_sync.servers().expect("a broadcast updates servers");
            let broadcast = BroadcastConfig {
                server,
                urls: servers.clone(),
                master_address: master_address.clone().unwrap_or(endpoints.serving.host),
                master_port: *master_port,
                bucket_bytes: (bucket_mb * (1 << 20) as f64) as usize,
                timeout: Duration::from_secs_f64(*timeout_secs),
                interrupt: config.rollout.interruptible,
            };
            Publisher::Broadcast(Broadcaster::new(broadcast, device))
        }
    };
    // Workers of SGLang or vLLM servers: no weights to name in requests.
    let pool = RemotePool::new(urls, None, timeout, retry_deadline, endpoints.serving.token.as_ref());
    Ok((Arc::new(pool), publisher))
}

/// The local index in `dir` as a search tool searched in this process.
fn open_index(dir: &Path) -> Result<Arc<dyn kart_core::tool::Search>, TrainError> {
    InProcess::open(dir)
        .map_err(|source| TrainError::Index { path: dir.to_path_buf(), source: Box::new(source) })
}

/// The run's logs: `metrics.jsonl`, and `rollouts.jsonl` with `dump_rollouts`, restarted after
/// step `resumed` (empty for a new run).
fn open_outputs(
    config: &TrainConfig,
    tokenizer: &Tokenizer,
    resumed: Option<u64>,
) -> Result<(MetricsLog, Option<RolloutDump>), TrainError> {
    let metrics_path = config.output_dir.join("metrics.jsonl");
    let log = MetricsLog::new(&metrics_path);
    log.restart(resumed).map_err(|source| TrainError::Io { path: metrics_path, source })?;
    let dump_path = config.output_dir.join(super::dump::FILE);
    super::metrics::restart(&dump_path, resumed)
        .map_err(|source| TrainError::Io { path: dump_path.clone(), source })?;
    Ok((log, config.dump_rollouts.then(|| RolloutDump::new(&dump_path, tokenizer.clone()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolError;
    use futures::stream::{self, BoxStream};
    use kart_core::agent::trajectory::Trajectory;
    use kart_core::config::train::BatchConfig;

    /// A pool whose groups have rewards without variance for prompts with an even index
    /// (`p0`, `p2`, …), and 0/1 rewards otherwise; it counts the prompts asked for.
    #[derive(Default)]
    struct Scripted {
        asked: Mutex<usize>,
    }

    impl RolloutPool for Scripted {
        fn rollout(&self, request: RolloutRequest) -> BoxStream<'static, Result<Group, PoolError>> {
            *self.asked.lock().unwrap() += request.prompts.len();
            let groups: Vec<_> = request
                .prompts
                .iter()
                .map(|task| {
                    let index: usize =
                        task.id.trim_start_matches('p').split('~').next().unwrap().parse().unwrap();
                    let trajectories = (0..request.n)
                        .map(|i| {
                            let mut t = Trajectory::new(format!("{}-{i}", task.id), task.id.clone(), &[1, 2]);
                            t.reward = if index.is_multiple_of(2) { 1.0 } else { (i % 2) as f64 };
                            t
                        })
                        .collect();
                    Ok(Group { prompt_id: task.id.clone(), data_source: "nq".into(), trajectories })
                })
                .collect();
            Box::pin(stream::iter(groups))
        }
    }

    fn collector(pool: Arc<Scripted>, filter_groups: bool) -> Collector {
        let mut config = TrainConfig {
            batch: BatchConfig { prompts: 4, n: 2, mini_batch_prompts: 4, ..BatchConfig::default() },
            ..TrainConfig::default()
        };
        config.algorithm.filter_groups = filter_groups;
        let prompts = (0..40)
            .map(|i| Task {
                id: format!("p{i}"),
                messages: None,
                prompt: Some("q".into()),
                ground_truth: vec!["a".into()],
                data_source: "nq".into(),
                tools: None,
            })
            .collect();
        Collector {
            pool,
            prompts: Arc::new(prompts),
            sampler: Arc::new(Mutex::new(Sampler::new(3))),
            config: Arc::new(config),
            replay: None,
        }
    }

    /// Half the prompts give groups without variance: with `filter_groups` they are dropped and
    /// the batch refilled by over-sampling (twice what is missing per round), every kept group has
    /// variance, and the counts add up; without it they are kept.
    #[test]
    fn a_batch_records_reward_parts_and_each_roles_reward() {
        let trajectory = |role: Option<&str>, reward: f64, status: Status| {
            let mut t = Trajectory::new("t", "p", &[1]);
            t.push_model(&[2], &[-0.1], 0).unwrap();
            (t.reward, t.status, t.stats.role) = (reward, status, role.map(str::to_owned));
            t.stats.reward_scores.insert("rule".into(), reward / 2.0);
            t
        };
        let batch = [
            trajectory(Some("solver"), 1.0, Status::Completed),
            trajectory(Some("solver"), 0.0, Status::Completed),
            trajectory(Some("selector"), 1.2, Status::Truncated),
            trajectory(Some("selector"), 0.0, Status::Aborted),
        ];
        let r = batch_record(
            &batch.iter().collect::<Vec<_>>(),
            0,
            &TrainerMetrics::new(&prometheus::Registry::new()),
        );
        assert_eq!(r.get(&keys::role_reward("solver")), Some(0.5));
        assert_eq!(r.get(&keys::role_reward("selector")), Some(1.2), "aborted trajectories are not scored");
        assert_eq!(r.get(&keys::reward_part("rule")), Some((0.5 + 0.6) / 3.0));
    }

    #[tokio::test]
    async fn filtered_groups_are_replaced_by_over_sampling() {
        let pool = Arc::new(Scripted::default());
        let batch = collector(pool.clone(), true).collect(0, 0).await.unwrap();
        assert_eq!(batch.groups.len(), 4);
        assert!(batch.groups.iter().all(has_variance), "a kept group without variance");
        assert!(batch.filtered > 0);
        let asked = *pool.asked.lock().unwrap();
        assert_eq!(batch.generated, asked, "every group the pool made is counted");
        assert!(batch.generated >= batch.groups.len() + batch.filtered);
        assert!(asked > 4, "it over-sampled");

        let pool = Arc::new(Scripted::default());
        let batch = collector(pool.clone(), false).collect(0, 0).await.unwrap();
        assert_eq!((batch.groups.len(), batch.filtered, batch.generated), (4, 0, 4));
        assert!(batch.groups.iter().any(|g| !has_variance(g)), "kept as they came");
    }
}
