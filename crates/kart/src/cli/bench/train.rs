//! `kart bench train`: time per GRPO optimisation step against the same step in PyTorch, on one
//! process or data-parallel over several.
//!
//! Both sides load the same random Qwen2 folder (the model of `kart bench model`) twice, as the
//! policy and the frozen reference, and run identical steps on the same global batch: GRPO
//! advantages, old and reference log-probabilities without gradients, the policy's with gradients,
//! the PPO-clip and low-variance KL losses (token means over the batch), backward, gradient
//! clipping and AdamW. kart runs its trainer's learner ([`learner`], [`Learner::step`]); the
//! anchor (`scripts/bench/train_anchor.py`) writes the step in torch over a transformers model,
//! slicing the full logits to the response as verl does. Both sides compute in `--precision`
//! (f32 by default; bf16 is kart's bf16 weights with f32 master weights against torch's autocast
//! to bf16 over f32 weights) and with `--activation-checkpointing` when asked (transformers'
//! gradient checkpointing on the anchor's side); each reports every step's policy loss and
//! gradient norm besides.
//!
//! With `--ranks N` kart's ranks are started by its launcher (that of `kart train
//! --nproc-per-node`) and all-reduce over c10d, PyTorch's by torchrun under
//! DistributedDataParallel; each rank computes its share of the batch (Gloo on the CPU, NCCL on
//! CUDA). Every rank gets `cores / N` threads, and both sides run again on one rank with as many:
//! the scaling efficiency is `t1 / (N x tN)`. Each side runs as fresh processes (kart N, torch N,
//! torch 1, kart 1), timing a warm-up step and then `--steps` steps, each from a barrier to the
//! end of the optimiser step; the mean of the timed steps is reported, with each side's first
//! entropy and last KL to the reference as the check that they computed the same.
//!
//! With `--memory` kart runs alone, in several memory settings on the same batch, each rank
//! reporting the most bytes of tensors it held at once over the steps (the models and optimiser
//! states included: what `torch.cuda.max_memory_allocated` reads on a GPU, counted by kart's CPU
//! allocator on the CPU); the first setting (every rank holding everything, without
//! checkpointing) is the anchor of the ratios. The sharded settings need two ranks: on one GPU
//! they are left out.
//!
//! With `--lora R` the policy is LoRA adapters of rank R on every projection (alpha 2R) over the
//! frozen base, which with its adapters off is the reference: on kart's side the trainer's own
//! LoRA, on the anchor's PEFT's (`get_peft_model`, the reference pass under `disable_adapter()`),
//! both with AdamW over the adapters alone. kart's full fine-tuning of the same model on the same
//! batch runs too, for the step time and peak memory per rank that LoRA saves.

use super::anchor::{AnchorArgs, Row, check_python, print_rows};
use super::model::{parameter_count, random_model};
use super::shape::Shape;
use super::{parse_device, parse_precision};
use crate::cli::launch::{self, NprocPerNode};
use anyhow::{Context, bail};
use kart_core::agent::trajectory::Trajectory;
use kart_core::config::lora::LoraConfig;
use kart_core::config::memory::{Precision, Sharding};
use kart_core::config::train::{BatchConfig, Device, OptimConfig, TrainConfig};
use kart_model::QwenSizes;
use kart_torch::Ranks;
use kart_train::batch::Sample;
use kart_train::record::{Key, keys};
use kart_train::trainer::learner;
#[cfg(doc)]
use kart_train::update::Learner;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

const ANCHOR: &str = include_str!("../../../../../scripts/bench/train_anchor.py");

/// The files a benchmark run shares with its ranks.
const BATCH: &str = "batch.json";
const MODEL: &str = "model";
const KART_OUT: &str = "kart.json";
const TORCH_OUT: &str = "torch.json";
/// The memory settings kart's ranks train with (`--memory`).
const SETUP: &str = "setup.json";

/// Benchmark a GRPO training step against PyTorch on a random ~50M-parameter Qwen2 model.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Timed steps per side (their mean is reported) [default: 3, 1 with --quick].
    #[arg(long)]
    steps: Option<usize>,
    /// Data-parallel ranks per side (kart's launcher against torchrun and DDP); with more than
    /// one, both sides also run on one rank for the scaling efficiency.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    ranks: u16,
    /// Where both sides compute: `cpu`, or `cuda` (rank r on GPU r).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: Device,
    /// Peak dense TFLOP/s of one rank's device at the step's precision, for the model FLOPs
    /// utilisation (MFU).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// The kind of both sides' weights and compute: `f32` or `bf16` [default: f32; with
    /// --memory: both, a CPU without AVX-512 emulating bf16 slowly].
    #[arg(long, value_parser = parse_precision)]
    precision: Option<Precision>,
    /// Both sides recompute each decoder layer's activations in the backward pass instead of
    /// keeping them.
    #[arg(long, conflicts_with = "memory")]
    activation_checkpointing: bool,
    /// Instead of the comparison with PyTorch: kart's step time and peak memory per rank, in f32
    /// then bf16 (or the one `--precision`): unsharded without and with activation
    /// checkpointing, then with checkpointing sharded over `--ranks` (at least 2) ranks, f32
    /// with ZeRO-2 and with full sharding, bf16 with full sharding.
    #[arg(long)]
    memory: bool,
    /// The model: `bench` (46.5M parameters), or `qwen2.5-0.5b` or `qwen2.5-1.5b` (those
    /// models' shapes, random weights, 8 trajectories of 1024 tokens; for GPUs) [--quick: the
    /// fixture's shape].
    #[arg(long, value_enum, default_value_t = Shape::Bench)]
    shape: Shape,
    /// Train LoRA adapters of this rank (every projection, alpha twice the rank) instead of the
    /// whole model, against PEFT's on the anchor's side and kart's full fine-tuning.
    #[arg(long, conflicts_with = "memory", value_parser = clap::value_parser!(u16).range(1..))]
    lora: Option<u16>,
    /// One rank of kart's side, in the folder the benchmark prepared (started by the benchmark).
    #[arg(long, hide = true)]
    worker: Option<PathBuf>,
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
        sizes: kart_model::config::BENCHMARK_SIZES,
        tokenizer_vocab: 2048,
        groups: 2,
        group_size: 4,
        prompt_tokens: 128,
        response_tokens: 384,
    };

    /// A real model's shape (its sizes filled in by [`Workload::of`]): 8 trajectories (2 prompts
    /// x 4) of 256 prompt and 768 response tokens.
    const LARGE: Workload = Workload {
        sizes: kart_model::config::BENCHMARK_SIZES,
        tokenizer_vocab: 2048,
        groups: 2,
        group_size: 4,
        prompt_tokens: 256,
        response_tokens: 768,
    };

    /// The shape of the fixture model (tiny-qwen2).
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

    /// Writes the random model and the global batch of `seed` into `dir`; returns the model's
    /// parameter count and the batch.
    fn prepare(&self, dir: &Path, seed: u64) -> anyhow::Result<(i64, Batch)> {
        let (policy, _) = random_model(&dir.join(MODEL), self.sizes, self.tokenizer_vocab, seed)?;
        let parameters = parameter_count(&policy);
        let batch = self.batch(seed);
        std::fs::write(dir.join(BATCH), serde_json::to_vec(&batch)?)?;
        Ok((parameters, batch))
    }

    /// The workload of `shape`, or the quick one.
    fn of(quick: bool, shape: Shape) -> Workload {
        match (quick, shape) {
            (true, _) => Workload::QUICK,
            (false, Shape::Bench) => Workload::FULL,
            (false, shape) => Workload { sizes: shape.sizes(), ..Workload::LARGE },
        }
    }

    /// A random global batch of this shape.
    fn batch(&self, seed: u64) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let vocab = self.sizes.vocab_size as i64;
        let n = self.groups * self.group_size;
        let len = self.prompt_tokens + self.response_tokens;
        Batch {
            input_ids: (0..n).map(|_| (0..len).map(|_| rng.random_range(3..vocab)).collect()).collect(),
            rewards: (0..n).map(|_| f64::from(rng.random_range(0..2u8))).collect(),
            groups: (0..n).map(|i| i / self.group_size).collect(),
            prompt_len: self.prompt_tokens,
        }
    }
}

/// The global batch both sides train on (the anchor reads the same JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Batch {
    input_ids: Vec<Vec<i64>>,
    prompt_len: usize,
    rewards: Vec<f64>,
    groups: Vec<usize>,
}

impl Batch {
    fn tokens(&self) -> usize {
        self.input_ids.iter().map(Vec::len).sum()
    }

    /// The trajectories as the trainer's samples.
    fn samples(&self) -> anyhow::Result<Vec<Sample>> {
        let mut samples = Vec::with_capacity(self.input_ids.len());
        for ((ids, &reward), &group) in self.input_ids.iter().zip(&self.rewards).zip(&self.groups) {
            let ids: Vec<u32> = ids.iter().map(|&t| u32::try_from(t)).collect::<Result<_, _>>()?;
            let (prompt, response) = ids.split_at(self.prompt_len);
            let mut t = Trajectory::new(format!("t{group}"), format!("p{group}"), prompt);
            t.push_model(response, &vec![-1.0; response.len()], 0)?;
            t.reward = reward;
            samples.push(Sample::new(&t, group, true));
        }
        Ok(samples)
    }

    /// The trainer's config for one step over the whole batch as one mini-batch (lr 1e-6).
    fn config(&self, model: PathBuf, device: Device) -> TrainConfig {
        let n = self.input_ids.len();
        let prompts = self.groups.iter().max().map_or(1, |g| g + 1);
        TrainConfig {
            model,
            device,
            batch: BatchConfig {
                prompts,
                n: n / prompts,
                mini_batch_prompts: prompts,
                micro_batch_size: n,
                ..Default::default()
            },
            optim: OptimConfig { lr: 1e-6, ..OptimConfig::default() },
            total_steps: 1_000,
            ..TrainConfig::default()
        }
    }
}

/// One timed step of one side.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stepped {
    seconds: f64,
    /// Mean entropy of the policy over the response (from the old-log-probability pass).
    entropy: f64,
    /// The KL loss term (nonzero once the policy has moved from the reference).
    kl: f64,
    /// The PPO-clip loss (a token mean over the batch).
    pg_loss: f64,
    /// The gradients' global norm before clipping.
    grad_norm: f64,
}

/// What rank 0 of a side writes: its threads per rank, versions, and the warm-up step followed
/// by the timed ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Run {
    threads: i64,
    /// Each rank's peak memory over the steps (bytes): the most bytes of tensors alive at once,
    /// the models and optimiser states included.
    #[serde(default)]
    peak_bytes: Vec<u64>,
    #[serde(default)]
    torch: String,
    #[serde(default)]
    transformers: String,
    steps: Vec<Stepped>,
}

impl Run {
    /// Mean seconds of the timed steps.
    fn seconds(&self) -> f64 {
        let timed = &self.steps[1..];
        timed.iter().map(|s| s.seconds).sum::<f64>() / timed.len() as f64
    }
}

/// Both sides on one rank count.
#[derive(Debug, Serialize)]
struct Pair {
    ranks: usize,
    kart: Run,
    torch: Run,
    tokens_per_second: PerSide,
    /// Model FLOPs utilisation against `--peak-tflops` per rank.
    mfu: Option<PerSide>,
}

/// A figure of each side.
#[derive(Debug, Serialize)]
struct PerSide {
    kart: f64,
    torch: f64,
}

impl PerSide {
    fn of(pair: (&Run, &Run), f: impl Fn(&Run) -> f64) -> PerSide {
        PerSide { kart: f(pair.0), torch: f(pair.1) }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    shape: Shape,
    parameters: i64,
    device: Device,
    precision: Precision,
    activation_checkpointing: bool,
    tokens: usize,
    /// Model FLOPs of one step: 10 x parameters x tokens (two forward passes without gradients,
    /// one with, and its backward); attention's quadratic term is not counted.
    flops: f64,
    /// The adapters' rank, with `--lora`.
    lora: Option<u16>,
    /// kart's full fine-tuning on the same batch, with `--lora`.
    full_fine_tuning: Option<Run>,
    pairs: Vec<Pair>,
    rows: Vec<Row>,
    /// kart's and torch's `t1 / (N x tN)`, with more than one rank.
    scaling_efficiency: Option<(f64, f64)>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let steps = args.anchor.or(args.steps, 3, 1);
    if let Some(dir) = &args.worker {
        worker(dir, steps, args.device)?;
        return Ok(ExitCode::SUCCESS);
    }
    let w = Workload::of(args.anchor.quick, args.shape);
    let ranks = usize::from(args.ranks);
    if args.memory {
        return memory(&args, &w, steps);
    }
    if args.device == Device::Cuda && tch::Cuda::device_count() < i64::from(args.ranks) {
        bail!("--device cuda --ranks {ranks}: {} CUDA devices are visible", tch::Cuda::device_count());
    }
    let python = args.anchor.python();
    check_python(
        &python,
        if args.lora.is_some() { "torch, transformers, peft" } else { "torch, transformers" },
    )?;
    let lora = args.lora.map(|r| LoraConfig::all_linear(r.into()));
    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let (parameters, batch) = w.prepare(work.path(), args.anchor.seed)?;
    std::fs::write(work.path().join("train_anchor.py"), ANCHOR)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = (cores / ranks).max(1);
    let tokens = batch.tokens();
    eprintln!(
        "kart bench train: {:.1}M parameters, {} x {} tokens, {ranks} rank(s) of {threads} thread(s) on {:?}",
        parameters as f64 / 1e6,
        batch.input_ids.len(),
        w.prompt_tokens + w.response_tokens,
        args.device
    );
    let precision = args.precision.unwrap_or(Precision::F32);
    let sides = Sides {
        dir: work.path(),
        python: &python,
        steps,
        device: args.device,
        threads,
        precision,
        activation_checkpointing: args.activation_checkpointing,
        lora: args.lora,
    };
    let flops = 10.0 * parameters as f64 * tokens as f64;
    let mut pairs = vec![];
    for (i, n) in [ranks, 1].into_iter().take(if ranks > 1 { 2 } else { 1 }).enumerate() {
        let setup = Setup {
            precision,
            activation_checkpointing: args.activation_checkpointing,
            sharding: Sharding::None,
            ranks: n,
            lora: lora.clone(),
        };
        std::fs::write(work.path().join(SETUP), serde_json::to_vec(&setup)?)?;
        let (kart, torch) = if i % 2 == 0 {
            let kart = sides.kart(n)?;
            (kart, sides.torch(n)?)
        } else {
            let torch = sides.torch(n)?;
            (sides.kart(n)?, torch)
        };
        let tokens_per_second = PerSide::of((&kart, &torch), |r| tokens as f64 / r.seconds());
        let mfu = args
            .peak_tflops
            .map(|peak| PerSide::of((&kart, &torch), |r| flops / r.seconds() / (peak * 1e12 * n as f64)));
        pairs.push(Pair { ranks: n, kart, torch, tokens_per_second, mfu });
    }
    let mut rows: Vec<Row> = pairs
        .iter()
        .map(|p| {
            Row::at_most(
                format!("GRPO step, {} rank(s) (s)", p.ranks),
                p.kart.seconds(),
                p.torch.seconds(),
                1.0,
            )
        })
        .collect();
    // kart's full fine-tuning on as many ranks: the anchor of what LoRA saves.
    let full = match &lora {
        Some(_) => {
            let setup = Setup {
                precision,
                activation_checkpointing: args.activation_checkpointing,
                sharding: Sharding::None,
                ranks,
                lora: None,
            };
            std::fs::write(work.path().join(SETUP), serde_json::to_vec(&setup)?)?;
            let full = Sides { lora: None, ..sides }.kart(ranks)?;
            let lora_run = &pairs[0].kart;
            let peak = |run: &Run| run.peak_bytes.iter().copied().max().unwrap_or(0) as f64 / 1e6;
            rows.push(Row::at_most("LoRA step vs full (s)".into(), lora_run.seconds(), full.seconds(), 1.0));
            rows.push(Row::at_most("LoRA peak MB/rank vs full".into(), peak(lora_run), peak(&full), 1.0));
            Some(full)
        }
        None => None,
    };
    let scaling_efficiency = (pairs.len() == 2).then(|| {
        let efficiency = |n: &Run, one: &Run| one.seconds() / (ranks as f64 * n.seconds());
        (efficiency(&pairs[0].kart, &pairs[1].kart), efficiency(&pairs[0].torch, &pairs[1].torch))
    });
    let report = Report {
        shape: args.shape,
        parameters,
        device: args.device,
        precision,
        activation_checkpointing: args.activation_checkpointing,
        tokens,
        flops,
        lora: args.lora,
        full_fine_tuning: full,
        pairs,
        rows,
        scaling_efficiency,
    };
    print_report(&report, &w);
    if let Some(path) = &args.anchor.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(report: &Report, w: &Workload) {
    let first = &report.pairs[0];
    let lora = report.lora.map(|r| format!(", LoRA rank {r} on every projection (PEFT on torch's side)"));
    println!(
        "model: Qwen2, {:.1}M parameters, {:?}{}{} on {:?}; batch {} x {} tokens ({} prompt); threads per rank: kart {}, torch {} ({})",
        report.parameters as f64 / 1e6,
        report.precision,
        if report.activation_checkpointing { " with activation checkpointing" } else { "" },
        lora.unwrap_or_default(),
        report.device,
        w.groups * w.group_size,
        w.prompt_tokens + w.response_tokens,
        w.prompt_tokens,
        first.kart.threads,
        first.torch.threads,
        first.torch.torch,
    );
    print_rows(&report.rows, "torch");
    for pair in &report.pairs {
        let PerSide { kart, torch } = pair.tokens_per_second;
        print!("{} rank(s): tokens/s kart {kart:.0}, torch {torch:.0}", pair.ranks);
        if let Some(mfu) = &pair.mfu {
            print!("; MFU kart {:.1}%, torch {:.1}%", 100.0 * mfu.kart, 100.0 * mfu.torch);
        }
        println!();
        let last = |r: &Run| r.steps.last().map_or(f64::NAN, |s| s.kl);
        println!(
            "  first-step entropy: kart {:.6}, torch {:.6}; last-step KL to the reference: kart {:.3e}, torch {:.3e}",
            pair.kart.steps[0].entropy,
            pair.torch.steps[0].entropy,
            last(&pair.kart),
            last(&pair.torch)
        );
        let (ours, theirs) = (&pair.kart.steps[0], &pair.torch.steps[0]);
        println!(
            "  first-step policy loss: kart {:.6}, torch {:.6}; gradient norm: kart {:.6}, torch {:.6}",
            ours.pg_loss, theirs.pg_loss, ours.grad_norm, theirs.grad_norm
        );
    }
    if let Some((kart, torch)) = report.scaling_efficiency {
        println!(
            "scaling efficiency, {} ranks vs 1 on the same global batch (t1 / (N x tN)): kart {kart:.2}, torch {torch:.2}",
            first.ranks
        );
    }
}

/// How each side is started.
struct Sides<'a> {
    dir: &'a Path,
    python: &'a Path,
    steps: usize,
    device: Device,
    threads: usize,
    precision: Precision,
    activation_checkpointing: bool,
    /// The anchor's adapters' rank (kart's side reads its own from the setup file).
    lora: Option<u16>,
}

impl Sides<'_> {
    /// kart on `n` ranks, started by its launcher.
    fn kart(&self, n: usize) -> anyhow::Result<Run> {
        let out = self.dir.join(KART_OUT);
        let _ = std::fs::remove_file(&out);
        let device = if self.device == Device::Cuda { "cuda" } else { "cpu" };
        let args = ["bench", "train", "--steps", &self.steps.to_string(), "--device", device, "--worker"]
            .into_iter()
            .map(Into::into)
            .chain([self.dir.as_os_str().to_owned()])
            .collect();
        let code = launch::run(NprocPerNode::Count(n), args, Some(self.threads))?;
        if code != 0 {
            bail!("kart's {n} rank(s) failed (exit code {code}); their errors are above");
        }
        read(&out)
    }

    /// torch on `n` ranks, started by torchrun.
    fn torch(&self, n: usize) -> anyhow::Result<Run> {
        let out = self.dir.join(TORCH_OUT);
        let _ = std::fs::remove_file(&out);
        let device = if self.device == Device::Cuda { "cuda" } else { "cpu" };
        let precision = if self.precision == Precision::Bf16 { "bf16" } else { "f32" };
        let checkpointing = if self.activation_checkpointing { "checkpointing" } else { "keep" };
        let lora = self.lora.map_or("full".to_string(), |r| format!("lora:{r}"));
        let status = Command::new(self.python)
            .args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &n.to_string()])
            .arg(self.dir.join("train_anchor.py"))
            .args([self.dir.join(MODEL), self.dir.join(BATCH)])
            .arg(self.steps.to_string())
            .arg(&out)
            .args([device, precision, checkpointing, &lora])
            .env("OMP_NUM_THREADS", self.threads.to_string())
            .env("TRANSFORMERS_VERBOSITY", "error")
            .status()
            .with_context(|| format!("starting torchrun with {}", self.python.display()))?;
        if !status.success() {
            bail!(
                "torchrun of scripts/bench/train_anchor.py on {n} rank(s) failed ({status}); its error is above"
            );
        }
        read(&out)
    }
}

fn read(path: &Path) -> anyhow::Result<Run> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: {text}", path.display()))
}

/// One rank of kart's side: the trainer's learner on the prepared model, its share of every step.
fn worker(dir: &Path, steps: usize, device: Device) -> anyhow::Result<()> {
    let ranks = Ranks::from_env()?;
    // Counting CPU tensors starts here, before the models are loaded.
    kart_torch::memory::cpu_peak(true);
    let batch: Batch = serde_json::from_slice(&std::fs::read(dir.join(BATCH))?)?;
    let mut config = batch.config(dir.join(MODEL), device);
    if let Ok(setup) = std::fs::read(dir.join(SETUP)) {
        serde_json::from_slice::<Setup>(&setup)?.apply(&mut config);
    }
    let mut learner = learner(&config, None, &ranks)?;
    let meter = match device {
        Device::Cuda => peak::Meter::cuda(ranks.local_rank)?,
        _ => peak::Meter::cpu(),
    };
    let samples = batch.samples()?;
    let mut stepped = Vec::with_capacity(steps + 1);
    for _ in 0..=steps {
        if let Some(parallel) = &learner.parallel {
            parallel.group().barrier()?;
        }
        let mut samples = samples.clone();
        let start = Instant::now();
        let record = learner.step(&mut samples, &config, 0)?;
        let seconds = start.elapsed().as_secs_f64();
        let get = |key: &Key| record.get(key).unwrap_or(f64::NAN);
        stepped.push(Stepped {
            seconds,
            entropy: get(&keys::ACTOR_ENTROPY),
            kl: get(&keys::ACTOR_KL),
            pg_loss: get(&keys::ACTOR_PG_LOSS),
            grad_norm: get(&keys::ACTOR_GRAD_NORM),
        });
    }
    let mut peaks = vec![0f64; ranks.world_size];
    peaks[ranks.rank] = meter.peak()? as f64;
    if let Some(parallel) = &learner.parallel {
        parallel.sum(&mut peaks)?;
    }
    if ranks.is_leader() {
        let run = Run {
            threads: i64::from(tch::get_num_threads()),
            peak_bytes: peaks.into_iter().map(|p| p as u64).collect(),
            torch: String::new(),
            transformers: String::new(),
            steps: stepped,
        };
        std::fs::write(dir.join(KART_OUT), serde_json::to_vec(&run)?)?;
    }
    Ok(())
}

/// The settings kart's ranks train with (each `--memory` run's, or the comparison's).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Setup {
    precision: Precision,
    activation_checkpointing: bool,
    sharding: Sharding,
    ranks: usize,
    #[serde(default)]
    lora: Option<LoraConfig>,
}

impl Setup {
    fn apply(self, config: &mut TrainConfig) {
        config.precision = Some(self.precision);
        config.activation_checkpointing = self.activation_checkpointing;
        config.sharding = self.sharding;
        config.lora = self.lora;
    }

    fn describe(&self) -> String {
        let mut parts = vec![format!("{:?}", self.precision).to_lowercase()];
        if self.activation_checkpointing {
            parts.push("checkpointing".into());
        }
        if self.sharding != Sharding::None {
            parts.push(format!("{:?} sharding", self.sharding).to_lowercase());
        }
        format!("{}, {} rank(s)", parts.join(" + "), self.ranks)
    }
}

/// A `--memory` run's figures.
#[derive(Debug, Serialize)]
struct MemoryRow {
    setup: Setup,
    seconds: f64,
    tokens_per_second: f64,
    peak_bytes_per_rank: u64,
    /// Against the first (f32, unsharded) row.
    memory_ratio: f64,
    time_ratio: f64,
    kl: f64,
}

/// The settings of a `--memory` run in `precisions`, with the sharded ones over `ranks` when
/// there are that many (`None`: one GPU, none sharded).
fn memory_setups(precisions: &[Precision], ranks: Option<usize>) -> Vec<Setup> {
    let setup = |precision, activation_checkpointing, sharding, ranks| Setup {
        precision,
        activation_checkpointing,
        sharding,
        ranks,
        lora: None,
    };
    let mut setups = Vec::new();
    for &precision in precisions {
        setups.push(setup(precision, false, Sharding::None, 1));
        setups.push(setup(precision, true, Sharding::None, 1));
        let sharded = match precision {
            Precision::F32 => [Sharding::Gradients, Sharding::Full].as_slice(),
            Precision::Bf16 => [Sharding::Full].as_slice(),
        };
        if let Some(ranks) = ranks {
            setups.extend(sharded.iter().map(|&sharding| setup(precision, true, sharding, ranks)));
        }
    }
    setups
}

/// `--memory`: kart alone, in the settings of [`memory_setups`] on the same batch, the first
/// (unsharded, activations kept) the anchor of the ratios.
fn memory(args: &Args, w: &Workload, steps: usize) -> anyhow::Result<ExitCode> {
    let ranks = usize::from(args.ranks).max(2);
    let visible = match args.device {
        Device::Cuda => {
            kart_torch::choose("train bench", "--device", args.device, 0)?;
            usize::try_from(tch::Cuda::device_count()).unwrap_or(0)
        }
        _ => usize::MAX,
    };
    if visible < ranks {
        eprintln!(
            "kart bench train --memory: {visible} GPU(s) visible: the sharded settings (over {ranks}) are left out"
        );
    }
    let precisions = match args.precision {
        Some(precision) => vec![precision],
        None => vec![Precision::F32, Precision::Bf16],
    };
    let setups = memory_setups(&precisions, (visible >= ranks).then_some(ranks));
    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let (parameters, batch) = w.prepare(work.path(), args.anchor.seed)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut rows: Vec<MemoryRow> = Vec::new();
    for setup in setups {
        std::fs::write(work.path().join(SETUP), serde_json::to_vec(&setup)?)?;
        let threads = (cores / setup.ranks).max(1);
        let sides = Sides {
            dir: work.path(),
            python: Path::new(""),
            steps,
            device: args.device,
            threads,
            precision: setup.precision,
            activation_checkpointing: setup.activation_checkpointing,
            lora: None,
        };
        let run = sides.kart(setup.ranks)?;
        let peak = run.peak_bytes.iter().copied().max().unwrap_or(0);
        let (seconds, kl) = (run.seconds(), run.steps.last().map_or(f64::NAN, |s| s.kl));
        let (memory_ratio, time_ratio) = match rows.first() {
            Some(first) => (peak as f64 / first.peak_bytes_per_rank as f64, seconds / first.seconds),
            None => (1.0, 1.0),
        };
        let tokens_per_second = batch.tokens() as f64 / seconds;
        rows.push(MemoryRow {
            setup,
            seconds,
            tokens_per_second,
            peak_bytes_per_rank: peak,
            memory_ratio,
            time_ratio,
            kl,
        });
    }
    println!(
        "model: Qwen2, {:.1}M parameters on {:?}; batch {} x {} tokens, one micro-batch; GRPO with a KL reference",
        parameters as f64 / 1e6,
        args.device,
        w.groups * w.group_size,
        w.prompt_tokens + w.response_tokens,
    );
    println!(
        "{:<52} {:>9} {:>9} {:>15} {:>8} {:>8}",
        "setup", "step (s)", "tokens/s", "peak MiB/rank", "memory", "time"
    );
    for r in &rows {
        println!(
            "{:<52} {:>9.2} {:>9.0} {:>15.0} {:>7.2}x {:>7.2}x",
            r.setup.describe(),
            r.seconds,
            r.tokens_per_second,
            r.peak_bytes_per_rank as f64 / f64::from(1 << 20),
            r.memory_ratio,
            r.time_ratio
        );
    }
    let last = rows.last().map_or(f64::NAN, |r| r.memory_ratio);
    println!(
        "target: the last at most 1/3 of the first's memory per rank: {}",
        if last <= 1.0 / 3.0 { "met" } else { "missed" }
    );
    if let Some(path) = &args.anchor.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The peak memory of a step: the bytes of tensors alive at once, counted by kart's CPU
/// allocator or read from the CUDA caching allocator. Either starts from the models and states
/// alive when the meter starts, so the peak holds them.
mod peak {
    /// Where the peak is read.
    pub(super) enum Meter {
        /// kart's counting CPU allocator.
        Cpu,
        /// The CUDA caching allocator's peak of device `index`.
        Cuda { index: usize },
    }

    impl Meter {
        /// Resets the CPU tensors' peak to the bytes alive now.
        pub(super) fn cpu() -> Meter {
            kart_torch::memory::cpu_peak(true);
            Meter::Cpu
        }

        /// Resets the peak of CUDA device `index` to what its tensors hold now (the models).
        pub(super) fn cuda(index: usize) -> anyhow::Result<Meter> {
            kart_torch::memory::cuda_peak(index, true).map_err(anyhow::Error::msg)?;
            Ok(Meter::Cuda { index })
        }

        /// The peak since the meter started, in bytes.
        pub(super) fn peak(&self) -> anyhow::Result<u64> {
            match self {
                Meter::Cpu => Ok(kart_torch::memory::cpu_peak(false)),
                Meter::Cuda { index } => {
                    kart_torch::memory::cuda_peak(*index, false).map_err(anyhow::Error::msg)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_train_their_shapes() {
        for shape in [Shape::Bench, Shape::Qwen25HalfB, Shape::Qwen25OneAndHalfB] {
            assert_eq!(Workload::of(false, shape).sizes, shape.sizes());
            assert_eq!(Workload::of(true, shape).sizes, Workload::QUICK.sizes);
        }
        let large = Workload::of(false, Shape::Qwen25OneAndHalfB);
        assert_eq!((large.groups * large.group_size, large.prompt_tokens + large.response_tokens), (8, 1024));
    }

    #[test]
    fn memory_settings_leave_out_sharding_without_the_ranks() {
        let describe = |setups: Vec<Setup>| setups.iter().map(Setup::describe).collect::<Vec<_>>();
        assert_eq!(
            describe(memory_setups(&[Precision::F32, Precision::Bf16], Some(2))),
            [
                "f32, 1 rank(s)",
                "f32 + checkpointing, 1 rank(s)",
                "f32 + checkpointing + gradients sharding, 2 rank(s)",
                "f32 + checkpointing + full sharding, 2 rank(s)",
                "bf16, 1 rank(s)",
                "bf16 + checkpointing, 1 rank(s)",
                "bf16 + checkpointing + full sharding, 2 rank(s)",
            ]
        );
        assert_eq!(
            describe(memory_setups(&[Precision::Bf16], None)),
            ["bf16, 1 rank(s)", "bf16 + checkpointing, 1 rank(s)"]
        );
    }
}
