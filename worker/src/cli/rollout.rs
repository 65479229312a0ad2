//! `kart rollout serve`: a rollout worker of a RolloutPool.

use anyhow::Context;
use clap::{Args, Subcommand};
use kart::rollout::config::RolloutConfig;
use std::path::PathBuf;
use std::process::ExitCode;

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
    tokio::runtime::Runtime::new()?.block_on(kart::rollout::server::run(config))?;
    Ok(ExitCode::SUCCESS)
}
