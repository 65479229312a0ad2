//! The training loop: ask the pool for groups (keeping at most `max_staleness` versions in
//! flight), update, publish weights, evaluate, checkpoint.

use super::batch::Sample;
use super::checkpoint::{self, Parts, TrainerState};
use super::config::{AdvantageEstimator, TrainConfig, WeightSync};
use super::critic::Critic;
use super::data::{Dataset, Prompt, Sampler};
use super::dump::RolloutDump;
use super::eval::{self, Evaluation, Report, Scored};
use super::metrics::{MetricsLog, StepRecord, TrainerMetrics};
use super::optim::AdamW;
use super::pool::{InProcessPool, RemotePool, RolloutPool, RolloutRequest};
use super::server::{Phase, StatusHandle};
use super::update::Learner;
use super::weights::{Publisher, PullFrom, WeightStore};
use crate::agent::trajectory::{Status, Trajectory};
use crate::model::{CausalLm, ChatTemplate, ModelError, SamplingParams, Tokenizer, save_pretrained};
use crate::retriever::docstore::Manifest;
use crate::rollout::embedded::EmbeddedEngine;
use crate::rollout::env::{Context, EnvConfig};
use crate::rollout::group::Group;
use crate::rollout::metrics::RolloutMetrics;
use crate::rollout::retry::RetryPolicy;
use crate::rollout::task::Task;
use crate::tools::python::{PythonSandbox, SandboxConfig};
use crate::tools::search::{CachedSearch, HttpRetriever, InProcess};
use futures::StreamExt;
use prometheus::Registry;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tch::Device;

/// Why a run could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Data(#[from] super::data::DataError),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Sync(#[from] super::weights::SyncError),
    #[error("step {step}: {reason}")]
    Rollout { step: u64, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "output_dir {dir}: holds an earlier run ({what}); pass --resume to continue it, or choose an empty output_dir"
    )]
    EarlierRun { dir: PathBuf, what: String },
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

/// A batch of groups for one step.
struct Batch {
    groups: Vec<Group>,
    failed: usize,
    filtered: usize,
    cursor: Sampler,
    rollout_secs: f64,
}

/// What a rollout request needs, shareable with the task that makes it.
#[derive(Clone)]
struct Collector {
    pool: Arc<dyn RolloutPool>,
    prompts: Arc<Vec<Task>>,
    sampler: Arc<Mutex<Sampler>>,
    env: EnvConfig,
    config: Arc<TrainConfig>,
}

/// Rounds of over-sampling to refill a batch whose groups were filtered out.
const FILTER_ROUNDS: usize = 4;

impl Collector {
    async fn collect(self, step: u64, version: i64) -> Result<Batch, TrainError> {
        let c = &self.config;
        let started = Instant::now();
        let needed = c.batch.prompts;
        let (mut groups, mut failed, mut filtered, mut last_error) = (Vec::new(), 0, 0, String::new());
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
                tasks: unique_tasks(indices.iter().map(|&i| &self.prompts[i])),
                n: c.batch.n,
                sampling: sampling(c, seed_of(c.seed, step, round)),
                policy_version: version,
                env: self.env.clone(),
            };
            let mut stream = self.pool.rollout(request);
            while let Some(item) = stream.next().await {
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
        Ok(Batch { groups, failed, filtered, cursor, rollout_secs: started.elapsed().as_secs_f64() })
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

/// A dataset's prompts as rollout tasks.
fn tasks(dataset: &Dataset) -> Result<Vec<Task>, TrainError> {
    dataset
        .prompts
        .iter()
        .map(|p: &Prompt| {
            serde_json::to_value(p)
                .and_then(serde_json::from_value)
                .map_err(|e| TrainError::Config(format!("prompt `{}`: {e}", p.id)))
        })
        .collect()
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
    status: StatusHandle,
    checkpoint: Option<PathBuf>,
    remote: bool,
}

impl Trainer {
    /// Loads data, models and optimiser state (from the newest checkpoint when `resume`; without
    /// it, an output folder holding an earlier run is refused), and connects the pool.
    /// `advertise_url` is where workers reach this trainer's `/weights`.
    pub fn build(
        config: TrainConfig,
        resume: bool,
        registry: &Registry,
        status: StatusHandle,
        weights: WeightStore,
        advertise_url: String,
    ) -> Result<Trainer, TrainError> {
        config.validate().map_err(|e| TrainError::Config(e.to_string()))?;
        let env: EnvConfig = serde_json::from_value(config.rollout.env.clone())
            .map_err(|e| TrainError::Config(format!("rollout.env: {e}")))?;
        let device = match config.device.as_str() {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(0),
            _ => Device::cuda_if_available(),
        };
        let out = config.output_dir.clone();
        std::fs::create_dir_all(&out).map_err(|source| TrainError::Io { path: out.clone(), source })?;
        let train = tasks(&Dataset::train(&config.data)?)?;
        let test = match Dataset::test(&config.data, config.eval.max_prompts)? {
            Some(d) => tasks(&d)?,
            None => Vec::new(),
        };

        let checkpoints = out.join("checkpoints");
        let loaded = if resume {
            checkpoint::latest(&checkpoints).map(|d| checkpoint::load(&d)).transpose()?
        } else {
            refuse_earlier_run(&out)?;
            None
        };
        let policy_dir = loaded.as_ref().map_or_else(|| config.model.clone(), checkpoint::Loaded::policy_dir);
        let tokenizer = Tokenizer::load(&config.model)?;
        let policy = CausalLm::load(&policy_dir, device)?;
        let reference = match config.algorithm.kl_loss {
            Some(_) => {
                let mut r = CausalLm::load(&config.model, device)?;
                r.var_store_mut().freeze();
                Some(r)
            }
            None => None,
        };
        let mut optimizer = AdamW::new(policy.named_tensors(), config.optim.clone());
        let critic = match config.algorithm.advantage {
            AdvantageEstimator::Gae => {
                let mut critic = Critic::load(&config.model, device, config.seed)?;
                let mut opt = AdamW::new(critic.parameters(), config.critic.optim.clone());
                if let Some(l) = &loaded {
                    let origin = l.dir.join("critic.safetensors");
                    let tensors = l.critic.as_ref().ok_or_else(|| {
                        TrainError::Config(format!(
                            "{}: a PPO run needs the critic's checkpoint",
                            origin.display()
                        ))
                    })?;
                    critic.load_parameters(tensors, &origin)?;
                    if let Some(state) = &l.critic_optimizer {
                        opt.load_state(copy(state), l.state.critic_optimizer_steps.unwrap_or(0))
                            .map_err(|e| TrainError::Config(e.to_string()))?;
                    }
                }
                Some((critic, opt))
            }
            _ => None,
        };
        let (mut step, mut version, mut sampler) = (0, 0, Sampler::new(config.seed));
        if let Some(l) = &loaded {
            optimizer
                .load_state(copy(&l.optimizer), l.state.optimizer_steps)
                .map_err(|e| TrainError::Config(e.to_string()))?;
            sampler = serde_json::from_value(l.state.data_cursor.clone())
                .map_err(|e| TrainError::Config(format!("{}: data cursor: {e}", l.dir.display())))?;
            (step, version) = (l.state.step, l.state.policy_version);
            tracing::info!(checkpoint = %l.dir.display(), step, "resuming");
        }

        let remote = !config.rollout.urls.is_empty();
        let (pool, publisher): (Arc<dyn RolloutPool>, Publisher) = if remote {
            let urls = config.rollout.urls.clone();
            let timeout = Duration::from_secs_f64(config.rollout.timeout_secs);
            match &config.weight_sync {
                WeightSync::HttpPull { advertise_url: advertised } => {
                    let from = PullFrom::new(advertised.clone().unwrap_or(advertise_url));
                    // Requests in flight name at most `max_staleness` versions before the newest.
                    let keep = usize::try_from(config.rollout.max_staleness).unwrap_or(usize::MAX);
                    let publisher = Publisher::http_pull(
                        urls.clone(),
                        from.clone(),
                        out.join("weights"),
                        weights,
                        keep.saturating_add(1),
                    );
                    (Arc::new(RemotePool::new(urls, Some(from), timeout)), publisher)
                }
                WeightSync::SglangDisk { path, urls: servers } => (
                    Arc::new(RemotePool::new(urls, None, timeout)),
                    Publisher::sglang_disk(path.clone(), servers.clone(), config.model.clone()),
                ),
            }
        } else {
            let engine_model = CausalLm::load(&policy_dir, device)?;
            let engine = EmbeddedEngine::spawn(
                engine_model,
                tokenizer.clone(),
                config.rollout.max_batch,
                version,
                config.seed,
            );
            let ctx = in_process_context(&config, &env, engine.clone(), tokenizer.clone())?;
            (
                Arc::new(InProcessPool::new(ctx, Some(RolloutMetrics::new(registry)))),
                Publisher::InProcess(engine),
            )
        };

        let log = MetricsLog::new(&out.join("metrics.jsonl"));
        let resumed = loaded.as_ref().map(|l| l.state.step);
        log.restart(resumed).map_err(|source| TrainError::Io { path: out.join("metrics.jsonl"), source })?;
        let dump_path = out.join("rollouts.jsonl");
        super::metrics::restart(&dump_path, resumed)
            .map_err(|source| TrainError::Io { path: dump_path.clone(), source })?;
        let dump = config.dump_rollouts.then(|| RolloutDump::new(&dump_path, tokenizer.clone()));
        let config = Arc::new(config);
        status.update(|s| {
            s.total_steps = config.total_steps;
            s.step = step;
            s.policy_version = version;
            s.checkpoint = loaded.as_ref().map(|l| l.dir.display().to_string());
        });
        Ok(Trainer {
            learner: Learner { policy, optimizer, reference, critic },
            tokenizer,
            collector: Collector {
                pool,
                prompts: Arc::new(train),
                sampler: Arc::new(Mutex::new(sampler)),
                env,
                config: config.clone(),
            },
            publisher,
            test,
            step,
            version,
            cursor: sampler,
            metrics: TrainerMetrics::new(registry),
            log,
            dump,
            status,
            checkpoint: loaded.map(|l| l.dir),
            remote,
            config,
        })
    }

    /// Runs to `total_steps`; returns the summary. The status phase ends `finished` or `failed`.
    pub async fn run(mut self) -> Result<RunSummary, TrainError> {
        let result = self.run_inner().await;
        if let Err(e) = &result {
            self.status.update(|s| {
                s.phase = Phase::Failed;
                s.error = Some(e.to_string());
            });
        }
        result
    }

    async fn run_inner(&mut self) -> Result<RunSummary, TrainError> {
        let total = self.config.total_steps;
        if self.version > 0 || self.remote {
            self.publish().await?;
        }
        let first_eval = match self.step {
            0 => self.evaluate().await?,
            _ => None,
        };
        if let Some(report) = &first_eval {
            let mut record = StepRecord::default();
            record.set("step", 0.0);
            write_eval(&mut record, report);
            self.append(&record)?;
        }
        let mut last_eval = first_eval.clone();
        let mut in_flight = VecDeque::new();
        let mut next = self.step;
        let progress = crate::train::progress::bar("training", total, self.step);
        while self.step < total {
            while next < total && next - self.step <= self.config.rollout.max_staleness {
                let collector = self.collector.clone();
                in_flight.push_back(tokio::spawn(collector.collect(next, self.version)));
                next += 1;
            }
            let batch = in_flight
                .pop_front()
                .expect("a batch is in flight")
                .await
                .map_err(|e| TrainError::Rollout { step: self.step, reason: e.to_string() })??;
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
                self.save_checkpoint(&record).await?;
            }
            progress.set_position(step);
            progress.set_message(format!(
                "reward {:.3}{}",
                record.get("reward/mean").unwrap_or(f64::NAN),
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
        Ok(RunSummary {
            steps: self.step,
            first_eval,
            last_eval,
            model_dir,
            checkpoint: self.checkpoint.clone(),
        })
    }

    fn append(&self, record: &StepRecord) -> Result<(), TrainError> {
        let path = self.config.output_dir.join("metrics.jsonl");
        self.log.append(record).map_err(|source| TrainError::Io { path, source })
    }

    /// One step on `batch`: samples, update, weight sync, metrics.
    async fn train_step(&mut self, batch: Batch) -> Result<StepRecord, TrainError> {
        let started = Instant::now();
        let c = self.config.clone();
        let trajectories: Vec<&Trajectory> = batch.groups.iter().flat_map(|g| &g.trajectories).collect();
        let mut samples = Vec::new();
        for (gi, g) in batch.groups.iter().enumerate() {
            for t in &g.trajectories {
                if t.status != Status::Aborted {
                    samples.push(Sample::new(t, gi, c.algorithm.mask_observations));
                }
            }
        }
        let mut record = batch_record(&trajectories, self.version, &self.metrics);
        record.set("step", (self.step + 1) as f64);
        record.set("groups/failed", batch.failed as f64);
        record.set("groups/filtered", batch.filtered as f64);
        let tokens: usize = samples.iter().map(Sample::len).sum();
        let update_started = Instant::now();
        let step = self.step;
        let learner = &mut self.learner;
        let update = tokio::task::block_in_place(|| learner.step(&mut samples, &c, step));
        record.0.extend(update.0);
        let update_secs = update_started.elapsed().as_secs_f64();
        if let Some(dump) = &self.dump {
            dump.write(self.step + 1, &trajectories)
                .map_err(|source| TrainError::Io { path: c.output_dir.join("rollouts.jsonl"), source })?;
        }
        self.step += 1;
        self.version += 1;
        self.cursor = batch.cursor;
        let sync_started = Instant::now();
        self.publish().await?;
        let sync_secs = sync_started.elapsed().as_secs_f64();
        let total_secs = started.elapsed().as_secs_f64() + batch.rollout_secs;
        record.set("timing/rollout_s", batch.rollout_secs);
        record.set("timing/update_s", update_secs);
        record.set("timing/sync_s", sync_secs);
        record.set("timing/step_s", total_secs);
        record.set("tokens_per_second", tokens as f64 / (update_secs + batch.rollout_secs).max(1e-9));
        record.set("policy_version", self.version as f64);
        self.observe(&record, sync_secs);
        Ok(record)
    }
}

impl Trainer {
    /// Publishes the policy as the current version.
    async fn publish(&self) -> Result<(), TrainError> {
        let started = Instant::now();
        self.publisher.publish(&self.learner.policy, self.version).await?;
        self.metrics.weight_sync_seconds.observe(started.elapsed().as_secs_f64());
        self.metrics.policy_version.set(self.version as f64);
        self.status.update(|s| s.policy_version = self.version);
        Ok(())
    }

    /// The held-out evaluation: greedy, and sampled as in training when `eval.sampled_n` is set;
    /// `None` without a test split.
    async fn evaluate(&self) -> Result<Option<Evaluation>, TrainError> {
        if self.test.is_empty() {
            return Ok(None);
        }
        self.status.update(|s| s.phase = Phase::Evaluating);
        let argmax = SamplingParams { temperature: 0.0, top_p: 1.0, top_k: -1, seed: Some(self.config.seed) };
        let greedy = self.score_test(1, argmax).await?;
        // The run's seed at every evaluation: evaluations differ by the policy, not by the draw.
        // The passes run one after the other: run concurrently, timing would decide how the
        // engine batches them together, and batch shapes can change the logits' last bits.
        let sampled = match self.config.eval.sampled_n {
            0 => None,
            n => Some(self.score_test(n, sampling(&self.config, self.config.seed)).await?),
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
        Ok(Some(Evaluation { greedy, sampled }))
    }

    /// Rollouts of the held-out prompts, `n` per prompt, scored against their golden answers.
    async fn score_test(&self, n: usize, sampling: SamplingParams) -> Result<Report, TrainError> {
        let request = RolloutRequest {
            tasks: self.test.clone(),
            n,
            sampling,
            policy_version: self.version,
            env: self.collector.env.clone(),
        };
        let truth: HashMap<&str, &Task> = self.test.iter().map(|t| (t.id.as_str(), t)).collect();
        let mut stream = self.collector.pool.rollout(request);
        let mut scored = Vec::new();
        while let Some(item) = stream.next().await {
            let Ok(group) = item else { continue };
            let Some(task) = truth.get(group.prompt_id.as_str()) else { continue };
            for t in &group.trajectories {
                let response = self.tokenizer.decode(t.response_ids(), true)?;
                let (exact_match, f1) = eval::score_answer(&response, &task.ground_truth);
                scored.push(Scored {
                    data_source: task.data_source.clone(),
                    exact_match,
                    f1,
                    reward: t.reward,
                    tool_calls: f64::from(t.stats.total_tool_calls()),
                    valid_format: eval::answer_of(&response).is_some()
                        && t.stats.valid_actions >= t.stats.turns,
                });
            }
        }
        Ok(Report::new(&scored))
    }

    /// Writes the policy as a Hugging Face folder (tokenizer files from the base model).
    fn save_policy(&self, dir: &Path) -> Result<(), ModelError> {
        let policy = &self.learner.policy;
        save_pretrained(
            dir,
            policy.config(),
            &policy.named_tensors(),
            Some(&self.config.model),
            policy.kind(),
        )
    }

    /// Writes a checkpoint of the current step.
    async fn save_checkpoint(&mut self, record: &StepRecord) -> Result<(), TrainError> {
        self.status.update(|s| s.phase = Phase::Checkpointing);
        let state = TrainerState {
            step: self.step,
            policy_version: self.version,
            seed: self.config.seed,
            data_cursor: serde_json::to_value(self.cursor).expect("the cursor serialises"),
            optimizer_steps: self.learner.optimizer.steps(),
            critic_optimizer_steps: self.learner.critic.as_ref().map(|(_, o)| o.steps()),
        };
        let (optimizer, _) = self.learner.optimizer.state();
        let parts = Parts {
            state: &state,
            optimizer,
            critic: self.learner.critic.as_ref().map(|(c, _)| c.parameters()),
            critic_optimizer: self.learner.critic.as_ref().map(|(_, o)| o.state().0),
        };
        let root = self.config.output_dir.join("checkpoints");
        let dir = tokio::task::block_in_place(|| {
            checkpoint::save(&root, |d| self.save_policy(d), parts, self.config.checkpoint.keep)
        })?;
        tracing::info!(step = self.step, checkpoint = %dir.display(), reward = record.get("reward/mean"), "checkpoint written");
        self.metrics.checkpoints.inc();
        self.status.update(|s| {
            s.checkpoint = Some(dir.display().to_string());
            s.phase = Phase::Training;
        });
        self.checkpoint = Some(dir);
        Ok(())
    }

    /// Sets the Prometheus metrics from a step's record.
    fn observe(&self, r: &StepRecord, sync_secs: f64) {
        let m = &self.metrics;
        let get = |k: &str| r.get(k).unwrap_or(0.0);
        m.step.set(self.step as f64);
        m.reward.set(get("reward/mean"));
        m.kl.set(get("actor/kl"));
        m.entropy.set(get("actor/entropy"));
        m.clip_fraction.set(get("actor/clipfrac"));
        m.grad_norm.set(get("actor/grad_norm"));
        m.learning_rate.set(get("actor/lr"));
        m.tokens_per_second.set(get("tokens_per_second"));
        for (term, key) in [
            ("policy", "actor/pg_loss"),
            ("kl", "actor/kl"),
            ("entropy", "actor/entropy"),
            ("value", "critic/vf_loss"),
        ] {
            m.loss.with_label_values(&[term]).set(get(key));
        }
        let a = &self.config.algorithm;
        let total =
            get("actor/pg_loss") + a.kl_coef * get("actor/kl") - a.entropy_coef * get("actor/entropy");
        m.loss.with_label_values(&["total"]).set(total);
        for (phase, key) in
            [("rollout", "timing/rollout_s"), ("update", "timing/update_s"), ("total", "timing/step_s")]
        {
            m.step_seconds.with_label_values(&[phase]).observe(get(key));
        }
        m.step_seconds.with_label_values(&["sync"]).observe(sync_secs);
        m.last_step_timestamp.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        let reward = r.get("reward/mean");
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
    r.set("reward/mean", reward);
    r.set("reward/std", (mean(&|t| (t.reward - reward).powi(2))).sqrt());
    r.set("response/length_mean", mean(&|t| f64::from(t.stats.response_tokens)));
    r.set("turns/mean", mean(&|t| f64::from(t.stats.turns)));
    r.set(
        "actions/valid_ratio",
        mean(&|t| f64::from(t.stats.valid_actions) / f64::from(t.stats.turns.max(1))),
    );
    r.set("tools/calls_per_trajectory", mean(&|t| f64::from(t.stats.total_tool_calls())));
    let tools: std::collections::BTreeSet<&String> =
        scored.iter().flat_map(|t| t.stats.tool_calls.keys()).collect();
    for tool in tools {
        let calls = mean(&|t| t.stats.tool_calls.get(tool).map_or(0.0, |c| f64::from(c.ok + c.failed)));
        r.set(format!("tools/{tool}/calls_per_trajectory"), calls);
    }
    for status in [Status::Completed, Status::Truncated, Status::Aborted] {
        let count = trajectories.iter().filter(|t| t.status == status).count();
        let label =
            serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        metrics.trajectories.with_label_values(&[label.as_str()]).inc_by(count as u64);
        r.set(format!("trajectories/{label}"), count as f64);
    }
    let staleness: Vec<f64> =
        trajectories.iter().filter_map(|t| t.oldest_version()).map(|v| (version - v).max(0) as f64).collect();
    for s in &staleness {
        metrics.staleness.observe(*s);
    }
    r.set("staleness/mean", staleness.iter().sum::<f64>() / staleness.len().max(1) as f64);
    r.set("staleness/max", staleness.iter().copied().fold(0.0, f64::max));
    r
}

/// Adds an evaluation's figures to a record.
fn write_eval(r: &mut StepRecord, evaluation: &Evaluation) {
    let reports = std::iter::once(("eval", &evaluation.greedy))
        .chain(evaluation.sampled.as_ref().map(|s| ("eval_sampled", s)));
    for (prefix, report) in reports {
        r.set(format!("{prefix}/trajectories"), report.all.count as f64);
        r.set(format!("{prefix}/exact_match"), report.all.exact_match);
        r.set(format!("{prefix}/f1"), report.all.f1);
        r.set(format!("{prefix}/reward"), report.all.reward);
        r.set(format!("{prefix}/tool_calls"), report.all.tool_calls);
        r.set(format!("{prefix}/valid_format"), report.all.valid_format);
        for (source, s) in &report.by_source {
            r.set(format!("{prefix}/{source}/exact_match"), s.exact_match);
            r.set(format!("{prefix}/{source}/f1"), s.f1);
            r.set(format!("{prefix}/{source}/reward"), s.reward);
        }
    }
}

/// Deep copies of named tensors.
fn copy(tensors: &[(String, tch::Tensor)]) -> Vec<(String, tch::Tensor)> {
    tensors.iter().map(|(n, t)| (n.clone(), t.copy())).collect()
}

/// The context of an in-process pool: the embedded engine and the configured tools.
fn in_process_context(
    config: &TrainConfig,
    env: &EnvConfig,
    engine: EmbeddedEngine,
    tokenizer: Tokenizer,
) -> Result<Context, TrainError> {
    let timeout = Duration::from_secs(30);
    let http = config.rollout.retriever_url.as_deref().map(|url| Arc::new(HttpRetriever::new(url, timeout)));
    let search: Option<Arc<dyn crate::tools::search::Search>> = match (&config.rollout.index, &http) {
        (Some(dir), _) => {
            let manifest =
                Manifest::read(dir).map_err(|e| TrainError::Config(format!("rollout.index: {e}")))?;
            let retriever = crate::retriever::config::RetrieverConfig {
                index: Some(dir.clone()),
                method: manifest.method,
                ..Default::default()
            };
            match crate::retriever::server::Backend::open(&retriever, &Registry::new())
                .map_err(|e| TrainError::Config(format!("rollout.index: {e}")))?
            {
                crate::retriever::server::Backend::Local(index) => Some(Arc::new(InProcess(index))),
                _ => return Err(TrainError::Config("rollout.index: not a local index".into())),
            }
        }
        (None, Some(h)) => Some(h.clone()),
        (None, None) => None,
    };
    let python = match env {
        EnvConfig::Tir(_) => Some(Arc::new(
            PythonSandbox::new(SandboxConfig::default())
                .map_err(|e| TrainError::Config(format!("python: {e}")))?,
        )),
        _ => None,
    };
    Ok(Context {
        engine: Arc::new(engine),
        tokenizer: tokenizer.clone(),
        chat_template: ChatTemplate::load(&config.model)?,
        search: search.map(|s| Arc::new(CachedSearch::new(s, 10_000, 64)) as Arc<_>),
        access: http.map(|h| h as Arc<_>),
        python,
        retry: RetryPolicy::default(),
    })
}
