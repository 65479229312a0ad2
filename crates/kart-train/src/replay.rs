//! `rollout.replay`: the groups a run recorded in `rollouts.jsonl` (`dump_rollouts`), served
//! again step by step in their order, for offline training, debugging and deterministic runs.

use kart_core::agent::trajectory::Trajectory;
use kart_core::wire::Group;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A recording that cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("rollout.replay {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("rollout.replay {path}, line {line}: {reason}")]
    Line { path: PathBuf, line: usize, reason: String },
    #[error("rollout.replay {path}: step {step} is not recorded (steps {first} to {last} are)")]
    Missing { path: PathBuf, step: u64, first: u64, last: u64 },
}

/// One line of `rollouts.jsonl`, as far as replay reads it.
#[derive(Deserialize)]
struct Line {
    step: u64,
    #[serde(default)]
    data_source: String,
    /// The whole trajectory (tokens, log-probabilities, masks); older dumps lack it.
    trajectory: Option<Trajectory>,
}

/// The recorded groups of every step.
#[derive(Debug)]
pub struct Replay {
    path: PathBuf,
    steps: BTreeMap<u64, Vec<Group>>,
}

impl Replay {
    /// Reads the recording at `path`.
    pub fn open(path: &Path) -> Result<Replay, ReplayError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ReplayError::Io { path: path.to_path_buf(), source })?;
        let mut steps: BTreeMap<u64, Vec<Group>> = BTreeMap::new();
        for (i, raw) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad = |reason: String| ReplayError::Line { path: path.to_path_buf(), line: i + 1, reason };
            let line: Line = serde_json::from_str(raw).map_err(|e| bad(e.to_string()))?;
            let trajectory = line
                .trajectory
                .ok_or_else(|| bad("no `trajectory` (written by a kart older than replay)".into()))?;
            let groups = steps.entry(line.step).or_default();
            match groups.iter_mut().find(|g| g.prompt_id == trajectory.prompt_id) {
                Some(g) => g.trajectories.push(trajectory),
                None => groups.push(Group {
                    prompt_id: trajectory.prompt_id.clone(),
                    data_source: line.data_source,
                    trajectories: vec![trajectory],
                }),
            }
        }
        Ok(Replay { path: path.to_path_buf(), steps })
    }

    /// The groups recorded at `step` (1-based, as `rollouts.jsonl` numbers them), in order.
    pub fn groups(&self, step: u64) -> Result<Vec<Group>, ReplayError> {
        self.steps.get(&step).cloned().ok_or_else(|| ReplayError::Missing {
            path: self.path.clone(),
            step,
            first: self.steps.keys().next().copied().unwrap_or(0),
            last: self.steps.keys().next_back().copied().unwrap_or(0),
        })
    }
}
