//! `kart rollout serve`: a rollout worker of a RolloutPool.

use anyhow::Context;
use clap::{Args, Subcommand};
use kart_core::config::rollout::{EngineConfig, RolloutConfig};
use kart_model::{CausalLm, EmbeddedEngine};
use kart_rollout::server::WorkerEngine;
use kart_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Run agents against an inference engine and their tools, serving trajectories over HTTP.
#[derive(Debug, Subcommand)]
pub enum Command {
    Serve(ServeArgs),
}

/// Serve `POST /rollout` (NDJSON groups of trajectories), `POST /weights`, `/healthz`, `/readyz`
/// and `/metrics`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (JSON, the `RolloutConfig` the operator renders).
    #[arg(long)]
    config: PathBuf,
    /// Port to listen on (overrides the file).
    #[arg(long)]
    port: Option<u16>,
    /// Address to listen on (overrides the file).
    #[arg(long)]
    host: Option<String>,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    let Command::Serve(args) = command;
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("--config {}", args.config.display()))?;
    let mut config: RolloutConfig =
        serde_json::from_str(&text).with_context(|| format!("--config {}", args.config.display()))?;
    if let Some(port) = args.port {
        config.port = port;
    }
    if let Some(host) = args.host {
        config.host = host;
    }
    let engine = engine(&config)?;
    tokio::runtime::Runtime::new()?.block_on(kart_rollout::server::run(config, engine))?;
    Ok(ExitCode::SUCCESS)
}

/// The engine `config` names: the embedded engine on the model folder (the worker loads its new
/// weights), or SGLang or vLLM servers (which load their own).
fn engine(config: &RolloutConfig) -> anyhow::Result<WorkerEngine> {
    match &config.engine {
        EngineConfig::Embedded { max_batch, seed } => {
            let model_error = || format!("model {}", config.model.display());
            let model = CausalLm::load(&config.model, kart_torch::auto("rollout engine"))
                .with_context(model_error)?;
            let tokenizer = Tokenizer::load(&config.model).with_context(model_error)?;
            let engine = EmbeddedEngine::spawn(model, tokenizer, *max_batch, 0, *seed);
            Ok(WorkerEngine { engine: Arc::new(engine.clone()), weights: Some(Arc::new(engine)) })
        }
        remote => {
            let engine = kart_rollout::engines::remote(remote).map_err(|e| anyhow::anyhow!("config: {e}"))?;
            Ok(WorkerEngine { engine, weights: None })
        }
    }
}
