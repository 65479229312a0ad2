//! The figures of one step, as `metrics.jsonl` holds them: a flat map from [`Key`]s to numbers.
//! Keys are made only here ([`keys`]), so a misspelt key does not compile.

use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The name of a per-step figure in `metrics.jsonl` (`reward/mean`, `actor/kl`, ...).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(Cow<'static, str>);

impl Key {
    const fn fixed(name: &'static str) -> Key {
        Key(Cow::Borrowed(name))
    }

    /// The key's name in `metrics.jsonl`.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every per-step key: constants for the fixed ones, functions for those named after a tool, a
/// trajectory status or an evaluation's data source.
pub mod keys {
    use super::Key;

    /// The step the record is of (0: the evaluation before the first step).
    pub const STEP: Key = Key::fixed("step");
    /// Mean reward of the step's trajectories that were not aborted.
    pub const REWARD_MEAN: Key = Key::fixed("reward/mean");
    pub const REWARD_STD: Key = Key::fixed("reward/std");
    /// Mean model-generated tokens per trajectory.
    pub const RESPONSE_LENGTH_MEAN: Key = Key::fixed("response/length_mean");
    pub const TURNS_MEAN: Key = Key::fixed("turns/mean");
    /// Mean share of a trajectory's turns with a valid action.
    pub const VALID_ACTION_RATIO: Key = Key::fixed("actions/valid_ratio");
    /// Mean tool calls per trajectory, all tools.
    pub const TOOL_CALLS: Key = Key::fixed("tools/calls_per_trajectory");
    /// Groups whose rollout failed, and groups dropped for rewards without variance.
    pub const GROUPS_FAILED: Key = Key::fixed("groups/failed");
    pub const GROUPS_FILTERED: Key = Key::fixed("groups/filtered");
    /// Groups generated per group kept (`filter_groups`: what the over-sampling cost).
    pub const GROUPS_GENERATED_PER_KEPT: Key = Key::fixed("groups/generated_per_kept");
    /// Wall time of the step's phases, in seconds.
    pub const TIMING_ROLLOUT: Key = Key::fixed("timing/rollout_s");
    pub const TIMING_UPDATE: Key = Key::fixed("timing/update_s");
    pub const TIMING_SYNC: Key = Key::fixed("timing/sync_s");
    pub const TIMING_STEP: Key = Key::fixed("timing/step_s");
    pub const TOKENS_PER_SECOND: Key = Key::fixed("tokens_per_second");
    pub const POLICY_VERSION: Key = Key::fixed("policy_version");
    /// Policy versions the trained trajectories lagged behind.
    pub const STALENESS_MEAN: Key = Key::fixed("staleness/mean");
    pub const STALENESS_MAX: Key = Key::fixed("staleness/max");
    /// The policy's figures: mean per-token entropy, losses, clipping, gradient norm, learning
    /// rate.
    pub const ACTOR_ENTROPY: Key = Key::fixed("actor/entropy");
    pub const ACTOR_PG_LOSS: Key = Key::fixed("actor/pg_loss");
    pub const ACTOR_KL: Key = Key::fixed("actor/kl");
    pub const ACTOR_CLIPFRAC: Key = Key::fixed("actor/clipfrac");
    pub const ACTOR_CLIPFRAC_LOWER: Key = Key::fixed("actor/clipfrac_lower");
    pub const ACTOR_PPO_KL: Key = Key::fixed("actor/ppo_kl");
    pub const ACTOR_GRAD_NORM: Key = Key::fixed("actor/grad_norm");
    pub const ACTOR_LR: Key = Key::fixed("actor/lr");
    /// The KL penalty in the reward (`algorithm.kl_in_reward`, verl's names): the step's mean KL
    /// per trajectory, and the coefficient it was charged at.
    pub const ACTOR_REWARD_KL_PENALTY: Key = Key::fixed("actor/reward_kl_penalty");
    pub const ACTOR_REWARD_KL_PENALTY_COEFF: Key = Key::fixed("actor/reward_kl_penalty_coeff");
    /// The behaviour-policy correction (`tis_cap`, `decoupled`): the mean and largest importance
    /// weight of the trained tokens (the largest of rank 0's share in a data-parallel run), and
    /// the share decoupled PPO's cap dropped.
    pub const ACTOR_IS_WEIGHT_MEAN: Key = Key::fixed("actor/is_weight_mean");
    pub const ACTOR_IS_WEIGHT_MAX: Key = Key::fixed("actor/is_weight_max");
    pub const ACTOR_IS_DROPPED: Key = Key::fixed("actor/is_dropped");
    /// Over-long handling (`algorithm.overlong`): the share of trained trajectories a length
    /// limit cut, and the mean over-long penalty added to their rewards (with a buffer).
    pub const OVERLONG_TRUNCATED_SHARE: Key = Key::fixed("overlong/truncated_share");
    pub const OVERLONG_PENALTY_MEAN: Key = Key::fixed("overlong/penalty_mean");
    /// The critic's figures (PPO).
    pub const CRITIC_VF_LOSS: Key = Key::fixed("critic/vf_loss");
    pub const CRITIC_VF_CLIPFRAC: Key = Key::fixed("critic/vf_clipfrac");
    pub const CRITIC_GRAD_NORM: Key = Key::fixed("critic/grad_norm");
    /// Held-out greedy exact match over the whole split.
    pub const EVAL_EXACT_MATCH: Key = Key::fixed("eval/exact_match");

    /// Mean calls of `tool` per trajectory.
    pub fn tool_calls(tool: &str) -> Key {
        Key(format!("tools/{tool}/calls_per_trajectory").into())
    }

    /// The mean of one part of the reward when reward services take part (`rule`, a service's
    /// name, `{service}/{metric}`).
    pub fn reward_part(part: &str) -> Key {
        Key(format!("reward/{part}").into())
    }

    /// The mean reward of a workflow role's trajectories (after the outcome is shared).
    pub fn role_reward(role: &str) -> Key {
        Key(format!("role/{role}/reward").into())
    }

    /// Trajectories of the step that ended with `status` (`completed`, `truncated`, `aborted`).
    pub fn trajectories(status: &str) -> Key {
        Key(format!("trajectories/{status}").into())
    }

    /// How a held-out evaluation decoded.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Pass {
        /// Greedily (`eval/…`).
        Greedy,
        /// With the training sampling parameters (`eval_sampled/…`).
        Sampled,
    }

    /// A figure of a held-out evaluation.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Figure {
        Trajectories,
        ExactMatch,
        F1,
        Reward,
        ToolCalls,
        ValidFormat,
    }

    /// `figure` of a held-out evaluation, over the whole split or one `source`.
    pub fn eval(pass: Pass, source: Option<&str>, figure: Figure) -> Key {
        let pass = match pass {
            Pass::Greedy => "eval",
            Pass::Sampled => "eval_sampled",
        };
        let figure = match figure {
            Figure::Trajectories => "trajectories",
            Figure::ExactMatch => "exact_match",
            Figure::F1 => "f1",
            Figure::Reward => "reward",
            Figure::ToolCalls => "tool_calls",
            Figure::ValidFormat => "valid_format",
        };
        Key(match source {
            Some(source) => format!("{pass}/{source}/{figure}"),
            None => format!("{pass}/{figure}"),
        }
        .into())
    }
}

/// The flat figures of one step, written as one JSON line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepRecord(BTreeMap<Key, f64>);

impl StepRecord {
    /// Sets `key` to `value`.
    pub fn set(&mut self, key: Key, value: f64) {
        self.0.insert(key, value);
    }

    /// The value of `key`.
    pub fn get(&self, key: &Key) -> Option<f64> {
        self.0.get(key).copied()
    }

    /// Adds every figure of `other`.
    pub fn extend(&mut self, other: StepRecord) {
        self.0.extend(other.0);
    }

    /// The step the record is of.
    pub fn step(&self) -> u64 {
        self.get(&keys::STEP).unwrap_or(0.0) as u64
    }

    /// Every figure but the step, by name (what experiment trackers log at the step).
    pub fn figures(&self) -> Vec<(String, f64)> {
        self.0.iter().filter(|(k, _)| **k != keys::STEP).map(|(k, v)| (k.0.to_string(), *v)).collect()
    }

    /// The record as a JSON object; non-finite values become `null`.
    pub fn to_json(&self) -> Value {
        let map: Map<String, Value> = self
            .0
            .iter()
            .map(|(k, v)| {
                (k.0.to_string(), serde_json::Number::from_f64(*v).map_or(Value::Null, Value::Number))
            })
            .collect();
        Value::Object(map)
    }
}

#[cfg(test)]
mod tests {
    use super::keys::{self, Figure, Pass};

    #[test]
    fn evaluation_keys_are_named_as_the_constants_and_the_dashboards_read_them() {
        assert_eq!(keys::eval(Pass::Greedy, None, Figure::ExactMatch), keys::EVAL_EXACT_MATCH);
        assert_eq!(keys::eval(Pass::Sampled, Some("nq"), Figure::Reward).name(), "eval_sampled/nq/reward");
        assert_eq!(keys::tool_calls("search").name(), "tools/search/calls_per_trajectory");
    }
}
