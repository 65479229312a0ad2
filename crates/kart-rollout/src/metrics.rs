//! The rollout's metrics, labelled by environment (and tool): trajectories and their outcome,
//! reward, tool calls, turns, response tokens, latency, policy version, weight loads.

use kart_core::agent::trajectory::{Status, Trajectory};
use kart_http::metrics;
use prometheus::{HistogramVec, IntCounterVec, IntGauge, Registry};

/// Metrics of one rollout worker (or of the in-process rollout of `kart local`).
#[derive(Clone)]
pub struct RolloutMetrics {
    trajectories: IntCounterVec,
    reward: HistogramVec,
    tool_calls: IntCounterVec,
    turns: HistogramVec,
    valid_actions: HistogramVec,
    response_tokens: HistogramVec,
    latency: HistogramVec,
    /// Trajectories being rolled out now.
    pub in_flight: IntGauge,
    /// The newest policy version that produced tokens.
    pub policy_version: IntGauge,
    /// Weight loads of the embedded engine by trigger (push, pull) and outcome (ok, error).
    pub weight_loads: IntCounterVec,
}

impl RolloutMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Self {
        let counts = vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0];
        let tokens =
            vec![16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0];
        let ratio = vec![0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
        RolloutMetrics {
            trajectories: metrics::counter_vec(
                registry,
                "kart_rollout_trajectories_total",
                "Finished trajectories by environment and status (completed, truncated, aborted)",
                &["env", "status"],
            ),
            reward: metrics::histogram_vec(
                registry,
                "kart_rollout_reward",
                "Reward of finished (not aborted) trajectories",
                &["env"],
                vec![-1.0, -0.5, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0],
            ),
            tool_calls: metrics::counter_vec(
                registry,
                "kart_rollout_tool_calls_total",
                "Tool calls by environment, tool and outcome (ok, failed)",
                &["env", "tool", "outcome"],
            ),
            turns: metrics::histogram_vec(
                registry,
                "kart_rollout_turns",
                "Model turns per trajectory",
                &["env"],
                counts,
            ),
            valid_actions: metrics::histogram_vec(
                registry,
                "kart_rollout_valid_action_ratio",
                "Share of a trajectory's turns that parsed as a valid action",
                &["env"],
                ratio,
            ),
            response_tokens: metrics::histogram_vec(
                registry,
                "kart_rollout_response_tokens",
                "Model-generated tokens per trajectory",
                &["env"],
                tokens,
            ),
            latency: metrics::histogram_vec(
                registry,
                "kart_rollout_trajectory_seconds",
                "Wall time of one trajectory",
                &["env"],
                metrics::latency_buckets(),
            ),
            in_flight: metrics::gauge(registry, "kart_rollout_in_flight", "Trajectories being rolled out"),
            policy_version: metrics::gauge(
                registry,
                "kart_rollout_policy_version",
                "Newest policy version seen in outputs",
            ),
            weight_loads: metrics::counter_vec(
                registry,
                "kart_rollout_weight_loads_total",
                "Weight loads of the embedded engine by trigger (push, pull) and outcome (ok, error)",
                &["trigger", "outcome"],
            ),
        }
    }

    /// Records a finished trajectory of environment `env`.
    pub fn observe(&self, env: &str, t: &Trajectory) {
        // Every status of the environment has a series (0 until one ends so), so the share that
        // ended truncated or aborted is 0 rather than absent.
        for (status, name) in
            [(Status::Completed, "completed"), (Status::Truncated, "truncated"), (Status::Aborted, "aborted")]
        {
            let counter = self.trajectories.with_label_values(&[env, name]);
            if status == t.status {
                counter.inc();
            }
        }
        if t.status != Status::Aborted {
            self.reward.with_label_values(&[env]).observe(t.reward);
        }
        for (tool, calls) in &t.stats.tool_calls {
            self.tool_calls.with_label_values(&[env, tool, "ok"]).inc_by(calls.ok as u64);
            self.tool_calls.with_label_values(&[env, tool, "failed"]).inc_by(calls.failed as u64);
        }
        self.turns.with_label_values(&[env]).observe(t.stats.turns as f64);
        if t.stats.turns > 0 {
            self.valid_actions
                .with_label_values(&[env])
                .observe(t.stats.valid_actions as f64 / t.stats.turns as f64);
        }
        self.response_tokens.with_label_values(&[env]).observe(t.stats.response_tokens as f64);
        self.latency.with_label_values(&[env]).observe(t.stats.latency_ms as f64 / 1000.0);
        if let Some(v) = t.versions().iter().max().copied().filter(|&v| v > self.policy_version.get()) {
            self.policy_version.set(v);
        }
    }
}
