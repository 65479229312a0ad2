//! `kart bench ...`: kart's performance against a named anchor measured in the same run, printed
//! as ratios.

mod anchor;
mod dense;
mod encoder;
mod model;
mod operator;
mod retriever;
mod rollout;
mod served;
mod server;
mod shape;
mod sync;
mod sync_lora;
mod train;
mod vllm;

use super::parse_device;
use kart_core::config::memory::Precision;
use std::process::ExitCode;

/// Measure kart against a reference implementation on the same machine, in the same run.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    Model(model::Args),
    Operator(operator::Args),
    Encoder(encoder::Args),
    Retriever(retriever::Args),
    Rollout(rollout::Args),
    Sync(sync::Args),
    Train(train::Args),
}

/// A benchmark's `--precision`: `f32` or `bf16`.
fn parse_precision(s: &str) -> Result<Precision, String> {
    match s {
        "f32" => Ok(Precision::F32),
        "bf16" => Ok(Precision::Bf16),
        other => Err(format!("`{other}` is neither `f32` nor `bf16`")),
    }
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Model(args) => model::run(args),
        Command::Operator(args) => operator::run(args),
        Command::Encoder(args) => encoder::run(args),
        Command::Retriever(args) => retriever::run(args),
        Command::Rollout(args) => rollout::run(args),
        Command::Sync(args) => sync::run(args),
        Command::Train(args) => train::run(args),
    }
}
