//! Environments: the multi-turn loops of the agents, each episode producing token-exact
//! trajectories with their rewards and statistics. Their settings are
//! [`kart_core::config::env`].
//!
//! - [`search_r1`]: Search-R1's search-and-answer loop;
//! - [`asearcher`]: ASearcher's search, page access and summarisation turns;
//! - [`tir`]: tool-integrated reasoning with a Python executor and a calculator;
//! - [`tools`]: a chat model calling functions in its template's format;
//! - [`workflow`]: several roles on one policy, each running one of the above;
//! - [`Context`]: what they run against (engine, tokenizer, chat template, tools);
//! - [`turns`]: the turn loop they all run, and what an environment plugs into it.

pub mod asearcher;
mod context;
pub mod search_r1;
pub mod tir;
pub mod tools;
pub mod turns;
pub mod workflow;

pub use context::{Context, ContextError};

use crate::builder::BuildError;
use futures::future::BoxFuture;
use kart_core::agent::trajectory::Trajectory;
use kart_core::config::env::EnvConfig;
use kart_core::generation::SamplingParams;
use kart_core::wire::{Task, TaskError};
use kart_tokenizer::TokenizerError;
use std::sync::Arc;

/// The environment `config` describes.
pub fn build(config: &EnvConfig) -> Arc<dyn Environment> {
    match config {
        EnvConfig::SearchR1(c) => Arc::new(search_r1::SearchR1Env::new(c.clone())),
        EnvConfig::Asearcher(c) => Arc::new(asearcher::AsearcherEnv::new(c.clone())),
        EnvConfig::Tir(c) => Arc::new(tir::TirEnv::new(c.clone())),
        EnvConfig::Tools(c) => Arc::new(tools::ToolsEnv::new(c.clone())),
        EnvConfig::Workflow(c) => Arc::new(workflow::WorkflowEnv::new(c)),
    }
}

/// One agent loop, or a workflow of several.
pub trait Environment: Send + Sync {
    /// The environment's name in metrics and logs (`search-r1`, `asearcher`, `tir`, `tools`,
    /// `workflow`).
    fn name(&self) -> &'static str;

    /// Runs one episode of `task`, returning its trajectories: one for an agent, one per role
    /// episode for a workflow (status `aborted` when the engine failed for good; tool failures
    /// become observations). Their ids start with `episode_id`.
    fn episode<'a>(
        &'a self,
        ctx: &'a Context,
        task: &'a Task,
        episode_id: String,
        sampling: &'a SamplingParams,
    ) -> BoxFuture<'a, Result<Vec<Trajectory>, RolloutError>>;
}

/// A task that cannot be rolled out at all (bad input or a broken tokenizer).
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The environment needs what the model's chat template does not give.
    #[error("chat template: {0}")]
    Template(String),
    /// A workflow run against a context built for another one.
    #[error("workflow: {0}")]
    Workflow(String),
}
