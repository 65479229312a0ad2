//! `kart convert`: other systems' command lines as kart configs.

use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// A verl / Search-R1 command line (`kart convert verl -- python3 -m verl.trainer.main_ppo
    /// data.train_files=… …`) as a kart `TrainConfig` (JSON): mapped keys set, keys without
    /// effect in kart noted on stderr, keys kart cannot honour listed as an error.
    Verl(VerlArgs),
}

#[derive(Debug, Args)]
pub struct VerlArgs {
    /// Where to write the config (stdout when omitted).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The command line, after `--`.
    #[arg(last = true, required = true)]
    args: Vec<String>,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    let Command::Verl(args) = command;
    let converted = kart::convert::verl(&args.args);
    for (key, why) in &converted.notes {
        eprintln!("note: {key}: no effect in kart: {why}");
    }
    let Some(config) = converted.config else {
        let lines: Vec<String> =
            converted.refused.iter().map(|(key, why)| format!("  {key}: {why}")).collect();
        anyhow::bail!("kart cannot honour {} setting(s):\n{}", lines.len(), lines.join("\n"));
    };
    let text = serde_json::to_string_pretty(&config)? + "\n";
    match &args.out {
        Some(path) => {
            std::fs::write(path, text)?;
            eprintln!("config written to {} (kart train --config {})", path.display(), path.display());
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
