//! `kart bench ...`: kart's performance against a named anchor measured in the same run, printed
//! as ratios.

mod anchor;
mod dense;
mod encoder;
mod model;
mod retriever;
mod rollout;
mod sync;
mod train;

use kart_core::config::train::Device;
use std::process::ExitCode;

/// Measure kart against a reference implementation on the same machine, in the same run.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    Model(model::Args),
    Encoder(encoder::Args),
    Retriever(retriever::Args),
    Rollout(rollout::Args),
    Sync(sync::Args),
    Train(train::Args),
}

/// A benchmark's `--device`: `cpu` or `cuda`.
fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda),
        other => Err(format!("`{other}` is neither `cpu` nor `cuda`")),
    }
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Model(args) => model::run(args),
        Command::Encoder(args) => encoder::run(args),
        Command::Retriever(args) => retriever::run(args),
        Command::Rollout(args) => rollout::run(args),
        Command::Sync(args) => sync::run(args),
        Command::Train(args) => train::run(args),
    }
}
