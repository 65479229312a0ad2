//! `kart bench train`: time per GRPO optimisation step against the same step in PyTorch.
//!
//! Both sides load the same random Qwen2 folder (the model of `kart bench model`) twice, as the
//! policy and the frozen reference, and run identical steps on the same batch: GRPO advantages,
//! old and reference log-probabilities without gradients, the policy's with gradients, the
//! PPO-clip and low-variance KL losses (token means), backward, gradient clipping and AdamW. kart
//! runs its trainer's [`Learner::step`]; the anchor (`scripts/bench/train_anchor.py`) writes the
//! step in torch over a transformers model, slicing the full logits to the response as verl does.
//! The two take turns; the mean of the timed steps after a warm-up step is reported, with each
//! side's first entropy and last KL to the reference as the check that they computed the same.

use super::anchor::{Anchor, AnchorArgs, Row, check_python, take_turns};
use super::model::{FULL_SIZES, parameter_count, random_model};
use anyhow::Context;
use kart_core::agent::trajectory::Trajectory;
use kart_core::config::train::TrainConfig;
use kart_core::config::train::{BatchConfig, OptimConfig};
use kart_model::{CausalLm, QwenSizes};
use kart_train::batch::Sample;
use kart_train::optim::AdamW;
use kart_train::record::{Key, keys};
use kart_train::update::Learner;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::process::ExitCode;
use std::time::Instant;
use tch::Device;

const ANCHOR: &str = include_str!("../../../../../scripts/bench/train_anchor.py");

/// Benchmark a GRPO training step against PyTorch on a random ~50M-parameter Qwen2 model.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Timed steps per side (their mean is reported) [default: 3, 1 with --quick].
    #[arg(long)]
    steps: Option<usize>,
    #[command(flatten)]
    anchor: AnchorArgs,
}

/// The model and batch.
struct Workload {
    sizes: QwenSizes,
    tokenizer_vocab: usize,
    groups: usize,
    group_size: usize,
    prompt_tokens: usize,
    response_tokens: usize,
}

impl Workload {
    /// 8 trajectories (2 prompts x 4) of 128 prompt and 384 response tokens.
    const FULL: Workload = Workload {
        sizes: FULL_SIZES,
        tokenizer_vocab: 2048,
        groups: 2,
        group_size: 4,
        prompt_tokens: 128,
        response_tokens: 384,
    };

    const QUICK: Workload = Workload {
        sizes: QwenSizes {
            vocab_size: 1024,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        },
        tokenizer_vocab: 512,
        groups: 2,
        group_size: 2,
        prompt_tokens: 8,
        response_tokens: 24,
    };
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AnchorInfo {
    threads: i64,
    torch: String,
    transformers: String,
}

#[derive(Debug, Deserialize)]
struct Stepped {
    seconds: f64,
    /// Mean entropy of the policy over the response (from the old-log-probability pass).
    entropy: f64,
    /// The KL loss term (nonzero once the policy has moved from the reference).
    kl: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    parameters: i64,
    threads: i64,
    anchor: AnchorInfo,
    rows: Vec<Row>,
    /// Each side's entropy at the first (warm-up) step: the same weights and batch.
    first_entropy: (f64, f64),
    /// Each side's KL to the reference at the last step, after the same number of updates.
    last_kl: (f64, f64),
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let w = if args.anchor.quick { Workload::QUICK } else { Workload::FULL };
    let steps = args.anchor.or(args.steps, 3, 1);
    let python = args.anchor.python();
    check_python(&python, "torch, transformers")?;
    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let model_dir = work.path().join("model");
    let (policy, _) = random_model(&model_dir, w.sizes, w.tokenizer_vocab, args.anchor.seed)?;
    let parameters = parameter_count(&policy);

    let mut rng = ChaCha8Rng::seed_from_u64(args.anchor.seed);
    let vocab = w.sizes.vocab_size as u32;
    let n = w.groups * w.group_size;
    let rows: Vec<Vec<u32>> = (0..n)
        .map(|_| (0..w.prompt_tokens + w.response_tokens).map(|_| rng.random_range(3..vocab)).collect())
        .collect();
    let rewards: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(0..2u8))).collect();
    let groups: Vec<usize> = (0..n).map(|i| i / w.group_size).collect();
    let samples: Vec<Sample> = rows
        .iter()
        .zip(&rewards)
        .zip(&groups)
        .map(|((ids, &reward), &group)| {
            let mut t = Trajectory::new(format!("t{group}"), format!("p{group}"), &ids[..w.prompt_tokens]);
            t.push_model(&ids[w.prompt_tokens..], &vec![-1.0; w.response_tokens], 0).expect("equal lengths");
            t.reward = reward;
            Sample::new(&t, group, true)
        })
        .collect();
    let config = TrainConfig {
        batch: BatchConfig {
            prompts: w.groups,
            n: w.group_size,
            mini_batch_prompts: w.groups,
            micro_batch_size: n,
        },
        optim: OptimConfig { lr: 1e-6, ..OptimConfig::default() },
        total_steps: 1_000,
        ..TrainConfig::default()
    };
    let mut reference = CausalLm::load(&model_dir, Device::Cpu)?;
    reference.var_store_mut().freeze();
    let optimizer = AdamW::new(policy.named_tensors(), config.optim.clone());
    let mut learner = Learner { policy, optimizer, reference: Some(reference), critic: None, parallel: None };

    let ids: Vec<Vec<i64>> = rows.iter().map(|r| r.iter().map(|&t| i64::from(t)).collect()).collect();
    let request =
        json!({"input_ids": ids, "prompt_len": w.prompt_tokens, "rewards": rewards, "groups": groups});
    let (mut anchor, info): (_, AnchorInfo) =
        Anchor::start(&python, work.path(), "train_anchor.py", ANCHOR, &[model_dir.as_os_str()])?;
    eprintln!(
        "kart bench train: {:.1}M parameters, {n} x {} tokens; kart and torch {} take turns",
        parameters as f64 / 1e6,
        w.prompt_tokens + w.response_tokens,
        info.torch
    );
    let mut kart_step = || -> anyhow::Result<Stepped> {
        let mut batch = samples.clone();
        let start = Instant::now();
        let record = learner.step(&mut batch, &config, 0)?;
        let seconds = start.elapsed().as_secs_f64();
        let get = |key: &Key| record.get(key).unwrap_or(f64::NAN);
        Ok(Stepped { seconds, entropy: get(&keys::ACTOR_ENTROPY), kl: get(&keys::ACTOR_KL) })
    };
    let first = (kart_step()?.entropy, anchor.call::<Stepped>(&request)?.entropy);
    let (ours, theirs) = take_turns(steps, &mut kart_step, || anchor.call::<Stepped>(&request))?;
    let mean = |s: &[Stepped]| s.iter().map(|s| s.seconds).sum::<f64>() / s.len() as f64;
    let report = Report {
        parameters,
        threads: i64::from(tch::get_num_threads()),
        anchor: info,
        rows: vec![Row::at_most("GRPO step (s)".into(), mean(&ours), mean(&theirs), 1.0)],
        first_entropy: first,
        last_kl: (ours[steps - 1].kl, theirs[steps - 1].kl),
    };
    println!(
        "model: Qwen2, {:.1}M parameters, f32 on the CPU; batch {n} x {} tokens ({} prompt); threads: kart {}, torch {}",
        parameters as f64 / 1e6,
        w.prompt_tokens + w.response_tokens,
        w.prompt_tokens,
        report.threads,
        report.anchor.threads
    );
    println!("{:<20} {:>10} {:>10} {:>7} {:>8}  met?", "metric", "kart", "torch", "ratio", "target");
    for row in &report.rows {
        let met = if row.met { "yes" } else { "no" };
        println!(
            "{:<20} {:>10.3} {:>10.3} {:>6.2}x {:>8}  {met}",
            row.metric, row.kart, row.anchor, row.ratio, row.target
        );
    }
    println!("first-step entropy: kart {:.6}, torch {:.6}", first.0, first.1);
    println!("last-step KL to the reference: kart {:.3e}, torch {:.3e}", report.last_kl.0, report.last_kl.1);
    if let Some(path) = &args.anchor.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
