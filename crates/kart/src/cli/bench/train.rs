//! `kart bench train`: time per GRPO optimisation step against the same step in PyTorch, on one
//! process or data-parallel over several.
//!
//! Both sides load the same random Qwen2 folder (the model of `kart bench model`) twice, as the
//! policy and the frozen reference, and run identical steps on the same global batch: GRPO
//! advantages, old and reference log-probabilities without gradients, the policy's with gradients,
//! the PPO-clip and low-variance KL losses (token means over the batch), backward, gradient
//! clipping and AdamW. kart runs its trainer's learner ([`learner`], [`Learner::step`]); the
//! anchor (`scripts/bench/train_anchor.py`) writes the step in torch over a transformers model,
//! slicing the full logits to the response as verl does.
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
//! allocator on the CPU); the first setting (f32, every rank holding everything) is the anchor of
//! the ratios.

use super::anchor::{AnchorArgs, Row, check_python, print_rows};
use super::model::{parameter_count, random_model};
use super::parse_device;
use crate::cli::launch::{self, NprocPerNode};
use anyhow::{Context, bail};
use kart_core::agent::trajectory::Trajectory;
use kart_core::config::memory::{Precision, Sharding};
use kart_core::config::train::{BatchConfig, Device, OptimConfig, TrainConfig};
use kart_model::QwenSizes;
use kart_model::config::BENCHMARK_SIZES;
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
    /// Peak dense f32 TFLOP/s of one rank's device, for the model FLOPs utilisation (MFU).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// Instead of the comparison with PyTorch: kart's step time and peak memory per rank in f32
    /// unsharded (the anchor), with activation checkpointing, with ZeRO-2 or full sharding over
    /// `--ranks` (at least 2) ranks besides, then bf16 with checkpointing, unsharded and fully
    /// sharded.
    #[arg(long)]
    memory: bool,
    /// The model: `bench` (46.5M parameters) or `qwen2.5-0.5b` (Qwen2.5-0.5B's shape, random
    /// weights, 8 trajectories of 1024 tokens; for GPUs) [--quick: the fixture's shape].
    #[arg(long, value_enum, default_value_t = Shape::Bench)]
    shape: Shape,
    /// With --memory: leave out the bf16 rows (a CPU without AVX-512 emulates bf16 arithmetic,
    /// and a step of the full workload takes many minutes).
    #[arg(long, requires = "memory")]
    skip_bf16: bool,
    /// One rank of kart's side, in the folder the benchmark prepared (started by the benchmark).
    #[arg(long, hide = true)]
    worker: Option<PathBuf>,
    #[command(flatten)]
    anchor: AnchorArgs,
}

/// The model a run trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Shape {
    /// The benchmark model.
    Bench,
    /// Qwen2.5-0.5B's shape.
    #[value(name = "qwen2.5-0.5b")]
    Qwen25HalfB,
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
        sizes: BENCHMARK_SIZES,
        tokenizer_vocab: 2048,
        groups: 2,
        group_size: 4,
        prompt_tokens: 128,
        response_tokens: 384,
    };

    /// Qwen2.5-0.5B's shape (random weights): 8 trajectories (2 prompts x 4) of 256 prompt and
    /// 768 response tokens.
    const HALF_B: Workload = Workload {
        sizes: QwenSizes {
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            max_position_embeddings: 4096,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        },
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
            (false, Shape::Qwen25HalfB) => Workload::HALF_B,
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
}

#[derive(Debug, Serialize)]
struct Report {
    parameters: i64,
    device: Device,
    tokens: usize,
    /// Model FLOPs of one step: 10 x parameters x tokens (two forward passes without gradients,
    /// one with, and its backward); attention's quadratic term is not counted.
    flops: f64,
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
    check_python(&python, "torch, transformers")?;
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
    let sides = Sides { dir: work.path(), python: &python, steps, device: args.device, threads };
    let mut pairs = vec![];
    for (i, n) in [ranks, 1].into_iter().take(if ranks > 1 { 2 } else { 1 }).enumerate() {
        let (kart, torch) = if i % 2 == 0 {
            let kart = sides.kart(n)?;
            (kart, sides.torch(n)?)
        } else {
            let torch = sides.torch(n)?;
            (sides.kart(n)?, torch)
        };
        pairs.push(Pair { ranks: n, kart, torch });
    }
    let flops = 10.0 * parameters as f64 * tokens as f64;
    let rows = pairs
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
    let scaling_efficiency = (pairs.len() == 2).then(|| {
        let efficiency = |n: &Run, one: &Run| one.seconds() / (ranks as f64 * n.seconds());
        (efficiency(&pairs[0].kart, &pairs[1].kart), efficiency(&pairs[0].torch, &pairs[1].torch))
    });
    let report = Report { parameters, device: args.device, tokens, flops, pairs, rows, scaling_efficiency };
    print_report(&report, &w, args.peak_tflops);
    if let Some(path) = &args.anchor.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(report: &Report, w: &Workload, peak_tflops: Option<f64>) {
    let first = &report.pairs[0];
    println!(
        "model: Qwen2, {:.1}M parameters, f32 on {:?}; batch {} x {} tokens ({} prompt); threads per rank: kart {}, torch {} ({})",
        report.parameters as f64 / 1e6,
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
        let rate = |r: &Run| report.tokens as f64 / r.seconds();
        let (kart, torch) = (rate(&pair.kart), rate(&pair.torch));
        print!("{} rank(s): tokens/s kart {kart:.0}, torch {torch:.0}", pair.ranks);
        if let Some(peak) = peak_tflops {
            let mfu = |r: &Run| report.flops / r.seconds() / (peak * 1e12 * pair.ranks as f64);
            print!("; MFU kart {:.1}%, torch {:.1}%", 100.0 * mfu(&pair.kart), 100.0 * mfu(&pair.torch));
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
        let status = Command::new(self.python)
            .args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &n.to_string()])
            .arg(self.dir.join("train_anchor.py"))
            .args([self.dir.join(MODEL), self.dir.join(BATCH)])
            .arg(self.steps.to_string())
            .arg(&out)
            .arg(device)
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
        stepped.push(Stepped { seconds, entropy: get(&keys::ACTOR_ENTROPY), kl: get(&keys::ACTOR_KL) });
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

/// Memory settings of one `--memory` run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Setup {
    precision: Precision,
    activation_checkpointing: bool,
    sharding: Sharding,
    ranks: usize,
}

impl Setup {
    fn apply(&self, config: &mut TrainConfig) {
        config.precision = Some(self.precision);
        config.activation_checkpointing = self.activation_checkpointing;
        config.sharding = self.sharding;
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

/// `--memory`: kart alone, f32 unsharded (the anchor) against activation checkpointing, against
/// checkpointing with ZeRO-2 or full sharding over the ranks, and bf16 with checkpointing,
/// unsharded and fully sharded, on the same batch.
fn memory(args: &Args, w: &Workload, steps: usize) -> anyhow::Result<ExitCode> {
    let ranks = usize::from(args.ranks).max(2);
    if args.device == Device::Cuda && tch::Cuda::device_count() < ranks as i64 {
        bail!("--memory --device cuda shards over {ranks} GPUs; {} are visible", tch::Cuda::device_count());
    }
    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let (parameters, batch) = w.prepare(work.path(), args.anchor.seed)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let setup = |precision, activation_checkpointing, sharding, ranks| Setup {
        precision,
        activation_checkpointing,
        sharding,
        ranks,
    };
    let mut setups = vec![
        setup(Precision::F32, false, Sharding::None, 1),
        setup(Precision::F32, true, Sharding::None, 1),
        setup(Precision::F32, true, Sharding::Gradients, ranks),
        setup(Precision::F32, true, Sharding::Full, ranks),
    ];
    if !args.skip_bf16 {
        setups.push(setup(Precision::Bf16, true, Sharding::None, 1));
        setups.push(setup(Precision::Bf16, true, Sharding::Full, ranks));
    }
    let mut rows: Vec<MemoryRow> = Vec::new();
    for setup in setups {
        std::fs::write(work.path().join(SETUP), serde_json::to_vec(&setup)?)?;
        let threads = (cores / setup.ranks).max(1);
        let sides = Sides { dir: work.path(), python: Path::new(""), steps, device: args.device, threads };
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
    fn shapes_have_their_models_sizes() {
        let parameters = |shape| {
            let config = kart_model::ModelConfig::qwen2(Workload::of(false, shape).sizes).unwrap();
            kart_model::transformer::parameter_count(&config, "")
        };
        assert_eq!(parameters(Shape::Bench), 46_548_992);
        // Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings).
        assert_eq!(parameters(Shape::Qwen25HalfB), 494_032_768);
        assert_eq!(Workload::of(true, Shape::Qwen25HalfB).sizes, Workload::QUICK.sizes);
    }
}
