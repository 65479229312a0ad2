//! `kart convert`: other systems' command lines as kart configs, and LoRA adapters merged into
//! their base.

use anyhow::Context;
use clap::{Args, Subcommand};
use kart_model::{CausalLm, save_pretrained};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// A verl / Search-R1 command line (`kart convert verl -- python3 -m verl.trainer.main_ppo
    /// data.train_files=… …`) as a kart `TrainConfig` (JSON): mapped keys set, keys without
    /// effect in kart noted on stderr, keys kart cannot honour listed as an error.
    Verl(VerlArgs),
    /// A LoRA adapter in PEFT's format (a LoRA run's `model/` or a checkpoint's `policy/`, or
    /// one peft wrote) merged into its base: a full Hugging Face folder (`W + scaling · B A` in
    /// each adapted projection, the base's dtype and tokenizer files) for engines and tools that
    /// serve no adapters.
    MergeLora(MergeLoraArgs),
}

#[derive(Debug, Args)]
pub struct MergeLoraArgs {
    /// The base model's Hugging Face folder.
    #[arg(long)]
    base: PathBuf,
    /// The adapter's folder (`adapter_config.json`, `adapter_model.safetensors`).
    #[arg(long)]
    adapter: PathBuf,
    /// Where to write the merged model.
    #[arg(long)]
    out: PathBuf,
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
    match command {
        Command::Verl(args) => verl(args),
        Command::MergeLora(args) => merge_lora(args),
    }
}

fn merge_lora(args: MergeLoraArgs) -> anyhow::Result<ExitCode> {
    let mut model = CausalLm::load_as(&args.base, tch::Device::Cpu, tch::Kind::Float)
        .with_context(|| format!("--base {}", args.base.display()))?;
    model.load_lora(&args.adapter).with_context(|| format!("--adapter {}", args.adapter.display()))?;
    let adapted = model.lora().map_or(0, |a| a.targets().len());
    model.merge_lora();
    // The base's own dtype (f32 when its config names none).
    let kind = match model.config().dtype.as_deref() {
        Some("bfloat16") => tch::Kind::BFloat16,
        Some("float16") => tch::Kind::Half,
        _ => tch::Kind::Float,
    };
    save_pretrained(&args.out, model.config(), &model.named_tensors(), Some(&args.base), kind)
        .with_context(|| format!("--out {}", args.out.display()))?;
    eprintln!("{adapted} adapted projections merged; model written to {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

fn verl(args: VerlArgs) -> anyhow::Result<ExitCode> {
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
