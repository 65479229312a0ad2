//! The rollout worker's API: the `POST /rollout` request, and the NDJSON lines it streams back,
//! one per finished group. The worker ([`kart-rollout`]) and the trainer's remote pool
//! ([`kart-train`]) both use these types.

use super::{InvalidField, Task, WeightSource};
use crate::agent::trajectory::Trajectory;
use crate::config::env::EnvConfig;
use crate::generation::SamplingParams;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// A `POST /rollout` body: `n` trajectories of each prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutRequest {
    pub prompts: Vec<Task>,
    /// Trajectories per prompt.
    #[serde(default = "one")]
    pub n: usize,
    #[serde(default)]
    pub sampling: SamplingParams,
    /// The policy version the trainer expects; recorded, the tokens carry the actual versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<i64>,
    /// An environment for this request instead of the worker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvConfig>,
    /// The weights of the version the request wants, loaded first when the engine is behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<WeightSource>,
}

fn one() -> usize {
    1
}

/// Most trajectories per group.
pub const MAX_N: usize = 1024;

impl RolloutRequest {
    /// Checks what serde cannot: `n`, the sampling ranges, the environment's settings, the
    /// weights (and that they are of `policy_version`), a prompt in every task and unique task
    /// ids.
    pub fn validate(&self) -> Result<(), InvalidField> {
        if !(1..=MAX_N).contains(&self.n) {
            return Err(InvalidField::new("n", format!("{} is not in 1..={MAX_N}", self.n)));
        }
        if let Some(env) = &self.env {
            env.validate().map_err(|e| {
                InvalidField::new(format!("env.{}", e.field), format!("{} ({})", e.reason, e.value))
            })?;
        }
        self.sampling.validate().map_err(|e| InvalidField::new("sampling", e.to_string()))?;
        if let Some(weights) = &self.weights {
            weights.validate().map_err(|e| e.within("weights"))?;
            if let Some(v) = self.policy_version.filter(|&v| v != weights.version) {
                let reason = format!("{} differs from policy_version {v}", weights.version);
                return Err(InvalidField::new("weights.version", reason));
            }
        }
        let mut ids = HashSet::new();
        for (i, task) in self.prompts.iter().enumerate() {
            if task.messages.as_ref().is_none_or(Vec::is_empty) && task.prompt.is_none() {
                return Err(InvalidField::new(format!("prompts[{i}]"), "needs `messages` or `prompt`"));
            }
            if !ids.insert(task.id.as_str()) {
                let reason = format!("duplicate id `{}`", task.id);
                return Err(InvalidField::new(format!("prompts[{i}].id"), reason));
            }
        }
        Ok(())
    }
}

/// The trajectories of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The task's id.
    pub prompt_id: String,
    /// The task's data source, for per-source metrics.
    #[serde(default)]
    pub data_source: String,
    /// `n` trajectories, in order.
    pub trajectories: Vec<Trajectory>,
}

/// One line of the `/rollout` stream: a finished group, or why a prompt's group failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RolloutLine {
    /// `{"prompt_id", "error"}`.
    Failed {
        #[serde(default)]
        prompt_id: String,
        error: String,
    },
    /// `{"prompt_id", "data_source", "trajectories"}`.
    Group(Group),
}

impl RolloutLine {
    /// The prompt the line is about.
    pub fn prompt_id(&self) -> &str {
        match self {
            RolloutLine::Failed { prompt_id, .. } | RolloutLine::Group(Group { prompt_id, .. }) => prompt_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines_name_their_prompt() {
        let line: RolloutLine =
            serde_json::from_str(r#"{"prompt_id": "q1", "error": "engine down"}"#).unwrap();
        assert_eq!(line.prompt_id(), "q1");
        assert_eq!(line, RolloutLine::Failed { prompt_id: "q1".into(), error: "engine down".into() });
        assert!(serde_json::from_str::<RolloutLine>("{not json").is_err());
        let group = serde_json::from_str::<RolloutLine>(r#"{"prompt_id": "q1"}"#);
        assert!(group.is_err(), "a group needs its trajectories");
    }
}
