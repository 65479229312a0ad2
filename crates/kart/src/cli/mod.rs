//! The `kart` command line: one subcommand per module below.

mod allocator;
mod bench;
mod conformance;
mod doctor;
mod launch;
mod local;
mod logging;
mod plan;
mod plot;
mod retriever;
mod rollout;
mod status_file;
mod train;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Train tool-using LLM agents with reinforcement learning.
#[derive(Debug, Parser)]
#[command(name = "kart", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(subcommand)]
    Bench(bench::Command),
    Conformance(conformance::Args),
    Doctor(doctor::DoctorArgs),
    Local(local::LocalArgs),
    Plan(plan::Args),
    Plot(plot::Args),
    #[command(subcommand)]
    Retriever(retriever::Command),
    #[command(subcommand)]
    Rollout(rollout::Command),
    Train(train::TrainArgs),
}

/// Parses the command line and runs the chosen subcommand.
pub fn run() -> ExitCode {
    allocator::keep_freed_memory();
    let cli = Cli::parse();
    logging::init();
    let result = match cli.command {
        Command::Bench(command) => bench::run(command),
        Command::Conformance(args) => conformance::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Local(args) => local::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Retriever(command) => retriever::run(command),
        Command::Rollout(command) => rollout::run(command),
        Command::Train(args) => train::run(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}
