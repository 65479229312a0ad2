//! `kart plan`: the estimated memory of each GPU of a training run, part by part, and whether it
//! fits (the formulas are [`kart_train::plan`]'s).

use anyhow::{Context, bail};
use kart_core::config::memory::{Precision, Sharding};
use kart_core::config::train::TrainConfig;
use kart_model::ModelConfig;
use kart_train::plan::{MemoryPlan, Workload, plan};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::process::ExitCode;

/// Estimate the memory each GPU of a training run needs: weights, gradients, optimizer state,
/// reference policy, critic, activations and the in-process engine.
///
/// The model's shape comes from its config.json; the memory settings, batch sizes, algorithm and
/// rollout source from a `kart train` config (--config), or its defaults, with the flags below
/// overriding them. Unset precision plans bf16, as on CUDA. Not counted: the CUDA context and the
/// allocator's fragmentation (often 1 to 3 GiB together).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model: a Hugging Face folder or its config.json [default: the config's `model`].
    #[arg(long, value_name = "DIR|CONFIG.json")]
    model: Option<PathBuf>,
    /// A training config (JSON, as `kart train --config` reads).
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// Nodes of the run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    /// GPUs (data-parallel ranks) per node.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    gpus_per_node: u32,
    /// Memory of one GPU in GiB.
    #[arg(long, default_value_t = 80.0, value_parser = parse_gib)]
    gpu_memory_gb: f64,
    /// Tokens of the longest trajectory, prompt included.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    seq_len: u32,
    /// Tokens of a trajectory the loss trains (the model's turns) [default: --seq-len].
    #[arg(long)]
    response_len: Option<u32>,
    /// `bf16` or `f32` (the config's `precision`).
    #[arg(long, value_parser = parse_name::<Precision>)]
    precision: Option<Precision>,
    /// `none`, `optimizer`, `gradients` or `full` (the config's `sharding`).
    #[arg(long, value_parser = parse_name::<Sharding>)]
    sharding: Option<Sharding>,
    /// Recompute decoder layers in the backward pass (the config's `activation_checkpointing`).
    #[arg(long)]
    activation_checkpointing: bool,
    /// Keep the reference policy in CPU memory (the config's `reference.offload`).
    #[arg(long)]
    offload_reference: bool,
    /// Trajectories per forward/backward pass, padded (the config's `batch.micro_batch_size`).
    #[arg(long, conflicts_with = "micro_batch_tokens", value_parser = clap::value_parser!(u32).range(1..))]
    micro_batch_size: Option<u32>,
    /// Tokens per forward/backward pass, packed (the config's `batch.micro_batch_tokens`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    micro_batch_tokens: Option<u32>,
    /// A rollout worker's URL (the config's `rollout.urls`; repeatable): trajectories come from
    /// workers and the trainer runs no engine of its own.
    #[arg(long, value_name = "URL")]
    rollout_url: Vec<String>,
    /// Print the plan as JSON (bytes).
    #[arg(long)]
    json: bool,
}

/// A config enum from its name as configs spell it (`bf16`, `full`, ...).
fn parse_name<T: DeserializeOwned>(name: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).map_err(|e| e.to_string())
}

/// A GPU memory size in GiB.
fn parse_gib(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(gib) if gib.is_finite() && gib > 0.0 => Ok(gib),
        _ => Err(format!("`{s}` is not a positive number of GiB")),
    }
}

/// The JSON of `--json`: the plan with the GPU it was checked against.
#[derive(Debug, Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    plan: &'a MemoryPlan,
    total: u64,
    gpu_memory: u64,
    fits: bool,
    headroom: i64,
}

const GIB: f64 = (1u64 << 30) as f64;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (plan, model, model_path) = planned(&args)?;
    let gpu_memory = (args.gpu_memory_gb * GIB) as u64;
    if args.json {
        let total = plan.total();
        let headroom = gpu_memory as i64 - total as i64;
        let report = Report { plan: &plan, total, gpu_memory, fits: plan.fits(gpu_memory), headroom };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&plan, &model, &model_path, gpu_memory));
    }
    Ok(ExitCode::SUCCESS)
}

/// The plan of the run `args` describe, with the model's config and where it was read.
fn planned(args: &Args) -> anyhow::Result<(MemoryPlan, ModelConfig, PathBuf)> {
    let mut config = match &args.config {
        Some(path) => {
            let shown = path.display();
            let text = std::fs::read_to_string(path).with_context(|| format!("--config {shown}"))?;
            serde_json::from_str::<TrainConfig>(&text).with_context(|| format!("--config {shown}"))?
        }
        None => TrainConfig::default(),
    };
    let model_path = match (&args.model, &args.config) {
        (Some(path), _) => path.clone(),
        (None, Some(_)) if !config.model.as_os_str().is_empty() => config.model.clone(),
        _ => bail!("--model: required (or a --config naming the `model`)"),
    };
    let model =
        ModelConfig::load(&model_path).with_context(|| format!("--model {}", model_path.display()))?;
    config.precision = args.precision.or(config.precision);
    config.sharding = args.sharding.unwrap_or(config.sharding);
    config.activation_checkpointing |= args.activation_checkpointing;
    config.reference.offload |= args.offload_reference;
    if let Some(size) = args.micro_batch_size {
        (config.batch.micro_batch_size, config.batch.micro_batch_tokens) = (size as usize, None);
    }
    if let Some(tokens) = args.micro_batch_tokens {
        config.batch.micro_batch_tokens = Some(tokens as usize);
    }
    config.rollout.urls.extend(args.rollout_url.iter().cloned());
    let seq_len = args.seq_len as usize;
    let response_len = args.response_len.map_or(seq_len, |n| n as usize);
    if response_len > seq_len {
        bail!("--response-len {response_len}: must not exceed --seq-len ({seq_len})");
    }
    let workload = Workload {
        model: &model,
        config: &config,
        nodes: args.nodes as usize,
        gpus_per_node: args.gpus_per_node as usize,
        seq_len,
        response_len,
    };
    let plan = plan(&workload)?;
    Ok((plan, model, model_path))
}

/// A config enum's name as configs spell it (`bf16`, `full`, ...).
fn name_of(value: &impl Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// The plan as a table of GiB, with the verdict for a GPU of `gpu_memory` bytes.
fn text(plan: &MemoryPlan, model: &ModelConfig, path: &std::path::Path, gpu_memory: u64) -> String {
    let gib = |bytes: u64| bytes as f64 / GIB;
    let mut out = format!(
        "model: {:?}, {:.2}B parameters ({})\n",
        model.family,
        plan.parameters as f64 / 1e9,
        path.display()
    );
    out += &format!(
        "run: {} GPU(s), {}, sharding {}, activation checkpointing {}; {} tokens per micro-batch, {} trained\n",
        plan.world_size,
        name_of(&plan.precision),
        name_of(&plan.sharding),
        if plan.activation_checkpointing { "on" } else { "off" },
        plan.tokens_per_micro_batch,
        plan.trained_per_micro_batch,
    );
    out += &format!("{:<16} {:>8}\n", "part", "GiB");
    for (part, bytes) in plan.parts.named() {
        let part = if part == "engine" { "engine (rank 0)" } else { part };
        out += &format!("{part:<16} {:>8.2}\n", gib(bytes));
    }
    if plan.between_steps > 0 {
        out += &format!("{:<16} {:>8.2}\n", "step", gib(plan.step()));
        out += &format!(
            "{:<16} {:>8.2}  (rank 0 holds the policy whole)\n",
            "between steps",
            gib(plan.between_steps)
        );
    }
    out += &format!("{:<16} {:>8.2}\n", "total", gib(plan.total()));
    let fits = if plan.fits(gpu_memory) { "yes" } else { "no" };
    let headroom = gib(gpu_memory) - gib(plan.total());
    out + &format!("fits in {:.0} GiB: {fits} (headroom {headroom:.2} GiB)\n", gib(gpu_memory))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// The plan and its text for `flags` after `--model examples/plan/{model}`.
    fn planned_text(model: &str, flags: &str) -> (MemoryPlan, String) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plan").join(model);
        let mut argv = vec!["plan".to_owned(), "--model".to_owned(), dir.display().to_string()];
        argv.extend(flags.split_whitespace().map(str::to_owned));
        let args = Cli::parse_from(argv).args;
        let (plan, config, path) = planned(&args).unwrap();
        let text = text(&plan, &config, &path, (args.gpu_memory_gb * GIB) as u64);
        (plan, text)
    }

    #[test]
    fn the_readme_examples_load_and_the_memory_features_make_them_fit() {
        let features = "--gpus-per-node 8 --seq-len 4096 --micro-batch-tokens 16384 --precision bf16 --activation-checkpointing --sharding full";
        let plain =
            "--gpus-per-node 8 --seq-len 4096 --micro-batch-tokens 16384 --precision f32 --sharding none";
        for (model, billions) in [("qwen2.5-3b", 3.09), ("qwen2.5-7b", 7.62)] {
            let (plan, text) = planned_text(model, features);
            assert!((plan.parameters as f64 / 1e9 - billions).abs() < 0.01, "{model}: {}", plan.parameters);
            assert!(text.contains("fits in 80 GiB: yes"), "{text}");
            assert!(text.contains("engine (rank 0)"), "{text}");
            let (_, text) = planned_text(model, plain);
            assert!(text.contains("fits in 80 GiB: no"), "{text}");
        }
    }
}
