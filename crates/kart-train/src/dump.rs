//! `rollouts.jsonl`: every step's trajectories, decoded, with the prompt, model and environment
//! spans told apart, plus reward, status, staleness and statistics (what ASearcher and slime users
//! read to see what their agent does, and what `/ui` and `kart view` show), and the whole
//! trajectory for `rollout.replay`.

use kart_core::agent::trajectory::Trajectory;
use kart_core::wire::Group;
use kart_model::ModelError;
use kart_tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file's name in a run's `output_dir`.
pub const FILE: &str = "rollouts.jsonl";

/// The spans of a trajectory: `prompt`, then runs of `model` (trained) and `env` (observation)
/// tokens, each decoded.
pub fn segments(t: &Trajectory, tokenizer: &Tokenizer) -> Result<Vec<Value>, ModelError> {
    let ids = t.token_ids();
    let mask = t.loss_mask();
    let mut out = vec![json!({"role": "prompt", "text": tokenizer.decode(&ids[..t.prompt_len()], false)?})];
    let mut start = t.prompt_len();
    while start < ids.len() {
        let kind = mask[start];
        let end = (start..ids.len()).find(|&i| mask[i] != kind).unwrap_or(ids.len());
        let role = if kind == 1 { "model" } else { "env" };
        out.push(json!({"role": role, "text": tokenizer.decode(&ids[start..end], false)?}));
        start = end;
    }
    Ok(out)
}

/// Appends decoded trajectories to a JSON-lines file.
pub struct RolloutDump {
    path: PathBuf,
    tokenizer: Tokenizer,
}

impl RolloutDump {
    /// A dump at `path`.
    pub fn new(path: &Path, tokenizer: Tokenizer) -> Self {
        RolloutDump { path: path.to_path_buf(), tokenizer }
    }

    /// Writes the groups of `step`, trained as policy `version`.
    pub fn write(&self, step: u64, version: i64, groups: &[Group]) -> std::io::Result<()> {
        let mut file =
            std::io::BufWriter::new(std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?);
        for (g, t) in groups.iter().flat_map(|g| g.trajectories.iter().map(move |t| (g, t))) {
            let segments =
                segments(t, &self.tokenizer).unwrap_or_else(|e| vec![json!({"error": e.to_string()})]);
            let line = json!({
                "step": step,
                "id": t.id,
                "prompt_id": t.prompt_id,
                "reward": t.reward,
                "status": t.status,
                "stats": t.stats,
                "staleness": t.staleness(version),
                "data_source": g.data_source,
                "segments": segments,
                "trajectory": t,
            });
            writeln!(file, "{line}")?;
        }
        file.flush()
    }
}
