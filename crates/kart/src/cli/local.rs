//! `kart local`: a search agent trained on this CPU in minutes. World, index, tokenizer, tiny
//! model, warm start, then RL through the trainer with its in-process pool (the embedded engine
//! and the BM25 index behind the same traits the services use), all under one output folder.

use anyhow::Context;
use clap::Args;
use kart::local::copy_drill::copy_drills;
use kart::local::copy_probe::{self, CopyProbe, ProbeSet};
use kart::local::fact_drill::fact_drills;
use kart::local::format::AgentFormat;
use kart::local::gold::GoldConfig;
use kart::local::reading;
use kart::local::warm_start::{self, Agent, Lessons, WarmStart};
use kart::local::world::{DatasetPaths, World, WorldConfig};
use kart_core::config::lora::LoraConfig;
use kart_core::config::train::{
    AdvantageEstimator, AlgorithmConfig, BatchConfig, CheckpointConfig, DataConfig, DataFormat, Device,
    EvalConfig, OptimConfig, RolloutSource, Sampling, TrainConfig,
};
use kart_model::{CausalLm, ModelConfig, QwenSizes, save_pretrained};
use kart_retriever::bm25::{self, Bm25Index};
use kart_tokenizer::{ChatTemplate, Tokenizer};
use kart_train::data::Dataset;
use kart_train::eval::Evaluation;
use kart_train::record::keys;
use kart_train::server::StatusHandle;
use kart_train::trainer::{RunSummary, Serving, Trainer};
use kart_train::weights::WeightStore;
use prometheus::Registry;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Train a tiny search agent on this CPU: a synthetic world of invented people and companies, a
/// BPE tokenizer and a Qwen2-shaped model made from scratch, a supervised warm start on gold
/// Search-R1 trajectories (some deliberately imperfect), then RL with the in-process BM25
/// retriever; prints held-out figures before and after RL.
#[derive(Debug, Clone, Args, Serialize)]
pub struct LocalArgs {
    /// Output folder (world, models, warm-start losses, metrics, chart, summary.json); an earlier
    /// run's are replaced.
    #[arg(long, default_value = "kart-local")]
    out: PathBuf,
    /// Seed of the world, the model and every sampling decision.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How the agent calls its search tool: `search-r1` (`<search>` tags, the Search-R1
    /// environment) or `tools` (function calls in Qwen2.5's chat-template format, the tools
    /// environment).
    #[arg(long, value_enum, default_value_t = AgentFormat::SearchR1)]
    env: AgentFormat,
    /// People in the world (companies and cities scale with it).
    #[arg(long, default_value_t = 3000)]
    persons: usize,
    /// RL training questions: about persons and companies no warm-start trajectory names, so
    /// their rewards come from searching, not from what the warm start memorised.
    #[arg(long, default_value_t = 600)]
    rl_questions: usize,
    /// Share of two-hop questions.
    #[arg(long, default_value_t = 0.4)]
    two_hop_share: f64,
    /// Hidden size of the model.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Decoder layers of the model.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads of the model.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Standard deviation of the model's initial weights. Larger than transformers' 0.02: a tiny
    /// model starting from 0.02 takes far longer to learn to copy names from the prompt and the
    /// search results.
    #[arg(long, default_value_t = 0.1)]
    init_std: f64,
    /// Largest vocabulary of the tokenizer (BPE stops merging once every word is one token).
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    /// Warm-start updates on the gold trajectories (default: 1000, and 1500 with `--env tools`,
    /// whose trajectories are half again as long).
    #[arg(long)]
    warm_steps: Option<u64>,
    /// Updates on copy drills (words of the corpus, then the same words again) before the gold
    /// trajectories: the model made from scratch learns to copy what it has read before it
    /// learns the agent's format (0: none).
    #[arg(long, default_value_t = 1500)]
    copy_drills: u64,
    /// Updates on fact drills (passages about made-up persons and companies, then facts read
    /// from them in the gold reasoning's words) after the copy drills: the model learns to look a
    /// value up by its subject, not only to repeat what it read (0: none).
    #[arg(long, default_value_t = 1000)]
    fact_drills: u64,
    /// During the gold phase, one more fact-drill update after every this many gold updates,
    /// whose fresh values can only be looked up (0: none; the gold trajectories' own fresh
    /// draws do the same, and the lookup formed sooner without the drills between them).
    #[arg(long, default_value_t = 0)]
    fact_drill_every: u64,
    /// Draws of the warm-start persons' and companies' facts (birthplaces, years, employers,
    /// spouses, headquarters; the names and questions stay) that the gold trajectories are read
    /// from, one per pass over the warm-start questions, cycled: a later pass over a question
    /// states other facts, so its values can only be copied from the search results, never
    /// recalled from an earlier pass (default: one per pass, the extra rounds' included; 1: the
    /// world's own facts only).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    gold_draws: Option<u64>,
    /// Gold trajectories per warm-start update.
    #[arg(long, default_value_t = 8)]
    warm_batch: usize,
    /// Peak learning rate of each warm-start phase: the drills, then the gold updates, each
    /// warming up and decaying on a cosine of its own.
    #[arg(long, default_value_t = 2e-3)]
    warm_lr: f64,
    /// Extra warm-start rounds while the copy probe fails (values of RL questions' passages the
    /// warm start never trained on, copied teacher-forced): each round a quarter of the gold
    /// updates more at half the learning rate, continuing through the fresh draws (0: probe
    /// only).
    #[arg(long, default_value_t = 2)]
    probe_rounds: u32,
    /// Share of imperfect gold trajectories (wrong query, no search, first hop only).
    #[arg(long, default_value_t = GoldConfig::default().corrupt_share)]
    corrupt_share: f64,
    /// Share of the year questions (birth and founding years) whose gold trajectory answers from
    /// memory without searching: a habit greedy decoding shows and RL has to unlearn.
    #[arg(long, default_value_t = GoldConfig::default().year_guess_share)]
    year_guess_share: f64,
    /// Share of the two-hop questions whose gold trajectory answers with the bridge entity after
    /// the first hop: a habit greedy decoding shows and RL has to unlearn.
    #[arg(long, default_value_t = GoldConfig::default().first_hop_share)]
    first_hop_share: f64,
    /// RL steps.
    #[arg(long, default_value_t = 20)]
    steps: u64,
    /// Questions per RL step.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    /// Trajectories per question.
    #[arg(long, default_value_t = 8)]
    n: usize,
    /// Advantage estimator: grpo, drgrpo, rloo or gae.
    #[arg(long, default_value = "grpo")]
    algorithm: AdvantageEstimator,
    /// RL learning rate.
    #[arg(long, default_value_t = 2e-4)]
    lr: f64,
    /// Sampling temperature of training rollouts.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// DAPO's dynamic sampling: train only groups whose rewards differ, over-sampling questions
    /// to refill the step (a step where every group of every round has equal rewards fails).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dynamic_sampling: bool,
    /// Batches rolled out ahead of the one trained (0: synchronous; k: tokens up to k policy
    /// versions old are trained, with decoupled PPO).
    #[arg(long, default_value_t = 0)]
    max_staleness: u64,
    /// RL trains LoRA adapters of this rank (every projection, alpha twice the rank) on the
    /// warm-started model instead of all its weights; the reference is the warm-started model
    /// itself, and `model/` at the end the adapters (`kart convert merge-lora` merges them).
    /// Adapters usually want a larger `--lr` than full fine-tuning.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    lora: Option<u16>,
    /// Held-out questions evaluated greedily before and after RL.
    #[arg(long, default_value_t = 200)]
    eval_questions: usize,
    /// Trajectories per held-out question also sampled at the training temperature; their mean
    /// reward is reported beside the greedy figures (0: greedy only).
    #[arg(long, default_value_t = 1)]
    eval_samples: usize,
    /// Where the warm start and RL run: `cpu`, or `cuda` (the first GPU; the warm start in f32,
    /// RL in the trainer's default bf16 there).
    #[arg(long, default_value = "cpu", value_parser = super::parse_device)]
    device: Device,
    /// A first look in about two minutes on two cores: the whole loop (world, warm start, a
    /// few RL steps, the evaluations, the chart and the trajectories) on a smaller world and
    /// model, without the defaults' claim that the agent learns. It sets the sizes and counts of
    /// the world, the model, the warm start and RL, so it cannot be combined with their flags.
    #[arg(long, conflicts_with_all = QUICK_SETS)]
    quick: bool,
}

/// The flags `--quick` sets.
const QUICK_SETS: [&str; 17] = [
    "persons",
    "rl_questions",
    "hidden",
    "layers",
    "heads",
    "vocab",
    "warm_steps",
    "copy_drills",
    "fact_drills",
    "fact_drill_every",
    "probe_rounds",
    "steps",
    "prompts",
    "n",
    "eval_questions",
    "eval_samples",
    "dynamic_sampling",
];

impl LocalArgs {
    /// The arguments with `--quick`'s sizes and counts in place (the others unchanged).
    fn resolved(self) -> LocalArgs {
        if !self.quick {
            return self;
        }
        LocalArgs {
            persons: 1000,
            rl_questions: 200,
            hidden: 64,
            layers: 2,
            heads: 2,
            vocab: 4096,
            warm_steps: Some(500),
            copy_drills: 300,
            fact_drills: 100,
            fact_drill_every: 0,
            probe_rounds: 0,
            steps: 6,
            prompts: 8,
            n: 4,
            eval_questions: 40,
            eval_samples: 0,
            // A step whose groups all have equal rewards trains nothing rather than failing.
            dynamic_sampling: false,
            ..self
        }
    }
}

/// The run's settings, resolved from the arguments.
struct Config {
    out: PathBuf,
    seed: u64,
    format: AgentFormat,
    world: WorldConfig,
    hidden: usize,
    layers: usize,
    heads: usize,
    init_std: f64,
    vocab: usize,
    warm_start: WarmStart,
    /// Draws of the warm-start facts (`None`: one per pass over the warm-start questions).
    gold_draws: Option<u64>,
    probe_rounds: u32,
    rl_steps: u64,
    prompts: usize,
    n: usize,
    algorithm: AdvantageEstimator,
    rl_lr: f64,
    temperature: f64,
    dynamic_sampling: bool,
    max_staleness: u64,
    lora: Option<LoraConfig>,
    eval_questions: usize,
    eval_samples: usize,
    device: Device,
}

/// The figures of the closing table at one point of the run: greedy, and the mean reward of
/// samples at the training temperature.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub exact_match: f64,
    pub mean_reward: f64,
    pub searches_per_trajectory: f64,
    pub valid_format: f64,
    pub sampled_mean_reward: Option<f64>,
}

impl From<&Evaluation> for Figures {
    fn from(e: &Evaluation) -> Self {
        let s = &e.greedy.all;
        Figures {
            exact_match: s.exact_match,
            mean_reward: s.reward,
            searches_per_trajectory: s.tool_calls,
            valid_format: s.valid_format,
            sampled_mean_reward: e.sampled.as_ref().map(|r| r.all.reward),
        }
    }
}

/// What `summary.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct LocalSummary {
    pub seed: u64,
    pub seconds: f64,
    /// Every setting of the run, as the flags name them.
    pub settings: LocalArgs,
    /// Sampling temperature of the training rollouts and of `sampled_mean_reward`.
    pub temperature: f64,
    /// Mean loss per trained token over the last tenth of the warm-start updates; each update's
    /// loss is in `warm_start_losses`.
    pub warm_start_loss: f64,
    pub warm_start_losses: PathBuf,
    /// The copy probe at the end of the warm start.
    pub copy_probe: ProbeOutcome,
    pub after_warm_start: Figures,
    pub after_rl: Figures,
    /// Mean reward of the trained rollouts (sampled at the training temperature; with dynamic
    /// sampling, of the groups kept) in the first and last RL steps.
    pub train_reward_first: Option<f64>,
    pub train_reward_last: Option<f64>,
    pub model_dir: PathBuf,
    pub chart: PathBuf,
    pub metrics: PathBuf,
    /// One held-out question's trajectory before and after RL, rendered for reading.
    pub trajectories: Option<[PathBuf; 2]>,
}

/// The copy probe's last result, and the extra warm-start rounds it took.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeOutcome {
    #[serde(flatten)]
    pub probe: CopyProbe,
    pub share: f64,
    pub passed: bool,
    pub extra_rounds: u32,
}

/// Warm-start updates between the copy probes written to `warm-start.jsonl` (when the copy forms).
const PROBE_EVERY: u64 = 500;

const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

pub fn run(args: LocalArgs) -> anyhow::Result<ExitCode> {
    let args = args.resolved();
    let summary = tokio::runtime::Runtime::new()?.block_on(train(args))?;
    print_table(&summary);
    Ok(ExitCode::SUCCESS)
}

fn print_table(s: &LocalSummary) {
    let (a, b) = (&s.after_warm_start, &s.after_rl);
    println!();
    let p = &s.copy_probe;
    let verdict = match (p.passed, p.extra_rounds) {
        (false, _) if s.settings.quick => "not passed (--quick's model is too small to claim it)".to_string(),
        (true, 0) => "passed".to_string(),
        (true, n) => format!("passed after {n} extra warm-start round(s)"),
        (false, n) => format!(
            "FAILED after {n} extra warm-start round(s): the model does not copy what it reads, and RL \
             has little reward to reinforce"
        ),
    };
    println!("warm-start copy probe: {}: {verdict}", p.probe);
    println!("held-out                          after warm start   after RL");
    println!("exact match (greedy)              {:>16.3} {:>10.3}", a.exact_match, b.exact_match);
    println!("mean reward (greedy)              {:>16.3} {:>10.3}", a.mean_reward, b.mean_reward);
    if let (Some(a), Some(b)) = (a.sampled_mean_reward, b.sampled_mean_reward) {
        println!("{:<34}{a:>16.3} {b:>10.3}", format!("mean reward (sampled, T = {})", s.temperature));
    }
    println!(
        "searches per trajectory (greedy)  {:>16.2} {:>10.2}",
        a.searches_per_trajectory, b.searches_per_trajectory
    );
    println!("valid format (greedy)             {:>16.3} {:>10.3}", a.valid_format, b.valid_format);
    if let (Some(first), Some(last)) = (s.train_reward_first, s.train_reward_last) {
        let trained = if s.settings.dynamic_sampling { "groups kept, " } else { "" };
        println!("training reward (sampled, {trained}first -> last RL step): {first:.3} -> {last:.3}");
    }
    println!(
        "seed {}, {:.0} s; model {}, chart {}, summary {}",
        s.seed,
        s.seconds,
        s.model_dir.display(),
        s.chart.display(),
        s.model_dir.with_file_name("summary.json").display()
    );
    if let Some([before, after]) = &s.trajectories {
        println!("one held-out question, before and after RL: {} {}", before.display(), after.display());
    }
}

async fn train(args: LocalArgs) -> anyhow::Result<LocalSummary> {
    let config = Config::from_args(&args)?;
    let started = Instant::now();
    std::fs::create_dir_all(&config.out).with_context(|| format!("creating {}", config.out.display()))?;
    tch::manual_seed(config.seed as i64);
    let world = build_world(&config)?;
    let base = base_model(&config, &world.world)?;
    let warm = warm_start(&config, &world, base)?;
    let rl = reinforce(&config, &world, &warm.model_dir).await?;
    summarise(&config, &world, args, started, warm, rl)
}

impl Config {
    /// The run's settings from the flags, checked.
    fn from_args(args: &LocalArgs) -> anyhow::Result<Config> {
        for (flag, share) in [
            ("--corrupt-share", args.corrupt_share),
            ("--year-guess-share", args.year_guess_share),
            ("--first-hop-share", args.first_hop_share),
        ] {
            anyhow::ensure!((0.0..=1.0).contains(&share), "{flag} {share}: must be between 0 and 1");
        }
        let persons = args.persons;
        Ok(Config {
            out: args.out.clone(),
            seed: args.seed,
            format: args.env,
            world: WorldConfig {
                persons,
                cities: (persons / 20).max(10),
                companies: (persons / 10).max(10),
                two_hop_share: args.two_hop_share,
                train_questions: args.rl_questions,
                ..WorldConfig::default()
            },
            hidden: args.hidden,
            layers: args.layers,
            heads: args.heads,
            init_std: args.init_std,
            vocab: args.vocab,
            warm_start: WarmStart {
                steps: args.warm_steps.unwrap_or(args.env.warm_steps()),
                copy_steps: args.copy_drills,
                fact_steps: args.fact_drills,
                fact_every: args.fact_drill_every,
                batch: args.warm_batch,
                lr: args.warm_lr,
                gold: GoldConfig {
                    corrupt_share: args.corrupt_share,
                    year_guess_share: args.year_guess_share,
                    first_hop_share: args.first_hop_share,
                    ..GoldConfig::default()
                },
            },
            gold_draws: args.gold_draws,
            probe_rounds: args.probe_rounds,
            rl_steps: args.steps,
            prompts: args.prompts,
            n: args.n,
            algorithm: args.algorithm,
            rl_lr: args.lr,
            temperature: args.temperature,
            dynamic_sampling: args.dynamic_sampling,
            max_staleness: args.max_staleness,
            lora: args.lora.map(|r| LoraConfig::all_linear(r.into())),
            eval_questions: args.eval_questions,
            eval_samples: args.eval_samples,
            device: args.device,
        })
    }
}

/// The world on disk: its corpus, BM25 index and datasets.
struct WorldOnDisk {
    world: World,
    data: DatasetPaths,
    index_dir: PathBuf,
    index: Bm25Index,
}

/// Stage 1: the world, its corpus, index and datasets, under `world/`.
fn build_world(config: &Config) -> anyhow::Result<WorldOnDisk> {
    let world =
        World::generate(&WorldConfig { seed: config.seed, ..config.world.clone() }).with_context(|| {
            format!(
                "the world of --persons {} and --rl-questions {}",
                config.world.persons, config.world.train_questions
            )
        })?;
    let world_dir = config.out.join("world");
    std::fs::create_dir_all(&world_dir)?;
    let index = index_of(&world, &world_dir)?;
    let data = world.write_dataset(&world_dir, config.format)?;
    let index_dir = world_dir.join("index");
    eprintln!(
        "world: {} persons, {} passages; {} warm-start, {} RL and {} held-out questions",
        world.persons.len(),
        world.passages.len(),
        world.warm_start.len(),
        world.train.len(),
        world.test.len()
    );
    Ok(WorldOnDisk { world, data, index_dir, index })
}

/// Writes `world`'s corpus (`corpus.jsonl`) and its BM25 index (`index/`) into `dir`, replacing
/// an earlier run's, and opens the index.
fn index_of(world: &World, dir: &Path) -> anyhow::Result<Bm25Index> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    world.write_corpus(&dir.join("corpus.jsonl"))?;
    let index_dir = dir.join("index");
    if index_dir.exists() {
        std::fs::remove_dir_all(&index_dir)?;
    }
    bm25::build(&dir.join("corpus.jsonl"), &index_dir, 64 << 20, |_, _, _| ())?;
    Ok(Bm25Index::open(&index_dir)?)
}

/// The model made from scratch.
struct BaseModel {
    dir: PathBuf,
    config: ModelConfig,
    model: CausalLm,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

/// Stage 2: a BPE tokenizer trained on the world's text and a Qwen2 from random weights, saved
/// as a Hugging Face folder (`base-model/`).
fn base_model(config: &Config, world: &World) -> anyhow::Result<BaseModel> {
    let dir = config.out.join("base-model");
    let texts: Vec<String> = world
        .passages
        .iter()
        .map(|p| format!("{}\n{}", p.title, p.text))
        .chain(
            world
                .warm_start
                .iter()
                .chain(&world.train)
                .filter_map(|q| q.to_prompt(config.format).ok()?.messages?.pop().map(|m| m.content)),
        )
        .chain(world.warm_start.iter().map(|q| q.answer.clone()))
        .chain(config.format.vocabulary())
        .collect();
    // Qwen2's pre-tokenizer writes " 1952" as a space and four digits, and a model this small
    // made from scratch does not learn to copy those within its warm start
    // (docs/src/local-experiments.md): each of the world's years with its leading space is one
    // token instead, as GPT-2's pre-tokenizer made it.
    let years: Vec<String> = World::years().iter().map(|year| format!(" {year}")).collect();
    let tokenizer = Tokenizer::train_byte_level_bpe(
        texts.iter().map(String::as_str),
        config.vocab,
        &SPECIAL_TOKENS,
        "<|im_end|>",
        "<|endoftext|>",
    )?
    .with_added_words(&years.iter().map(String::as_str).collect::<Vec<_>>())?;
    let sizes = QwenSizes {
        vocab_size: tokenizer.vocab_size(),
        hidden_size: config.hidden,
        intermediate_size: config.hidden * 3,
        num_hidden_layers: config.layers,
        num_attention_heads: config.heads,
        num_key_value_heads: (config.heads / 2).max(1),
        max_position_embeddings: 2048,
        tie_word_embeddings: true,
        initializer_range: config.init_std,
    };
    let model_config =
        ModelConfig::qwen2(sizes)?.with_special_tokens(tokenizer.eos_token_id(), tokenizer.pad_token_id());
    let model = CausalLm::random(model_config.clone(), tch::Device::Cpu, config.seed)?;
    save_pretrained(&dir, &model_config, &model.named_tensors(), None, tch::Kind::Float)?;
    tokenizer.save(&dir, Some(config.format.chat_template()))?;
    // The same weights on the GPU, for a warm start there (in f32, as on the CPU).
    let model = match config.device {
        Device::Cpu => model,
        device => {
            let device = kart_torch::choose("kart local", "--device", device, 0)?;
            CausalLm::load_as(&dir, device, tch::Kind::Float)?
        }
    };
    let template = ChatTemplate::load(&dir)?.context("the saved model has a chat template")?;
    Ok(BaseModel { dir, config: model_config, model, tokenizer, template })
}

/// The warm-started model and how its training ended.
struct WarmStarted {
    model_dir: PathBuf,
    /// Mean loss per trained token over the last tenth of the updates.
    loss: f64,
    /// `warm-start.jsonl`: each update's loss.
    losses: PathBuf,
    probe: ProbeOutcome,
}

/// Stage 3: copy drills, fact drills, then the gold trajectories (`warm-start-model/`, `warm-start.jsonl`).
fn warm_start(config: &Config, world: &WorldOnDisk, base: BaseModel) -> anyhow::Result<WarmStarted> {
    let BaseModel { dir: base_dir, config: model_config, model, tokenizer, template } = base;
    let parameters: i64 = model.named_tensors().iter().map(|(_, t)| t.numel() as i64).sum();
    let gold = GoldConfig { seed: config.seed, ..config.warm_start.gold };
    let agent = Agent { format: config.format, tokenizer: &tokenizer, template: &template };
    let ws = &config.warm_start;
    // An extra round is a quarter of the gold updates more, continuing through the draws.
    let round =
        WarmStart { steps: ws.steps / 4, copy_steps: 0, fact_steps: 0, lr: ws.lr / 2.0, ..ws.clone() };
    let gold_updates = ws.steps + u64::from(config.probe_rounds) * round.steps;
    let passes = (gold_updates as usize * ws.batch).div_ceil(world.world.warm_start.len().max(1)).max(1);
    let draws = config.gold_draws.unwrap_or(passes as u64);
    let draws_dir = config.out.join("world/draws");
    if draws_dir.exists() {
        std::fs::remove_dir_all(&draws_dir).with_context(|| format!("removing {}", draws_dir.display()))?;
    }
    let trajectories = (0..draws)
        .map(|draw| -> anyhow::Result<Vec<_>> {
            let redrawn = world.world.redrawn(draw)?;
            let own;
            let index = match draw {
                0 => &world.index,
                _ => {
                    own = index_of(&redrawn, &draws_dir.join(draw.to_string()))?;
                    &own
                }
            };
            Ok(warm_start::gold_trajectories(&redrawn, &gold, index, &agent, 3)?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (tokens, count) = trajectories.iter().flatten().fold((0, 0), |(t, n), x| (t + x.len(), n + 1));
    eprintln!(
        "model: Qwen2, {:.2}M parameters, vocabulary {}; warm start on {} gold trajectories in {draws} draw(s) of the warm-start facts ({:.0} tokens on average)",
        parameters as f64 / 1e6,
        tokenizer.vocab_size(),
        count,
        tokens as f64 / f64::from(count.max(1))
    );
    // The copy and fact drills of `ws`'s updates.
    let drills = |ws: &WarmStart, seed| -> anyhow::Result<_> {
        Ok((
            copy_drills(&world.world, &tokenizer, ws.copy_steps as usize * ws.batch, seed)?,
            fact_drills(&world.world, &tokenizer, ws.fact_updates() as usize * ws.batch, seed)?,
        ))
    };
    let (copies, facts) = drills(ws, config.seed)?;
    let probe_set = ProbeSet::new(&world.world, &world.index, &agent, 3)?;
    let progress = kart_train::progress::bar("warm start", ws.updates(), 0);
    let measure = |done: u64| {
        let probe = probe_set.measure(&model);
        progress.suspend(|| eprintln!("copy probe after {done} warm-start updates: {probe}"));
        probe
    };
    let warm_started = Instant::now();
    let probe_every = Some((PROBE_EVERY, &measure as &dyn Fn(u64) -> CopyProbe));
    let mut updates = warm_start::train(
        &model,
        Lessons { copies: &copies, facts: &facts, gold: &trajectories, gold_done: 0 },
        ws,
        config.seed,
        probe_every,
        &progress,
    );
    progress.finish_and_clear();
    eprintln!(
        "warm start: {} updates ({} on copy drills, {} on fact drills) in {:.0} s, loss {:.3} per trained token at the end",
        ws.updates(),
        ws.copy_steps,
        ws.fact_updates(),
        warm_started.elapsed().as_secs_f64(),
        warm_start::end_loss(&updates)
    );
    let (probe, extra_rounds) = copy_probe::train_until_copies(
        || {
            let probe = probe_set.measure(&model);
            eprintln!("copy probe: {probe}");
            probe
        },
        config.probe_rounds,
        |n| -> anyhow::Result<()> {
            eprintln!(
                "warm start: the model does not copy yet; extra round {n} of at most {} ({} gold and {} fact drill updates)",
                config.probe_rounds,
                round.steps,
                round.fact_updates(),
            );
            let (copies, facts) = drills(&round, config.seed.wrapping_add(u64::from(n) << 32))?;
            let progress = kart_train::progress::bar("warm start, extra round", round.updates(), 0);
            let gold_done = (ws.steps + u64::from(n - 1) * round.steps) as usize;
            updates.extend(warm_start::train(
                &model,
                Lessons { copies: &copies, facts: &facts, gold: &trajectories, gold_done },
                &round,
                config.seed,
                None,
                &progress,
            ));
            progress.finish_and_clear();
            Ok(())
        },
    )?;
    let loss = warm_start::end_loss(&updates);
    let losses = config.out.join("warm-start.jsonl");
    write_losses(&losses, &updates)?;
    let probe = ProbeOutcome { probe, share: probe.share(), passed: probe.passed(), extra_rounds };
    let model_dir = config.out.join("warm-start-model");
    save_pretrained(&model_dir, &model_config, &model.named_tensors(), Some(&base_dir), tch::Kind::Float)?;
    Ok(WarmStarted { model_dir, loss, losses, probe })
}

/// Stage 4: RL from `warm` through `kart train`'s trainer with its in-process pool, in `rl/`
/// (an earlier run's is replaced); writes `train-config.json`.
async fn reinforce(config: &Config, world: &WorldOnDisk, warm: &Path) -> anyhow::Result<RunSummary> {
    let rl_dir = config.out.join("rl");
    if rl_dir.exists() {
        std::fs::remove_dir_all(&rl_dir).with_context(|| format!("removing {}", rl_dir.display()))?;
    }
    let train_config = TrainConfig {
        model: warm.to_path_buf(),
        output_dir: rl_dir,
        seed: config.seed,
        total_steps: config.rl_steps,
        data: DataConfig {
            train: world.data.train.clone(),
            test: Some(world.data.test.clone()),
            ..DataConfig::default()
        },
        // Search-R1's GRPO recipe keeps a KL loss (low-variance estimator, 0.001) to the
        // reference, here the warm-started policy, and DAPO's dynamic sampling trains only groups
        // whose rewards differ, so a weak start's many all-zero groups neither dilute the step
        // nor stand in for signal. Tokens sampled by older policies are weighted back to the
        // proximal one (AReaL's decoupled PPO): without it a run with `--max-staleness 2`
        // collapsed (EM 0.675 -> 0).
        algorithm: AlgorithmConfig {
            advantage: config.algorithm,
            filter_groups: config.dynamic_sampling,
            decoupled: config.max_staleness > 0,
            behav_imp_weight_cap: (config.max_staleness > 0).then_some(5.0),
            ..Default::default()
        },
        optim: OptimConfig { lr: config.rl_lr, grad_clip: 1.0, ..OptimConfig::default() },
        batch: BatchConfig {
            prompts: config.prompts,
            n: config.n,
            mini_batch_prompts: config.prompts,
            micro_batch_size: 16,
            micro_batch_tokens: None,
        },
        rollout: RolloutSource {
            index: Some(world.index_dir.clone()),
            max_batch: 128,
            env: config.format.env(),
            sampling: Sampling { temperature: config.temperature, ..Sampling::default() },
            max_staleness: config.max_staleness,
            ..RolloutSource::default()
        },
        checkpoint: CheckpointConfig { every: 0, keep: 1 },
        eval: EvalConfig {
            every: (config.rl_steps / 3).max(1),
            max_prompts: config.eval_questions,
            sampled_n: config.eval_samples,
        },
        device: config.device,
        dump_rollouts: true,
        lora: config.lora.clone(),
        ..TrainConfig::default()
    };
    std::fs::write(config.out.join("train-config.json"), serde_json::to_string_pretty(&train_config)?)?;
    let registry = Registry::new();
    let trainer = tokio::task::block_in_place(|| {
        Trainer::build(
            train_config,
            false,
            &kart_torch::Ranks::single(),
            &registry,
            StatusHandle::default(),
            WeightStore::default(),
            Serving::default(),
        )
    })?;
    Ok(trainer.run().await?)
}

/// The run's outputs: the chart, the final model under `model/`, and `summary.json`.
fn summarise(
    config: &Config,
    world: &WorldOnDisk,
    settings: LocalArgs,
    started: Instant,
    warm: WarmStarted,
    rl: RunSummary,
) -> anyhow::Result<LocalSummary> {
    let RunSummary { first_eval, last_eval, model_dir, .. } = rl;
    let (first, last) =
        (first_eval.context("no evaluation before RL")?, last_eval.context("no evaluation after RL")?);
    let trajectories = write_trajectories(config, world, &warm.model_dir, &first, &last)?;
    let metrics = config.out.join("rl").join("metrics.jsonl");
    let chart = config.out.join("chart.png");
    kart::plot::plot_metrics(&metrics, &chart)?;
    let rewards: Vec<f64> = std::fs::read_to_string(&metrics)?
        .lines()
        .filter_map(|l| {
            serde_json::from_str::<serde_json::Value>(l).ok()?.get(keys::REWARD_MEAN.name())?.as_f64()
        })
        .collect();
    let final_model = config.out.join("model");
    if final_model.exists() {
        std::fs::remove_dir_all(&final_model)?;
    }
    std::fs::rename(&model_dir, &final_model)?;
    let summary = LocalSummary {
        seed: config.seed,
        seconds: started.elapsed().as_secs_f64(),
        settings,
        temperature: config.temperature,
        warm_start_loss: warm.loss,
        warm_start_losses: warm.losses,
        copy_probe: warm.probe,
        after_warm_start: Figures::from(&first),
        after_rl: Figures::from(&last),
        train_reward_first: rewards.first().copied(),
        train_reward_last: rewards.last().copied(),
        model_dir: final_model,
        chart,
        metrics,
        trajectories,
    };
    std::fs::write(config.out.join("summary.json"), serde_json::to_string_pretty(&summary)? + "\n")?;
    Ok(summary)
}

/// One held-out question's greedy trajectory before RL and after it, rendered for reading
/// (`trajectory-before-rl.txt`, `trajectory-after-rl.txt`); `None` when no question was answered
/// in both evaluations.
fn write_trajectories(
    config: &Config,
    world: &WorldOnDisk,
    model_dir: &Path,
    before: &Evaluation,
    after: &Evaluation,
) -> anyhow::Result<Option<[PathBuf; 2]>> {
    let tasks = Dataset::load(&world.data.test, DataFormat::Auto, false, 0)?.prompts;
    let Some((task, b, a)) = reading::pick(&tasks, &before.greedy_trajectories, &after.greedy_trajectories)
    else {
        return Ok(None);
    };
    let tokenizer = Tokenizer::load(model_dir)?;
    let mut paths = [config.out.join("trajectory-before-rl.txt"), config.out.join("trajectory-after-rl.txt")];
    for (path, (title, t)) in paths.iter_mut().zip([
        ("A held-out question before RL (the warm-started policy, greedy)", b),
        ("The same question after RL (greedy)", a),
    ]) {
        std::fs::write(&path, reading::render(title, task, t, &tokenizer)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(Some(paths))
}

/// Writes one JSON line per warm-start update: its number (from 1), what it trained on
/// (`copy-drill`, `fact-drill` or `gold`), its loss per trained token, and the copy probe
/// (`copied` of `values`) where one was measured right after it.
fn write_losses(path: &std::path::Path, updates: &[warm_start::Update]) -> anyhow::Result<()> {
    let mut lines = String::new();
    for (n, update) in (1u64..).zip(updates) {
        let mut line = serde_json::to_value(update)?;
        line["update"] = n.into();
        lines += &format!("{line}\n");
    }
    std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))
}
