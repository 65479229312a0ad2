//! The `kart` command line: one subcommand per module below.

mod conformance;

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
    Conformance(conformance::Args),
}

/// Parses the command line and runs the chosen subcommand.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Conformance(args) => conformance::run(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}
