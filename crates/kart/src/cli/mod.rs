//! The `kart` command line: one subcommand per module below.

mod allocator;
mod bench;
mod conformance;
mod convert;
mod data;
mod doctor;
mod eval;
mod infer;
mod launch;
mod local;
mod logging;
mod plan;
mod plot;
pub(crate) mod retriever;
mod rollout;
mod setup;
mod status_file;
mod train;
mod view;

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
    /// Convert another stack's run into kart's config (a verl / Search-R1 command line), or
    /// merge a LoRA adapter into its base model
    #[command(subcommand)]
    Convert(convert::Command),
    /// Prepare training data: Search-R1 parquet, ASearcher and TIR JSON lines, merged files
    #[command(subcommand)]
    Data(data::Command),
    Doctor(doctor::DoctorArgs),
    Eval(eval::EvalArgs),
    Infer(infer::InferArgs),
    Local(local::LocalArgs),
    Plan(plan::Args),
    Plot(plot::Args),
    #[command(subcommand)]
    Retriever(retriever::Command),
    #[command(subcommand)]
    Rollout(rollout::Command),
    Train(train::TrainArgs),
    View(view::Args),
}

/// Parses the command line and runs the chosen subcommand.
/// A `--device` of the benchmarks and `kart local`: `cpu` or `cuda`.
fn parse_device(s: &str) -> Result<kart_core::config::train::Device, String> {
    use kart_core::config::train::Device;
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda),
        other => Err(format!("`{other}` is neither `cpu` nor `cuda`")),
    }
}

pub fn run() -> ExitCode {
    allocator::keep_freed_memory();
    let cli = Cli::parse();
    logging::init();
    let result = match cli.command {
        Command::Bench(command) => bench::run(command),
        Command::Conformance(args) => conformance::run(args),
        Command::Convert(command) => convert::run(command),
        Command::Data(command) => data::run(command),
        Command::Doctor(args) => doctor::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Infer(args) => infer::run(args),
        Command::Local(args) => local::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Retriever(command) => retriever::run(command),
        Command::Rollout(command) => rollout::run(command),
        Command::Train(args) => train::run(args),
        Command::View(args) => view::run(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {}", message(&e));
        ExitCode::FAILURE
    })
}

/// `error` and its causes, `: `-separated, leaving out a cause whose text the message so far
/// already holds (errors that wrap another often repeat it: `config: {0}`).
fn message(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_the_message_repeats_is_printed_once() {
        let inner = std::io::Error::other("disk full");
        let wrapped = anyhow::Error::new(inner).context("writing x: disk full").context("saving");
        assert_eq!(super::message(&wrapped), "saving: writing x: disk full");
        let plain = anyhow::Error::new(std::io::Error::other("disk full")).context("writing x");
        assert_eq!(super::message(&plain), "writing x: disk full");
    }
}
