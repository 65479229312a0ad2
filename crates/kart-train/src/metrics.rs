//! The trainer's metrics: Prometheus gauges and histograms for dashboards, and one JSON line per
//! step in `metrics.jsonl` (flat keys such as `reward/mean`, `actor/kl`, `eval/exact_match`) for
//! `kart plot` and offline analysis.

use crate::record::{StepRecord, keys};
use kart_http::metrics;
use prometheus::{Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, Registry};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The trainer's Prometheus metrics.
#[derive(Clone)]
pub struct TrainerMetrics {
    pub step: Gauge,
    pub world_size: Gauge,
    pub reward: Gauge,
    pub eval_exact_match: GaugeVec,
    pub eval_f1: GaugeVec,
    pub eval_reward: GaugeVec,
    pub eval_sampled_reward: GaugeVec,
    pub loss: GaugeVec,
    pub kl: GaugeVec,
    pub entropy: Gauge,
    pub clip_fraction: Gauge,
    pub grad_norm: Gauge,
    pub learning_rate: Gauge,
    pub tokens_per_second: Gauge,
    pub step_seconds: HistogramVec,
    pub policy_version: Gauge,
    pub staleness: Histogram,
    pub weight_sync_seconds: HistogramVec,
    pub weight_sync_replicas: Gauge,
    pub replica_version_lag: GaugeVec,
    pub weight_sync_bytes: IntCounter,
    pub trajectories: IntCounterVec,
    pub checkpoints: IntCounter,
    pub last_step_timestamp: Gauge,
}

impl TrainerMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let r = registry;
        let seconds =
            vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];
        TrainerMetrics {
            step: metrics::float_gauge(r, "kart_trainer_step", "Optimisation steps completed"),
            reward: metrics::float_gauge(
                r,
                "kart_trainer_reward",
                "Mean reward of the last step's trajectories",
            ),
            eval_exact_match: metrics::gauge_vec(
                r,
                "kart_trainer_eval_exact_match",
                "Exact match of the last evaluation (greedy), by data source (`all` for the whole split)",
                &["data_source"],
            ),
            eval_f1: metrics::gauge_vec(
                r,
                "kart_trainer_eval_f1",
                "Token F1 of the last evaluation, by data source",
                &["data_source"],
            ),
            eval_reward: metrics::gauge_vec(
                r,
                "kart_trainer_eval_reward",
                "Mean reward of the last evaluation (greedy), by data source",
                &["data_source"],
            ),
            eval_sampled_reward: metrics::gauge_vec(
                r,
                "kart_trainer_eval_sampled_reward",
                "Mean reward of the last evaluation's trajectories sampled as in training, by data source",
                &["data_source"],
            ),
            loss: metrics::gauge_vec(
                r,
                "kart_trainer_loss",
                "Loss terms of the last step (policy, kl, entropy, value, total)",
                &["term"],
            ),
            kl: metrics::gauge_vec(
                r,
                "kart_trainer_kl",
                "Mean KL estimate to the reference policy (absent without a KL loss)",
                &[],
            ),
            entropy: metrics::float_gauge(r, "kart_trainer_entropy", "Mean per-token entropy of the policy"),
            clip_fraction: metrics::float_gauge(
                r,
                "kart_trainer_clip_fraction",
                "Share of trained tokens whose ratio was clipped",
            ),
            grad_norm: metrics::float_gauge(
                r,
                "kart_trainer_grad_norm",
                "Policy gradient norm before clipping",
            ),
            learning_rate: metrics::float_gauge(r, "kart_trainer_learning_rate", "Policy learning rate"),
            tokens_per_second: metrics::float_gauge(
                r,
                "kart_trainer_tokens_per_second",
                "Trajectory tokens processed per second of the last step",
            ),
            step_seconds: metrics::histogram_vec(
                r,
                "kart_trainer_step_seconds",
                "Wall time of a step by phase (rollout, update, sync, total)",
                &["phase"],
                seconds.clone(),
            ),
            policy_version: metrics::float_gauge(r, "kart_trainer_policy_version", "Newest policy version"),
            world_size: metrics::float_gauge(
                r,
                "kart_trainer_world_size",
                "Trainer processes (data-parallel ranks) of the run",
            ),
            staleness: metrics::histogram(
                r,
                "kart_trainer_staleness",
                "Policy versions a trained trajectory lagged behind the trainer",
                vec![0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0],
            ),
            weight_sync_seconds: metrics::histogram_vec(
                r,
                "kart_trainer_weight_sync_seconds",
                "Time to publish new weights to the rollout engines, by method (in_process, http_pull, sglang_disk, sglang_broadcast)",
                &["method"],
                seconds,
            ),
            replica_version_lag: metrics::gauge_vec(
                r,
                "kart_trainer_replica_version_lag",
                "Policy versions an SGLang replica's weights lag behind the published ones, by replica",
                &["replica"],
            ),
            weight_sync_replicas: metrics::float_gauge(
                r,
                "kart_trainer_weight_sync_replicas",
                "Rollout engines (inference replicas, or workers a push reached) that took the last publish",
            ),
            weight_sync_bytes: metrics::counter(
                r,
                "kart_trainer_weight_sync_bytes_total",
                "Bytes of weights written or copied for the rollout engines",
            ),
            trajectories: metrics::counter_vec(
                r,
                "kart_trainer_trajectories_total",
                "Trajectories received, by status (completed, truncated, aborted, failed)",
                &["status"],
            ),
            checkpoints: metrics::counter(r, "kart_trainer_checkpoints_total", "Checkpoints written"),
            last_step_timestamp: metrics::float_gauge(
                r,
                "kart_trainer_last_step_timestamp_seconds",
                "Unix time the last step finished",
            ),
        }
    }
}

/// Appends step records to a JSON-lines file.
pub struct MetricsLog {
    path: PathBuf,
}

impl MetricsLog {
    /// A log at `path` (created on the first record).
    pub fn new(path: &Path) -> Self {
        MetricsLog { path: path.to_path_buf() }
    }

    /// Keeps the records of a run resumed at step `resumed` up to that step (it rewrites the
    /// steps after its checkpoint), and none when it starts at step 0 (`None`), as a run asked to
    /// resume that finds no checkpoint does: its records before the crash, the evaluation before
    /// step 1 included, are written again.
    pub fn restart(&self, resumed: Option<u64>) -> std::io::Result<()> {
        restart(&self.path, resumed)
    }

    /// Appends one record.
    pub fn append(&self, record: &StepRecord) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
        writeln!(file, "{}", record.to_json())
    }
}

/// Keeps only the lines of a JSON-lines file whose `step` is at most `resumed`, none when it is
/// `None` (see [`MetricsLog::restart`]); a missing file is left missing.
pub fn restart(path: &Path, resumed: Option<u64>) -> std::io::Result<()> {
    let Some(step) = resumed else {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get(keys::STEP.name()).and_then(Value::as_f64))
                .is_some_and(|s| s <= step as f64)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(path, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_run_keeps_the_steps_through_its_checkpoint_and_a_new_run_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let log = MetricsLog::new(&path);
        let write_run = || {
            for step in 0..=3 {
                let mut r = StepRecord::default();
                r.set(keys::STEP, step as f64);
                r.set(keys::REWARD_MEAN, f64::NAN);
                log.append(&r).unwrap();
            }
        };
        write_run();
        log.restart(Some(2)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "steps 0, 1 and 2: {text}");
        assert!(text.contains(r#""reward/mean":null"#), "{text}");
        // A new run in the same folder: not even the earlier run's step 0 stays.
        log.restart(None).unwrap();
        assert!(!path.exists());
        log.restart(None).unwrap();
        write_run();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 4);
    }

    #[test]
    fn all_names_register() {
        let registry = Registry::new();
        let m = TrainerMetrics::new(&registry);
        m.loss.with_label_values(&["policy"]).set(1.0);
        m.staleness.observe(1.0);
        let text = kart_http::metrics::encode(&registry);
        assert!(text.contains("kart_trainer_loss{term=\"policy\"} 1"), "{text}");
    }
}
