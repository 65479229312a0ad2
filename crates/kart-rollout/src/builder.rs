//! Assembling a token-exact trajectory turn by turn: model tokens exactly as the engine sampled
//! them, environment text tokenised once with loss mask 0.

use kart_core::agent::trajectory::{Trajectory, TrajectoryError};
use kart_core::engine::EngineOutput;
use kart_tokenizer::Tokenizer;
use kart_tokenizer::TokenizerError;

/// A trajectory under construction, with the tokenizer that turns environment text into tokens.
pub struct TrajectoryBuilder {
    trajectory: Trajectory,
    tokenizer: Tokenizer,
}

impl TrajectoryBuilder {
    /// Starts from the prompt's token ids.
    pub fn new(id: String, prompt_id: String, prompt_ids: &[u32], tokenizer: Tokenizer) -> Self {
        TrajectoryBuilder { trajectory: Trajectory::new(id, prompt_id, prompt_ids), tokenizer }
    }

    /// Appends a model turn.
    pub fn push_model(&mut self, output: &EngineOutput) -> Result<(), BuildError> {
        let g = &output.generation;
        let mut start = 0;
        for &(tokens, version) in &output.earlier {
            let end = (start + tokens).min(g.token_ids.len());
            self.trajectory.push_model(&g.token_ids[start..end], &g.logprobs[start..end], version)?;
            start = end;
        }
        self.trajectory.push_model(&g.token_ids[start..], &g.logprobs[start..], output.version)?;
        self.trajectory.stats.turns += 1;
        Ok(())
    }

    /// Appends environment text (observation, hint, tool output), keeping at most `max_tokens` of
    /// its tokens (from the start, as Search-R1 truncates observations); returns the text appended.
    /// Passages retrieved before come from the tokenizer's memory ([`Tokenizer::encode_cached`]).
    pub fn push_env(&mut self, text: &str, max_tokens: Option<usize>) -> Result<String, BuildError> {
        let mut ids = self.tokenizer.encode_cached(text)?;
        if let Some(max) = max_tokens
            && ids.len() > max
        {
            ids.truncate(max);
            self.trajectory.push_env(&ids);
            return Ok(self.tokenizer.decode(&ids, false)?);
        }
        self.trajectory.push_env(&ids);
        Ok(text.to_string())
    }

    /// All tokens so far (what the next generation is conditioned on).
    pub fn token_ids(&self) -> &[u32] {
        self.trajectory.token_ids()
    }

    /// Tokens so far.
    pub fn len(&self) -> usize {
        self.trajectory.len()
    }

    /// Whether there are no tokens (never, once a prompt is in).
    pub fn is_empty(&self) -> bool {
        self.trajectory.is_empty()
    }

    /// The decoded text of the whole trajectory: exactly what a reward function sees.
    pub fn text(&self) -> Result<String, BuildError> {
        Ok(self.tokenizer.decode(self.trajectory.token_ids(), false)?)
    }

    /// The trajectory for statistics and outcome.
    pub fn trajectory_mut(&mut self) -> &mut Trajectory {
        &mut self.trajectory
    }

    /// The finished trajectory.
    pub fn finish(self) -> Trajectory {
        self.trajectory
    }
}

/// A trajectory could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Trajectory(#[from] TrajectoryError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}
