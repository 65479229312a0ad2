//! The trajectory: one multi-turn episode as the trainer consumes it.
//!
//! A trajectory is a single token sequence: the prompt, then model turns interleaved with
//! environment text (observations, hints, tool errors). Every token carries a loss mask (1 for tokens
//! the policy sampled, 0 for prompt and environment tokens), the log-probability the engine reported
//! when sampling it (0 for tokens it did not sample) and the policy version that sampled it (-1 for
//! the others). The per-token vectors always have the same length: segments are appended through
//! methods that keep them aligned, and a deserialised trajectory is checked.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Policy version recorded for tokens no policy sampled (prompt and environment tokens).
pub const NO_VERSION: i64 = -1;

/// How an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The agent answered, or used its turns and stopped on its own.
    #[default]
    Completed,
    /// A length limit cut the episode (token cap or max new tokens on the last turn).
    Truncated,
    /// The engine failed after retries; the trajectory must not be scored as a normal outcome.
    Aborted,
}

/// Calls of one tool in one trajectory, by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolCalls {
    pub ok: u32,
    pub failed: u32,
}

/// Per-trajectory statistics reported with the trajectory and aggregated into metrics.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Model generations in the episode.
    pub turns: u32,
    /// Turns whose output parsed as a valid action.
    pub valid_actions: u32,
    /// Tool calls by tool name (`search`, `access`, `python`, `calculator`, …).
    pub tool_calls: BTreeMap<String, ToolCalls>,
    /// Tokens the model generated (loss-mask 1 tokens).
    pub response_tokens: u32,
    /// Environment tokens appended (observations, hints, tool output).
    pub env_tokens: u32,
    /// Wall time of the episode in milliseconds.
    pub latency_ms: u64,
    /// The parts of the reward when reward services took part: `rule` (the environment's own),
    /// each service's score by name, and `{service}/{metric}` for metrics a service reported.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_scores: BTreeMap<String, f64>,
    /// The workflow role that produced the trajectory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

impl Stats {
    /// Counts one call of `tool` with its outcome.
    pub fn record_tool_call(&mut self, tool: &str, ok: bool) {
        let calls = self.tool_calls.entry(tool.to_string()).or_default();
        if ok {
            calls.ok += 1;
        } else {
            calls.failed += 1;
        }
    }

    /// Total tool calls over all tools.
    pub fn total_tool_calls(&self) -> u32 {
        self.tool_calls.values().map(|c| c.ok + c.failed).sum()
    }
}

/// A per-token vector whose length disagrees with `token_ids`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrajectoryError {
    #[error("trajectory `{id}`: field `{field}` has {got} entries but `token_ids` has {expected}")]
    LengthMismatch { id: String, field: &'static str, expected: usize, got: usize },
    #[error("trajectory `{id}`: `prompt_len` {prompt_len} exceeds the {len} tokens of the trajectory")]
    PromptTooLong { id: String, prompt_len: usize, len: usize },
    #[error("trajectory `{id}`: `loss_mask[{index}]` is {value}; only 0 and 1 are allowed")]
    BadMask { id: String, index: usize, value: u8 },
}

/// One episode: tokens with loss mask, sampling log-probabilities and policy versions, plus the
/// outcome. See the module documentation for the invariants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawTrajectory")]
pub struct Trajectory {
    /// Unique id of this trajectory.
    pub id: String,
    /// Id of the prompt it answers; trajectories of one prompt form a group.
    pub prompt_id: String,
    /// Number of prompt tokens at the start of `token_ids`.
    prompt_len: usize,
    token_ids: Vec<u32>,
    loss_mask: Vec<u8>,
    logprobs: Vec<f32>,
    versions: Vec<i64>,
    /// The scalar outcome reward.
    pub reward: f64,
    /// How the episode ended.
    pub status: Status,
    /// Per-trajectory statistics.
    pub stats: Stats,
}

/// The serialised form, checked on the way in.
#[derive(Deserialize)]
struct RawTrajectory {
    id: String,
    prompt_id: String,
    prompt_len: usize,
    token_ids: Vec<u32>,
    loss_mask: Vec<u8>,
    logprobs: Vec<f32>,
    versions: Vec<i64>,
    #[serde(default)]
    reward: f64,
    #[serde(default)]
    status: Status,
    #[serde(default)]
    stats: Stats,
}

impl TryFrom<RawTrajectory> for Trajectory {
    type Error = TrajectoryError;

    fn try_from(r: RawTrajectory) -> Result<Self, Self::Error> {
        let t = Trajectory {
            id: r.id,
            prompt_id: r.prompt_id,
            prompt_len: r.prompt_len,
            token_ids: r.token_ids,
            loss_mask: r.loss_mask,
            logprobs: r.logprobs,
            versions: r.versions,
            reward: r.reward,
            status: r.status,
            stats: r.stats,
        };
        t.validate()?;
        Ok(t)
    }
}

impl Trajectory {
    /// Starts a trajectory with its prompt tokens (loss mask 0, logprob 0, no version).
    pub fn new(id: impl Into<String>, prompt_id: impl Into<String>, prompt_ids: &[u32]) -> Self {
        let n = prompt_ids.len();
        Trajectory {
            id: id.into(),
            prompt_id: prompt_id.into(),
            prompt_len: n,
            token_ids: prompt_ids.to_vec(),
            loss_mask: vec![0; n],
            logprobs: vec![0.0; n],
            versions: vec![NO_VERSION; n],
            reward: 0.0,
            status: Status::Completed,
            stats: Stats::default(),
        }
    }

    /// Appends tokens the policy of `version` sampled, with the log-probabilities the engine reported.
    pub fn push_model(&mut self, ids: &[u32], logprobs: &[f32], version: i64) -> Result<(), TrajectoryError> {
        if ids.len() != logprobs.len() {
            return Err(TrajectoryError::LengthMismatch {
                id: self.id.clone(),
                field: "logprobs",
                expected: ids.len(),
                got: logprobs.len(),
            });
        }
        self.token_ids.extend_from_slice(ids);
        self.loss_mask.extend(std::iter::repeat_n(1, ids.len()));
        self.logprobs.extend_from_slice(logprobs);
        self.versions.extend(std::iter::repeat_n(version, ids.len()));
        self.stats.response_tokens += ids.len() as u32;
        Ok(())
    }

    /// Appends environment tokens (observation, hint, tool output): loss mask 0, logprob 0.
    pub fn push_env(&mut self, ids: &[u32]) {
        self.token_ids.extend_from_slice(ids);
        self.loss_mask.extend(std::iter::repeat_n(0, ids.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0, ids.len()));
        self.versions.extend(std::iter::repeat_n(NO_VERSION, ids.len()));
        self.stats.env_tokens += ids.len() as u32;
    }

    /// Turns every environment token after the prompt into a trained token (loss mask 1), as the
    /// Search-R1 paper's ablation without observation masking does. Their logprobs stay 0, so the
    /// trainer must recompute old log-probabilities for them.
    pub fn unmask_observations(&mut self) {
        for m in &mut self.loss_mask[self.prompt_len..] {
            *m = 1;
        }
    }

    /// Checks the invariants: equal lengths, prompt within bounds, a 0/1 mask.
    pub fn validate(&self) -> Result<(), TrajectoryError> {
        let expected = self.token_ids.len();
        for (field, got) in [
            ("loss_mask", self.loss_mask.len()),
            ("logprobs", self.logprobs.len()),
            ("versions", self.versions.len()),
        ] {
            if got != expected {
                return Err(TrajectoryError::LengthMismatch { id: self.id.clone(), field, expected, got });
            }
        }
        if self.prompt_len > expected {
            return Err(TrajectoryError::PromptTooLong {
                id: self.id.clone(),
                prompt_len: self.prompt_len,
                len: expected,
            });
        }
        if let Some((index, &value)) = self.loss_mask.iter().enumerate().find(|(_, m)| **m > 1) {
            return Err(TrajectoryError::BadMask { id: self.id.clone(), index, value });
        }
        Ok(())
    }

    /// All token ids: prompt, then response.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    /// Number of prompt tokens at the start.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// The tokens after the prompt.
    pub fn response_ids(&self) -> &[u32] {
        &self.token_ids[self.prompt_len..]
    }

    /// Loss mask per token (1 = sampled by the policy and trained on).
    pub fn loss_mask(&self) -> &[u8] {
        &self.loss_mask
    }

    /// The last model turn: the last run of loss-mask-1 tokens after the prompt (empty without
    /// one).
    pub fn last_turn(&self) -> &[u32] {
        let trained = |i: &usize| self.loss_mask[*i] == 1;
        let Some(end) = (self.prompt_len..self.len()).rev().find(trained) else { return &[] };
        let start = (self.prompt_len..=end).rev().take_while(trained).last().unwrap_or(end);
        &self.token_ids[start..=end]
    }

    /// Sampling log-probability per token (0 where the policy did not sample).
    pub fn logprobs(&self) -> &[f32] {
        &self.logprobs
    }

    /// Policy version per token ([`NO_VERSION`] where the policy did not sample).
    pub fn versions(&self) -> &[i64] {
        &self.versions
    }

    /// Total length in tokens.
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    /// Whether the trajectory has no tokens at all.
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// The oldest policy version that sampled any token, if any token was sampled.
    pub fn oldest_version(&self) -> Option<i64> {
        self.versions.iter().copied().filter(|&v| v != NO_VERSION).min()
    }

    /// Policy versions its oldest sampled token lags behind `version`, the policy it trains.
    pub fn staleness(&self, version: i64) -> Option<i64> {
        self.oldest_version().map(|v| (version - v).max(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trajectory {
        let mut t = Trajectory::new("t0", "p0", &[1, 2, 3]);
        t.push_model(&[4, 5], &[-0.5, -0.25], 7).unwrap();
        t.push_env(&[6, 7, 8]);
        t.push_model(&[9], &[-1.0], 8).unwrap();
        t
    }

    #[test]
    fn segments_stay_aligned() {
        let t = sample();
        assert_eq!(t.len(), 9);
        assert_eq!(t.loss_mask(), &[0, 0, 0, 1, 1, 0, 0, 0, 1]);
        assert_eq!(t.logprobs(), &[0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0, 0.0, -1.0]);
        assert_eq!(t.versions(), &[-1, -1, -1, 7, 7, -1, -1, -1, 8]);
        assert_eq!(t.response_ids(), &[4, 5, 6, 7, 8, 9]);
        assert_eq!(t.stats.response_tokens, 3);
        assert_eq!(t.stats.env_tokens, 3);
        assert_eq!(t.oldest_version(), Some(7));
        assert_eq!((t.staleness(9), t.staleness(7), t.staleness(5)), (Some(2), Some(0), Some(0)));
        assert_eq!(t.last_turn(), &[9]);
        assert_eq!(Trajectory::new("t", "p", &[1, 2]).last_turn(), &[] as &[u32]);
        t.validate().unwrap();
    }

    #[test]
    fn model_tokens_need_one_logprob_each() {
        let mut t = Trajectory::new("t1", "p", &[1]);
        let err = t.push_model(&[2, 3], &[-0.1], 0).unwrap_err();
        assert_eq!(err.to_string(), "trajectory `t1`: field `logprobs` has 1 entries but `token_ids` has 2");
        assert_eq!(t.len(), 1, "a rejected segment appends nothing");
    }

    #[test]
    fn round_trips_through_json() {
        let t = sample();
        let json = serde_json::to_string(&t).unwrap();
        let back: Trajectory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn deserialising_checks_lengths() {
        let json = r#"{"id":"x","prompt_id":"p","prompt_len":1,"token_ids":[1,2],
            "loss_mask":[0,1],"logprobs":[0.0],"versions":[-1,0]}"#;
        let err = serde_json::from_str::<Trajectory>(json).unwrap_err().to_string();
        assert!(err.contains("field `logprobs` has 1 entries but `token_ids` has 2"), "{err}");
    }

    #[test]
    fn deserialising_checks_prompt_and_mask() {
        let json = r#"{"id":"x","prompt_id":"p","prompt_len":3,"token_ids":[1,2],
            "loss_mask":[0,1],"logprobs":[0.0,0.0],"versions":[-1,0]}"#;
        let err = serde_json::from_str::<Trajectory>(json).unwrap_err().to_string();
        assert!(err.contains("`prompt_len` 3 exceeds the 2 tokens"), "{err}");
        let json = r#"{"id":"x","prompt_id":"p","prompt_len":1,"token_ids":[1,2],
            "loss_mask":[0,2],"logprobs":[0.0,0.0],"versions":[-1,0]}"#;
        let err = serde_json::from_str::<Trajectory>(json).unwrap_err().to_string();
        assert!(err.contains("`loss_mask[1]` is 2"), "{err}");
    }

    #[test]
    fn unmasking_observations_keeps_the_prompt_masked() {
        let mut t = sample();
        t.unmask_observations();
        assert_eq!(t.loss_mask(), &[0, 0, 0, 1, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn tool_call_counts() {
        let mut s = Stats::default();
        s.record_tool_call("search", true);
        s.record_tool_call("search", false);
        s.record_tool_call("python", true);
        assert_eq!(s.tool_calls["search"], ToolCalls { ok: 1, failed: 1 });
        assert_eq!(s.total_tool_calls(), 3);
    }
}
