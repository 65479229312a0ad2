//! Checkpoints: `checkpoints/step-NNNNNNNN/` holding the policy as a Hugging Face folder
//! (`policy/`), the optimiser state (`optimizer.safetensors`), the critic and its optimiser when
//! PPO runs, and `trainer_state.json` (step, policy version, data cursor, seed).
//!
//! A checkpoint is written under a temporary name and renamed into place, so a crash at any
//! moment leaves either the complete checkpoint or none; leftovers are removed on the next start.

use kart_model::ModelError;

use kart_model::save_safetensors;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// Everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Steps completed.
    pub step: u64,
    /// The policy version of the saved weights.
    pub policy_version: i64,
    /// The run's seed (sampling seeds derive from it and the step).
    pub seed: u64,
    /// The data sampler's cursor after the last consumed batch.
    pub data_cursor: serde_json::Value,
    /// Updates the policy optimiser made.
    pub optimizer_steps: i64,
    /// Updates the critic optimiser made (PPO).
    pub critic_optimizer_steps: Option<i64>,
    /// The coefficient of the KL penalty in the reward reached (`algorithm.kl_in_reward`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
}

/// Failure to write or read a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// The checkpoint folder of `step` under `root`.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(format!("step-{step:08}"))
}

/// What a checkpoint holds besides the policy folder.
pub struct Parts<'a> {
    pub state: &'a TrainerState,
    pub optimizer: Vec<(String, Tensor)>,
    pub critic: Option<Vec<(String, Tensor)>>,
    pub critic_optimizer: Option<Vec<(String, Tensor)>>,
}

/// Writes a checkpoint of `step` under `root`: `write_policy` fills the `policy/` folder, `parts`
/// the rest. Keeps the newest `keep` checkpoints. Returns the checkpoint folder.
pub fn save(
    root: &Path,
    write_policy: impl FnOnce(&Path) -> Result<(), ModelError>,
    parts: Parts<'_>,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    let step = parts.state.step;
    let final_dir = step_dir(root, step);
    let tmp = root.join(format!(".step-{step:08}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    write_policy(&tmp.join("policy"))?;
    write_tensors(&tmp.join("optimizer.safetensors"), &parts.optimizer)?;
    if let Some(critic) = &parts.critic {
        write_tensors(&tmp.join("critic.safetensors"), critic)?;
    }
    if let Some(opt) = &parts.critic_optimizer {
        write_tensors(&tmp.join("critic_optimizer.safetensors"), opt)?;
    }
    let state_path = tmp.join("trainer_state.json");
    let json = serde_json::to_vec_pretty(parts.state).expect("the state serialises");
    std::fs::write(&state_path, json).map_err(io(&state_path))?;
    sync_dir(&tmp);
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
    sync_dir(root);
    prune(root, keep)?;
    Ok(final_dir)
}

fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), ModelError> {
    save_safetensors(path, tensors.iter().map(|(n, t)| (n.as_str(), t)), Kind::Float)
}

/// Flushes a folder's entries to disk (best effort: not every file system supports it).
fn sync_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.path().is_file()
                && let Ok(f) = std::fs::File::open(entry.path())
            {
                let _ = f.sync_all();
            }
        }
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Complete checkpoints under `root`, oldest first, as `(step, folder)`.
pub fn list(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<_> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            e.path().join("trainer_state.json").is_file().then(|| (step, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The newest complete checkpoint under `root`; removes half-written ones.
pub fn latest(root: &Path) -> Option<PathBuf> {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".tmp") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    list(root).pop().map(|(_, p)| p)
}

fn prune(root: &Path, keep: usize) -> Result<(), CheckpointError> {
    let all = list(root);
    for (_, dir) in all.iter().take(all.len().saturating_sub(keep.max(1))) {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    Ok(())
}

/// A checkpoint read back.
pub struct Loaded {
    pub dir: PathBuf,
    pub state: TrainerState,
    pub optimizer: Vec<(String, Tensor)>,
    pub critic: Option<Vec<(String, Tensor)>>,
    pub critic_optimizer: Option<Vec<(String, Tensor)>>,
}

impl Loaded {
    /// The policy's Hugging Face folder.
    pub fn policy_dir(&self) -> PathBuf {
        self.dir.join("policy")
    }
}

/// Reads the checkpoint in `dir`.
pub fn load(dir: &Path) -> Result<Loaded, CheckpointError> {
    let state_path = dir.join("trainer_state.json");
    let text = std::fs::read(&state_path).map_err(io(&state_path))?;
    let state: TrainerState = serde_json::from_slice(&text)
        .map_err(|e| CheckpointError::Invalid { path: state_path.clone(), reason: e.to_string() })?;
    let read = |name: &str| -> Result<Option<Vec<(String, Tensor)>>, CheckpointError> {
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        Tensor::read_safetensors(&path)
            .map(Some)
            .map_err(|e| CheckpointError::Invalid { path, reason: e.to_string() })
    };
    let optimizer = read("optimizer.safetensors")?.ok_or_else(|| CheckpointError::Invalid {
        path: dir.join("optimizer.safetensors"),
        reason: "missing".into(),
    })?;
    Ok(Loaded {
        dir: dir.to_path_buf(),
        state,
        optimizer,
        critic: read("critic.safetensors")?,
        critic_optimizer: read("critic_optimizer.safetensors")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: u64) -> TrainerState {
        TrainerState {
            step,
            policy_version: step as i64,
            seed: 7,
            data_cursor: serde_json::json!({"epoch": 0, "position": step * 4}),
            optimizer_steps: step as i64,
            critic_optimizer_steps: None,
            kl_coef: None,
        }
    }

    fn write(root: &Path, step: u64, keep: usize) -> PathBuf {
        let s = state(step);
        let parts = Parts {
            state: &s,
            optimizer: vec![("w.exp_avg".into(), Tensor::from_slice(&[step as f32]))],
            critic: None,
            critic_optimizer: None,
        };
        save(
            root,
            |dir| {
                std::fs::create_dir_all(dir).map_err(|e| kart_tokenizer::file::FileError::io(dir)(e).into())
            },
            parts,
            keep,
        )
        .unwrap()
    }

    #[test]
    fn newest_complete_checkpoint_wins_and_old_ones_are_pruned() {
        let root = tempfile::tempdir().unwrap();
        for step in 1..=3 {
            write(root.path(), step, 2);
        }
        // A crash in the middle of writing step 4 leaves only a temporary folder.
        std::fs::create_dir_all(root.path().join(".step-00000004.tmp/policy")).unwrap();
        assert_eq!(list(root.path()).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2, 3]);
        let dir = latest(root.path()).unwrap();
        assert!(!root.path().join(".step-00000004.tmp").exists());
        let loaded = load(&dir).unwrap();
        assert_eq!(loaded.state, state(3));
        assert_eq!(Vec::<f32>::try_from(&loaded.optimizer[0].1).unwrap(), vec![3.0]);
        assert!(loaded.critic.is_none());
    }

    #[test]
    fn a_corrupt_state_names_the_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = write(root.path(), 1, 2);
        std::fs::write(dir.join("trainer_state.json"), "{").unwrap();
        let err = load(&dir).err().unwrap().to_string();
        assert!(err.contains("trainer_state.json"), "{err}");
    }
}
