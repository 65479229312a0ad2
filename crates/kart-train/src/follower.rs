//! The ranks other than 0 of a data-parallel run. Rank 0 runs the [`Trainer`](super::trainer):
//! it alone talks to the rollout pool, evaluates, writes checkpoints and metrics, serves and
//! publishes weights, and before each step it broadcasts the step's groups. A follower receives
//! them and computes its share of the same update, so every rank holds the same policy.

use super::batch::Sample;
use super::checkpoint;
use super::trainer::{TrainError, learner};
use super::update::Learner;
use kart_core::config::train::TrainConfig;
use kart_core::wire::Group;
use kart_torch::Ranks;
use serde::{Deserialize, Serialize};

/// What rank 0 tells the other ranks before each step.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "order", rename_all = "snake_case")]
pub enum Order {
    /// Train step `step` (0-based) on these groups.
    Step { step: u64, groups: Vec<Group> },
    /// Rank 0 writes a checkpoint: join the gathering of sharded optimiser states.
    Checkpoint,
    /// The run is over.
    Done,
    /// Rank 0 failed; stop.
    Stop { reason: String },
}

/// A rank other than 0.
pub struct Follower {
    learner: Learner,
    config: TrainConfig,
}

impl Follower {
    /// Loads the models (from the newest checkpoint when `resume`, as rank 0 does) and joins the
    /// run's process group.
    pub fn build(config: TrainConfig, resume: bool, ranks: &Ranks) -> Result<Follower, TrainError> {
        config.validate()?;
        let loaded = match resume {
            true => checkpoint::latest(&config.output_dir.join("checkpoints"))
                .map(|d| checkpoint::load(&d))
                .transpose()?,
            false => None,
        };
        if let Some(l) = &loaded {
            tracing::info!(rank = ranks.rank, checkpoint = %l.dir.display(), step = l.state.step, "resuming");
        }
        let learner = learner(&config, loaded.as_ref(), ranks)?;
        Ok(Follower { learner, config })
    }

    /// Trains on rank 0's orders until it says the run is over; returns the steps trained.
    pub fn run(mut self) -> Result<u64, TrainError> {
        let mut steps = 0;
        loop {
            let parallel = self.learner.parallel.as_ref().expect("a follower is one of several ranks");
            let bytes = parallel.group().broadcast_bytes(&[], 0)?;
            match serde_json::from_slice(&bytes).map_err(TrainError::Order)? {
                Order::Step { step, groups } => {
                    let mut samples = Sample::of_groups(&groups, self.config.algorithm.mask_observations);
                    self.learner.step(&mut samples, &self.config, step)?;
                    steps += 1;
                }
                Order::Checkpoint => {
                    self.learner.optimizer_states()?;
                }
                Order::Done => return Ok(steps),
                Order::Stop { reason } => return Err(TrainError::LeaderStopped { reason }),
            }
        }
    }
}
