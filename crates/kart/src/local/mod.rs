//! `kart local`: training a search agent on a laptop CPU, on a synthetic world.
//!
//! - [`world`]: the deterministic synthetic search world (invented entities, their corpus and
//!   questions split into train and held-out test), with its corpus and questions made in
//!   `corpus` and `questions` from names made in `names`;
//! - [`gold`]: gold trajectories in the Search-R1 format (some deliberately imperfect) for the
//!   supervised warm start;
//! - [`format`]: how the agent calls its search tool (Search-R1's tags or function calls), and
//!   what follows from it;
//! - [`copy_drill`]: copy drills, the model's first lesson (copying what it has read);
//! - [`fact_drill`]: fact drills, the second (looking a value up in passages by its subject);
//! - [`warm_start`]: the gold trajectories tokenised as rollouts tokenise them, and the
//!   supervised training on the drills, then on them;
//! - [`copy_probe`]: whether the warm-started model copies values from passages it never trained
//!   on, and the bounded extra training while it does not;
//! - [`reading`]: held-out trajectories before and after RL, rendered for a person to read.

pub mod copy_drill;
pub mod copy_probe;
mod corpus;
pub mod fact_drill;
pub mod format;
pub mod gold;
mod names;
mod questions;
pub mod reading;
mod rng;
pub mod warm_start;
pub mod world;
