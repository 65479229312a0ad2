//! The trainer (`kart train`): data, advantages, losses, optimisation, weight sync, checkpoints
//! and evaluation. Its configuration is [`kart_core::config::train::TrainConfig`].
//!
//! - [`data`]: the prompts of the three dataset formats and their seeded order;
//! - [`batch`]: trajectories as samples and micro-batches, padded or packed;
//! - [`losses`]: the RL losses on tensors (the twins of [`kart_core::rl`]);
//! - [`optim`]: AdamW, gradient clipping and the learning-rate schedule; [`zero`]: its state
//!   sharded over the data-parallel ranks, and [`layer_shards`]: the decoder layers' parameters
//!   too (`sharding: full`);
//! - [`critic`]: the value model of PPO;
//! - [`update`]: one optimisation step, and [`data_parallel`]: its share on each rank of a
//!   data-parallel run;
//! - [`pool`]: where trajectories come from (in process or rollout workers), or [`replay`]: a
//!   recording of them;
//! - [`weights`]: how new weights reach the engines, [`broadcast`]: by a c10d broadcast to
//!   SGLang's workers, [`replicas`]: every SGLang replica behind a URL, and [`replica_watch`]:
//!   the replicas left behind between publishes;
//! - [`plan`]: the per-GPU memory of a run, estimated before anything is loaded (`kart plan`);
//! - [`checkpoint`], [`eval`], [`record`], [`metrics`], [`dump`], [`server`]: the run's outputs,
//!   and
//!   [`progress`]: progress bars on a terminal;
//! - [`trainer`]: the loop, on rank 0; [`follower`]: the other ranks'.

pub mod batch;
pub mod broadcast;
pub mod checkpoint;
pub mod critic;
pub mod data;
pub mod data_parallel;
pub mod dump;
pub mod eval;
pub mod follower;
pub mod layer_shards;
pub mod losses;
pub mod metrics;
pub mod optim;
pub mod plan;
pub mod pool;
pub mod progress;
pub mod record;
pub mod replay;
pub mod replica_watch;
pub mod replicas;
pub mod server;
pub mod trainer;
pub mod update;
pub mod weights;
pub mod zero;
