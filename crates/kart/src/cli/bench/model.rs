//! `kart bench model`: generation and training speed of the policy model against transformers,
//! and how far apart their logits are.
//!
//! kart initialises a random Qwen2-shaped model (about 50M parameters, or `--shape`), trains a
//! small byte-level BPE tokenizer, and saves both as a Hugging Face folder; the anchor
//! (`scripts/bench/model_anchor.py`, run with the project venv's Python) loads that folder, so both
//! sides run exactly the same weights, on the same `--device` in the same `--precision` (f32 on
//! the CPU by default, with torch's default number of threads).
//! - Logits: of the same 4 prompts, the largest absolute difference between the two sides' and
//!   the share of positions whose most likely token agrees.
//! - Generation: greedy, exactly `new_tokens` tokens after the same random prompts, at batch 1 and
//!   batch 32; kart's engine against `model.generate` under `torch.inference_mode`. The median of
//!   the timed runs, after a warm-up run, is reported as tokens per second.
//! - Training step: forward and backward of the loss -mean log p(next token) on one batch; kart
//!   through [`token_logprobs`], the anchor through `log_softmax` and `gather` over the logits. The
//!   mean of the timed steps, after a warm-up step, is reported.
//!
//! - With `--vllm PYTHON`, generation also on vLLM serving the same folder (a second anchor,
//!   [`super::vllm`]): the engine users would otherwise run, at batch 1 and 32, no target.
//!
//! The anchor stays up for the whole run and the two sides take turns, each timed run of one
//! followed by one of the other, so that a change in the machine's load affects both alike. Both
//! sides also report their greedy tokens and their loss: the table comes with a check that they
//! computed the same thing.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use super::anchor::{Anchor, AnchorArgs, Row, check_python, median, take_turns};
use super::shape::Shape;
use super::vllm::VllmAnchor;
use super::{parse_device, parse_precision};
use anyhow::Context;
use kart_core::config::memory::Precision;
use kart_core::config::train::Device as ConfiguredDevice;
use kart_core::generation::GenerationRequest;
use kart_core::generation::SamplingParams;
use kart_model::logprobs::{DEFAULT_CHUNK, token_logprobs};
use kart_model::{CausalLm, ModelConfig, QwenSizes, generate, save_pretrained};
use kart_tokenizer::CHATML;
use kart_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// The anchor script, carried in the binary so the bench runs from any folder.
const ANCHOR: &str = include_str!("../../../../../scripts/bench/model_anchor.py");

/// The special tokens of the benchmark's tokenizer (Qwen's).
const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Prompts whose logits the two sides compare (a 0.5B model's are 10 MB each in f32).
const LOGIT_PROMPTS: usize = 4;

/// Benchmark the policy model against transformers on a random ~50M-parameter Qwen2 model.
///
/// Prints, for generation at batch 1 and 32 (tokens per second) and for a training step (seconds),
/// kart's figure, transformers' figure, their ratio and the target. Exits 1 when the anchor cannot
/// run (its Python lacks torch or transformers: `bash scripts/setup.sh` installs them).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Timed generation runs per batch size (the median is reported) [default: 3, 1 with --quick].
    #[arg(long)]
    runs: Option<usize>,
    /// Timed training steps (their mean is reported) [default: 3, 1 with --quick].
    #[arg(long)]
    steps: Option<usize>,
    /// Where both sides run: `cpu`, or `cuda` (the first GPU).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    device: ConfiguredDevice,
    /// The kind of both sides' weights and compute: `f32` or `bf16`.
    #[arg(long, default_value = "f32", value_parser = parse_precision)]
    precision: Precision,
    /// The model (random weights) [--quick: a 0.2M-parameter one].
    #[arg(long, value_enum, default_value_t = Shape::Bench)]
    shape: Shape,
    /// The Python of a vLLM installation (`.venv-vllm/bin/python`, which `scripts/vllm/setup.sh`
    /// makes): also times generation on vLLM serving the same model.
    #[arg(long, value_name = "PYTHON")]
    vllm: Option<PathBuf>,
    #[command(flatten)]
    anchor: AnchorArgs,
}

/// The model and the work measured on it.
#[derive(Debug, Clone, Copy)]
struct Workload {
    sizes: QwenSizes,
    prompt_tokens: usize,
    new_tokens: usize,
    warmup_tokens: usize,
    batches: [usize; 2],
    train_batch: usize,
    train_tokens: usize,
    tokenizer_vocab: usize,
}

impl Workload {
    /// The benchmark: 46.5M parameters (or another shape's), 128 tokens at batch 1 and 32, a
    /// 16 x 512 training batch.
    const FULL: Workload = Workload {
        sizes: kart_model::config::BENCHMARK_SIZES,
        prompt_tokens: 16,
        new_tokens: 128,
        warmup_tokens: 8,
        batches: [1, 32],
        train_batch: 16,
        train_tokens: 512,
        tokenizer_vocab: 2048,
    };

    /// `--quick`: the same measurements on a 0.2M-parameter model and a small workload (heads
    /// of 32, the smallest vLLM's CPU attention takes).
    const QUICK: Workload = Workload {
        sizes: QwenSizes {
            vocab_size: 2048,
            hidden_size: 64,
            intermediate_size: 192,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            max_position_embeddings: 256,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        },
        prompt_tokens: 8,
        new_tokens: 8,
        warmup_tokens: 2,
        batches: [1, 4],
        train_batch: 2,
        train_tokens: 32,
        tokenizer_vocab: 512,
    };
}

/// A greedy generation run.
#[derive(Debug, Deserialize)]
struct Generated {
    seconds: f64,
    /// One row of generated tokens per prompt.
    tokens: Vec<Vec<u32>>,
}

/// A training step.
#[derive(Debug, Deserialize)]
struct Trained {
    seconds: f64,
    loss: f64,
}

/// The anchor's first line: its configuration.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct AnchorInfo {
    threads: i64,
    torch: String,
    transformers: String,
}

/// How far the two sides' logits of the same prompts are apart.
#[derive(Debug, Serialize)]
struct LogitsGap {
    /// The largest absolute difference over every position and token.
    max_abs_diff: f64,
    /// The share of positions whose most likely token is the same on both sides.
    argmax_agreement: f64,
    positions: i64,
}

/// The whole report, as `--json` writes it.
#[derive(Debug, Serialize)]
struct Report {
    shape: Shape,
    /// Where both sides ran, e.g. `Cuda(0)`.
    device: String,
    precision: Precision,
    parameters: i64,
    /// kart's threads (torch's default); the anchor's are in `anchor`.
    threads: i64,
    anchor: AnchorInfo,
    rows: Vec<Row>,
    /// Per batch size, the prompts whose greedy continuations are identical on both sides.
    identical_greedy: Vec<(usize, usize)>,
    loss: Losses,
    logits: LogitsGap,
    /// Generation against vLLM, with `--vllm`.
    vllm: Option<AgainstVllm>,
}

/// kart's generation against vLLM's on the same model.
#[derive(Debug, Serialize)]
struct AgainstVllm {
    version: String,
    rows: Vec<VllmRow>,
}

/// One batch size of [`AgainstVllm`].
#[derive(Debug, Serialize)]
struct VllmRow {
    batch: usize,
    /// Tokens per second.
    kart: f64,
    vllm: f64,
    /// kart / vLLM.
    ratio: f64,
    /// The prompts whose greedy continuations are identical on both.
    identical_greedy: usize,
}

#[derive(Debug, Serialize)]
struct Losses {
    kart: f64,
    anchor: f64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let workload = match args.anchor.quick {
        true => Workload::QUICK,
        false => Workload { sizes: args.shape.sizes(), ..Workload::FULL },
    };
    let runs = args.anchor.or(args.runs, 3, 1);
    let steps = args.anchor.or(args.steps, 3, 1);
    let python = args.anchor.python();
    check_python(&python, "torch, transformers, safetensors")?;
    let device = kart_torch::choose("model bench", "--device", args.device, 0)?;
    let (kind, dtype) = match args.precision {
        Precision::F32 => (Kind::Float, "float32"),
        Precision::Bf16 => (Kind::BFloat16, "bfloat16"),
    };

    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let model_dir = work.path().join("model");
    let (model, tokenizer) =
        random_model(&model_dir, workload.sizes, workload.tokenizer_vocab, args.anchor.seed)?;
    let max_len = workload.prompt_tokens + workload.new_tokens;
    let vllm = args.vllm.as_deref().map(|python| VllmAnchor::start(python, &model_dir, dtype, max_len));
    let vllm = vllm.transpose()?;
    let parameters = parameter_count(&model);
    // The measured model: the saved one, where and as the run asks.
    let model = match (device, kind) {
        (Device::Cpu, Kind::Float) => model,
        _ => {
            drop(model);
            CausalLm::load_as(&model_dir, device, kind)?
        }
    };
    let device_name = format!("{device:?}");

    let mut rng = ChaCha8Rng::seed_from_u64(args.anchor.seed);
    let first_token = SPECIAL_TOKENS.len() as u32;
    let vocab = workload.sizes.vocab_size as u32;
    let mut random_row =
        |len: usize| -> Vec<u32> { (0..len).map(|_| rng.random_range(first_token..vocab)).collect() };
    let largest_batch = workload.batches.iter().copied().max().unwrap_or(1);
    let prompts: Vec<Vec<u32>> = (0..largest_batch).map(|_| random_row(workload.prompt_tokens)).collect();
    let train_ids: Vec<Vec<i64>> = (0..workload.train_batch)
        .map(|_| random_row(workload.train_tokens).into_iter().map(i64::from).collect())
        .collect();

    let anchor_device = if device.is_cuda() { "cuda" } else { "cpu" };
    let anchor_args = [model_dir.as_os_str(), anchor_device.as_ref(), dtype.as_ref()];
    let (mut anchor, info): (_, AnchorInfo) =
        Anchor::start(&python, work.path(), "model_anchor.py", ANCHOR, &anchor_args)?;
    eprintln!(
        "kart bench model: {:.1}M parameters, {dtype} on {device_name}; kart and transformers {} (torch {}) take turns",
        parameters as f64 / 1e6,
        info.transformers,
        info.torch
    );
    let logits = logits_gap(&model, &mut anchor, &prompts[..LOGIT_PROMPTS.min(prompts.len())], work.path())?;

    let mut rows = Vec::new();
    let mut identical_greedy = Vec::new();
    let mut vllm_rows = Vec::new();
    for batch in workload.batches {
        let prompts = &prompts[..batch];
        anchor_generate(&mut anchor, prompts, workload.warmup_tokens)?;
        kart_generate(&model, &tokenizer, prompts, workload.warmup_tokens)?;
        if let Some(vllm) = &vllm {
            vllm.generate(prompts, workload.warmup_tokens)?;
        }
        // Each of kart's runs followed (or preceded) by one of transformers and one of vLLM.
        let (ours, theirs) = take_turns(
            runs,
            || kart_generate(&model, &tokenizer, prompts, workload.new_tokens),
            || {
                let transformers = anchor_generate(&mut anchor, prompts, workload.new_tokens)?;
                let vllm = vllm.as_ref().map(|v| v.generate(prompts, workload.new_tokens)).transpose()?;
                anyhow::Ok((transformers, vllm))
            },
        )?;
        let tokens = (batch * workload.new_tokens) as f64;
        let speed = |seconds: &mut dyn Iterator<Item = f64>| tokens / median(seconds);
        let kart_speed = speed(&mut ours.iter().map(|r| r.seconds));
        let metric = format!("generate, batch {batch} (tokens/s)");
        let target = if batch == 1 { 1.0 } else { 1.5 };
        let transformers_speed = speed(&mut theirs.iter().map(|(t, _)| t.seconds));
        rows.push(Row::at_least(metric, kart_speed, transformers_speed, target));
        let same =
            |theirs: &[Vec<u32>]| ours[runs - 1].tokens.iter().zip(theirs).filter(|(a, b)| a == b).count();
        identical_greedy.push((batch, same(&theirs[runs - 1].0.tokens)));
        if vllm.is_some() {
            let vllm_runs: Vec<_> = theirs.iter().filter_map(|(_, v)| v.as_ref()).collect();
            let vllm_speed = speed(&mut vllm_runs.iter().map(|(seconds, _)| *seconds));
            let identical_greedy = same(&vllm_runs[runs - 1].1);
            let ratio = kart_speed / vllm_speed;
            vllm_rows.push(VllmRow { batch, kart: kart_speed, vllm: vllm_speed, ratio, identical_greedy });
        }
    }

    let ids = Tensor::from_slice(&train_ids.concat()).view([train_ids.len() as i64, -1]).to_device(device);
    anchor_train(&mut anchor, &train_ids)?;
    kart_train(&model, &ids);
    let (ours, theirs) =
        take_turns(steps, || Ok(kart_train(&model, &ids)), || anchor_train(&mut anchor, &train_ids))?;
    let step_time = |steps: &[Trained]| steps.iter().map(|s| s.seconds).sum::<f64>() / steps.len() as f64;
    rows.push(Row::at_most(
        "train step, forward + backward (s)".to_owned(),
        step_time(&ours),
        step_time(&theirs),
        1.0,
    ));

    let report = Report {
        shape: args.shape,
        device: device_name,
        precision: args.precision,
        parameters,
        threads: i64::from(tch::get_num_threads()),
        anchor: info.clone(),
        rows,
        identical_greedy,
        loss: Losses { kart: ours[steps - 1].loss, anchor: theirs[steps - 1].loss },
        logits,
        vllm: vllm.map(|v| AgainstVllm { version: v.version.clone(), rows: vllm_rows }),
    };
    print_report(&report, &workload);
    if let Some(path) = &args.anchor.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn anchor_generate(
    anchor: &mut Anchor,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> anyhow::Result<Generated> {
    anchor.call(&json!({"op": "generate", "prompts": prompts, "new_tokens": new_tokens}))
}

fn anchor_train(anchor: &mut Anchor, input_ids: &[Vec<i64>]) -> anyhow::Result<Trained> {
    anchor.call(&json!({"op": "train", "input_ids": input_ids}))
}

/// Both sides' logits of `prompts`, compared: the anchor writes its own (f32) into `work`.
fn logits_gap(
    model: &CausalLm,
    anchor: &mut Anchor,
    prompts: &[Vec<u32>],
    work: &std::path::Path,
) -> anyhow::Result<LogitsGap> {
    let path = work.join("anchor-logits.safetensors");
    let _: serde_json::Value = anchor.call(&json!({"op": "logits", "input_ids": prompts, "out": path}))?;
    let theirs = Tensor::read_safetensors(&path)?
        .into_iter()
        .find_map(|(name, t)| (name == "logits").then_some(t))
        .context("the anchor's logits file holds no `logits`")?;
    let rows: Vec<i64> = prompts.iter().flatten().map(|&t| i64::from(t)).collect();
    let ids = Tensor::from_slice(&rows).view([prompts.len() as i64, -1]).to_device(model.device());
    let (batch, len) = ids.size2()?;
    let ours = tch::no_grad(|| {
        let positions = Tensor::arange(len, (Kind::Int64, model.device())).expand([batch, len], false);
        let hidden = model.forward(&ids, &positions, None, None);
        model.lm_head(&hidden).to_kind(Kind::Float).to_device(Device::Cpu)
    });
    anyhow::ensure!(
        ours.size() == theirs.size(),
        "logits of shapes {:?} and {:?}",
        ours.size(),
        theirs.size()
    );
    let max_abs_diff = (&ours - &theirs).abs().max().double_value(&[]);
    let agree = ours.argmax(-1, false).eq_tensor(&theirs.argmax(-1, false));
    let argmax_agreement = agree.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
    Ok(LogitsGap { max_abs_diff, argmax_agreement, positions: batch * len })
}

/// A random Qwen2 model of `sizes` with a freshly trained tokenizer, saved to `dir` as a Hugging
/// Face folder both sides load.
pub(super) fn random_model(
    dir: &std::path::Path,
    sizes: QwenSizes,
    tokenizer_vocab: usize,
    seed: u64,
) -> anyhow::Result<(CausalLm, Tokenizer)> {
    let config = ModelConfig::qwen2(sizes)?;
    let model = CausalLm::random(config.clone(), Device::Cpu, seed)?;
    let tokenizer = train_tokenizer(tokenizer_vocab)?;
    save_pretrained(dir, &config, &model.named_tensors(), None, Kind::Float)?;
    tokenizer.save(dir, Some(CHATML))?;
    Ok((model, tokenizer))
}

/// Parameters of a model (a tied head counted once).
pub(super) fn parameter_count(model: &CausalLm) -> i64 {
    kart_model::transformer::parameter_count(model.config(), "") as i64
}

/// A small byte-level BPE trained on generated English-like text: the saved folder gets a
/// tokenizer like a real model's (the benchmark itself feeds token ids).
fn train_tokenizer(vocab_size: usize) -> anyhow::Result<Tokenizer> {
    const WORDS: [&str; 24] = [
        "the", "agent", "searches", "for", "a", "passage", "about", "river", "which", "answer", "is",
        "correct", "model", "reads", "page", "and", "then", "writes", "short", "summary", "of", "question",
        "in", "Paris",
    ];
    let sentences: Vec<String> = (0..2000)
        .map(|i: usize| {
            let words = (0..12).map(|j| WORDS[(i * 7 + j * j * 3 + j) % WORDS.len()]);
            words.collect::<Vec<_>>().join(" ") + "."
        })
        .collect();
    let texts = sentences.iter().map(String::as_str);
    Ok(Tokenizer::train_byte_level_bpe(texts, vocab_size, &SPECIAL_TOKENS, "<|im_end|>", "<|endoftext|>")?)
}

/// The benchmark's request: greedy, exactly `new_tokens` tokens after `prompt`.
pub(super) fn greedy(prompt: &[u32], new_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        input_ids: prompt.to_vec(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        max_new_tokens: new_tokens,
        stop: Vec::new(),
        stop_token_ids: Vec::new(),
        ignore_eos: true,
    }
}

/// kart's greedy generation of exactly `new_tokens` tokens after each prompt, all in one batch.
fn kart_generate(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> anyhow::Result<Generated> {
    let requests = prompts.iter().map(|prompt| greedy(prompt, new_tokens)).collect();
    let start = Instant::now();
    let generations = generate(model, tokenizer, requests, prompts.len(), 0)?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Generated { seconds, tokens: generations.into_iter().map(|g| g.token_ids).collect() })
}

/// kart's training step: forward, loss = -mean log p(next token), backward, gradients cleared.
fn kart_train(model: &CausalLm, ids: &Tensor) -> Trained {
    let start = Instant::now();
    let (batch, len) = ids.size2().expect("(B, T) token ids");
    let positions = Tensor::arange(len, (Kind::Int64, ids.device())).expand([batch, len], false);
    let hidden = model.forward(ids, &positions, None, None);
    let (inputs, targets) = (hidden.narrow(1, 0, len - 1), ids.narrow(1, 1, len - 1));
    let logprobs = token_logprobs(model, &inputs, &targets, 1.0, false, DEFAULT_CHUNK).logprobs;
    let loss = -logprobs.mean(Kind::Float);
    loss.backward();
    for mut variable in model.var_store().trainable_variables() {
        variable.zero_grad();
    }
    let loss = loss.double_value(&[]);
    Trained { seconds: start.elapsed().as_secs_f64(), loss }
}

fn print_report(report: &Report, workload: &Workload) {
    let s = &workload.sizes;
    println!(
        "model: Qwen2, {:.1}M parameters (vocab {}, hidden {}, {} layers, {}/{} heads), {:?} on {}",
        report.parameters as f64 / 1e6,
        s.vocab_size,
        s.hidden_size,
        s.num_hidden_layers,
        s.num_attention_heads,
        s.num_key_value_heads,
        report.precision,
        report.device
    );
    println!(
        "workload: {}-token prompts, {} new tokens (greedy); training batch {} x {}",
        workload.prompt_tokens, workload.new_tokens, workload.train_batch, workload.train_tokens
    );
    let anchor = &report.anchor;
    println!(
        "threads: kart {}, transformers {} (transformers {}, torch {})",
        report.threads, anchor.threads, anchor.transformers, anchor.torch
    );
    println!();
    println!("{:<36} {:>10} {:>13} {:>7} {:>8}  met?", "metric", "kart", "transformers", "ratio", "target");
    for row in &report.rows {
        println!(
            "{:<36} {:>10.3} {:>13.3} {:>6.2}x {:>8}  {}",
            row.metric,
            row.kart,
            row.anchor,
            row.ratio,
            row.target,
            if row.met { "yes" } else { "no" }
        );
    }
    println!();
    for (batch, same) in &report.identical_greedy {
        println!("greedy tokens identical at batch {batch}: {same}/{batch} prompts");
    }
    println!("training loss: kart {:.6}, transformers {:.6}", report.loss.kart, report.loss.anchor);
    if let Some(vllm) = &report.vllm {
        println!();
        println!("generation against vLLM {} on the same model (no target):", vllm.version);
        println!("{:<36} {:>10} {:>13} {:>7}  identical greedy", "metric", "kart", "vLLM", "ratio");
        for row in &vllm.rows {
            println!(
                "{:<36} {:>10.3} {:>13.3} {:>6.2}x  {}/{}",
                format!("generate, batch {} (tokens/s)", row.batch),
                row.kart,
                row.vllm,
                row.ratio,
                row.identical_greedy,
                row.batch
            );
        }
    }
    let gap = &report.logits;
    println!(
        "logits of {} positions: largest absolute difference {:.3e}; most likely token the same at {:.1}%",
        gap.positions,
        gap.max_abs_diff,
        100.0 * gap.argmax_agreement
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_alternate_who_goes_first() {
        let order = std::cell::RefCell::new(Vec::new());
        let turn = |side| {
            order.borrow_mut().push(side);
            Ok(())
        };
        let (ours, theirs) = take_turns(3, || turn("kart"), || turn("anchor")).unwrap();
        assert_eq!((ours.len(), theirs.len()), (3, 3));
        assert_eq!(*order.borrow(), ["kart", "anchor", "anchor", "kart", "kart", "anchor"]);
    }

    #[test]
    fn rows_compare_against_their_target() {
        let fast = Row::at_least("generate".to_owned(), 150.0, 100.0, 1.5);
        assert!(fast.met && fast.target == ">= 1.5x" && fast.ratio == 1.5);
        let slow = Row::at_most("train".to_owned(), 1.1, 1.0, 1.0);
        assert!(!slow.met && slow.target == "<= 1.0x");
    }
}
