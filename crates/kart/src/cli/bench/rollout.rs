//! `kart bench rollout`: kart's own overhead in the agent loop, against the ideal of a perfect
//! harness.
//!
//! A replay engine answers every call after a fixed latency (50 ms by default), as a remote
//! inference server would, with token ids prepared before the run (its own work is a hash lookup:
//! nothing of the engine's counts as kart's); the context is a worker's, its search tool calling a
//! real retriever (`/retrieve` of kart's HTTP service on loopback, over a BM25 index of a
//! synthetic world's corpus, no cache; with `--retriever in-process`, the same index searched in
//! the worker's process, as a pool with `rollout.index` and `kart local` search).
//! Each Search-R1 trajectory searches once and then answers: two engine calls, one search; kart
//! renders and tokenises the prompt, cuts and parses each turn, searches, tokenises the
//! observation and scores the answer.
//!
//! With `--group-size n`, each question's n episodes start side by side, as a GRPO group's do, and
//! the later ones find the prompt's and the passages' tokens in the tokenizer's memory.
//!
//! With `c` trajectories in flight and `N` in all, the ideal wall time is `ceil(N / c) x 2 x
//! latency`, and kart's overhead is wall / ideal - 1. The same run also times an engine-only
//! harness (the same calls at the same concurrency, nothing else): what the engine's timer and the
//! async runtime cost before kart does anything, printed beside it.

use anyhow::Context;
use futures::future::BoxFuture;
use kart::local::world::{World, WorldConfig};
use kart_core::chat::ChatMessage;
use kart_core::config::env::EnvConfig;
use kart_core::config::retriever::RetrieverConfig;
use kart_core::config::rollout::ContextConfig;
use kart_core::engine::{Engine, EngineError, EngineOutput};
use kart_core::generation::FinishReason;
use kart_core::generation::Generation;
use kart_core::generation::GenerationRequest;
use kart_core::generation::SamplingParams;
use kart_core::wire::Task;
use kart_retriever::InProcess;
use kart_retriever::server::{AppState, Backend, router};
use kart_rollout::env::search_r1::{SearchR1Config, SearchR1Env};
use kart_rollout::env::{Context as EnvContext, Environment};
use kart_tokenizer::CHATML;
use kart_tokenizer::Tokenizer;
use prometheus::Registry;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Benchmark the rollout loop's overhead at concurrency 1 to 512 with a fixed-latency engine.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Latency of every engine call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    latency_ms: u64,
    /// Concurrency levels (trajectories in flight).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128,256,512")]
    concurrency: Vec<usize>,
    /// Waves of trajectories per level (a level runs concurrency x waves trajectories).
    #[arg(long, default_value_t = 16)]
    waves: usize,
    /// Episodes of each question, started side by side as a GRPO group's are (1: every
    /// trajectory a question of its own).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    group_size: u64,
    /// Where the searches go.
    #[arg(long, value_enum, default_value_t = Retriever::Http)]
    retriever: Retriever,
    /// Small levels and one wave, to check the bench runs.
    #[arg(long)]
    quick: bool,
}

/// Where the trajectories' searches go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Retriever {
    /// `/retrieve` of kart's retriever service on loopback, served from this process (a retriever
    /// pod's path, sharing this machine's cores).
    Http,
    /// The index searched in the worker's own process (a pool's `rollout.index`, `kart local`).
    InProcess,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    tokio::runtime::Runtime::new()?.block_on(bench(args))
}

/// Answers each call after `latency` with token ids prepared before the run: a search for the
/// person a prompt asks about when the context is a prompt, the answer otherwise.
struct ReplayEngine {
    latency: Duration,
    timer: Arc<Timer>,
    searches: HashMap<Vec<u32>, Vec<u32>>,
    answer: Vec<u32>,
}

impl Engine for ReplayEngine {
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
        Box::pin(async move {
            self.timer.sleep(self.latency).await;
            let token_ids = self.searches.get(&request.input_ids).unwrap_or(&self.answer).clone();
            let logprobs = vec![-0.5; token_ids.len()];
            Ok(EngineOutput::new(Generation { token_ids, logprobs, finish_reason: FinishReason::Stop }, 0))
        })
    }

    fn name(&self) -> &str {
        "replay"
    }
}

/// Wakes sleepers at their deadlines from a thread of its own, to within tens of microseconds:
/// tokio's timer rounds every sleep up to its 1 ms ticks, which alone would add 1-2% to a 50 ms
/// call, more than the target leaves to kart. A remote engine's reply has no such granularity.
struct Timer {
    deadlines: std::sync::Mutex<Vec<(Instant, tokio::sync::oneshot::Sender<()>)>>,
    changed: std::sync::Condvar,
}

impl Timer {
    fn start() -> Arc<Timer> {
        let timer = Arc::new(Timer { deadlines: Default::default(), changed: Default::default() });
        let weak = Arc::downgrade(&timer);
        std::thread::spawn(move || {
            while let Some(timer) = weak.upgrade() {
                let mut deadlines = timer.deadlines.lock().expect("timer lock");
                let now = Instant::now();
                let (due, waiting): (Vec<_>, Vec<_>) = deadlines.drain(..).partition(|(at, _)| *at <= now);
                *deadlines = waiting;
                for (_, wake) in due {
                    let _ = wake.send(());
                }
                let wait =
                    deadlines.iter().map(|(at, _)| *at - now).min().unwrap_or(Duration::from_millis(20));
                drop(timer.changed.wait_timeout(deadlines, wait).expect("timer lock"));
            }
        });
        timer
    }

    async fn sleep(&self, duration: Duration) {
        let (wake, woken) = tokio::sync::oneshot::channel();
        self.deadlines.lock().expect("timer lock").push((Instant::now() + duration, wake));
        self.changed.notify_one();
        let _ = woken.await;
    }
}

async fn bench(args: Args) -> anyhow::Result<ExitCode> {
    let (levels, waves) =
        if args.quick { (vec![1, 4], 1) } else { (args.concurrency.clone(), args.waves.max(1)) };
    let latency = Duration::from_millis(args.latency_ms);
    let work = tempfile::tempdir().context("creating a temporary folder")?;

    // A real retriever over a synthetic corpus, on loopback.
    let world = World::generate(&WorldConfig { persons: 2000, ..WorldConfig::default() })?;
    let corpus = work.path().join("corpus.jsonl");
    world.write_corpus(&corpus)?;
    let index = work.path().join("index");
    kart_retriever::bm25::build(&corpus, &index, 64 << 20, |_, _, _| ())?;
    // The worker's context, without its search cache (every query of a level would hit it in the
    // next).
    let (tools, local) = match args.retriever {
        Retriever::Http => {
            let registry = Registry::new();
            let config = RetrieverConfig { index: Some(index), ..RetrieverConfig::default() };
            let state = AppState::new(config.clone(), &registry)?;
            state.set_backend(Backend::open(&config, &registry)?);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let url = format!("http://{}", listener.local_addr()?);
            tokio::spawn(kart_http::serve(listener, router(state, registry)));
            (
                ContextConfig {
                    retriever_url: Some(url),
                    search_cache_entries: 0,
                    ..ContextConfig::default()
                },
                None,
            )
        }
        Retriever::InProcess => (
            ContextConfig { search_cache_entries: 0, ..ContextConfig::default() },
            Some(InProcess::open(&index)?),
        ),
    };

    let texts: Vec<String> = world.passages.iter().map(|p| p.text.clone()).collect();
    let tokenizer = Tokenizer::train_byte_level_bpe(
        texts.iter().map(String::as_str),
        2048,
        &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "<|im_end|>",
        "<|endoftext|>",
    )?;
    let model_dir = work.path().join("tokenizer");
    tokenizer.save(&model_dir, Some(CHATML))?;
    let env = SearchR1Env::new(SearchR1Config::default());
    let timer = Timer::start();
    let idle = Arc::new(ReplayEngine {
        latency,
        timer: timer.clone(),
        searches: HashMap::new(),
        answer: Vec::new(),
    });
    let mut ctx =
        EnvContext::build(&tools, &EnvConfig::SearchR1(SearchR1Config::default()), idle, &model_dir, local)
            .await?;

    // One question per person; the engine's replies prepared for each.
    let tasks: Vec<Task> = world
        .persons
        .iter()
        .enumerate()
        .map(|(i, person)| Task {
            id: format!("q{i}"),
            messages: Some(vec![ChatMessage::new("user", format!("Where was {} born?", person.name))]),
            prompt: None,
            ground_truth: vec![person.name.clone()],
            data_source: "bench".into(),
            tools: None,
        })
        .collect();
    let mut searches = HashMap::new();
    for (task, person) in tasks.iter().zip(&world.persons) {
        let messages = task.messages.as_deref().unwrap_or_default();
        let reply =
            format!("<think> I need to search. </think>\n<search> {} birthplace </search>", person.name);
        searches.insert(ctx.prompt_ids(messages)?, tokenizer.encode(&reply, false)?);
    }
    let answer = tokenizer.encode("<think> Found it. </think>\n<answer> somewhere </answer>", false)?;
    let engine = Arc::new(ReplayEngine { latency, timer, searches, answer });
    ctx.engine = engine.clone();
    let env: Arc<dyn Environment> = Arc::new(env);

    let placement = match args.retriever {
        Retriever::Http => "on loopback",
        Retriever::InProcess => "in this process",
    };
    println!(
        "engine latency {} ms per call; 2 calls and 1 search per trajectory; groups of {} episodes per question; retriever: kart BM25 over {} passages {placement}",
        args.latency_ms,
        args.group_size,
        world.passages.len()
    );
    println!(
        "{:>11} {:>12} {:>10} {:>10} {:>14} {:>9} {:>12} {:>12}",
        "concurrency",
        "trajectories",
        "wall (s)",
        "ideal (s)",
        "trajectories/s",
        "overhead",
        "engine only",
        "CPU us/traj"
    );
    let mut overheads = Vec::new();
    for &c in &levels {
        let total = c * waves;
        let level = level_tasks(&tasks, args.group_size as usize, total);
        let ideal = total.div_ceil(c) as f64 * 2.0 * latency.as_secs_f64();

        // The engine alone: the same two calls per trajectory at the same concurrency.
        let prompts = level
            .iter()
            .map(|task| ctx.prompt_ids(task.messages.as_deref().unwrap_or_default()))
            .collect::<Result<Vec<_>, _>>()?;
        let started = Instant::now();
        let mut jobs = tokio::task::JoinSet::new();
        let semaphore = Arc::new(tokio::sync::Semaphore::new(c));
        for prompt in prompts {
            let (engine, semaphore) = (engine.clone(), semaphore.clone());
            jobs.spawn(async move {
                let _permit = semaphore.acquire_owned().await.expect("open semaphore");
                let request = |input_ids| GenerationRequest {
                    input_ids,
                    sampling: SamplingParams::default(),
                    max_new_tokens: 500,
                    stop: Vec::new(),
                    stop_token_ids: Vec::new(),
                    ignore_eos: false,
                };
                let first = engine.generate(request(prompt.clone())).await?;
                engine.generate(request([prompt, first.generation.token_ids].concat())).await
            });
        }
        while let Some(result) = jobs.join_next().await {
            result?.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let engine_only = started.elapsed().as_secs_f64();

        // kart's agent loop, its tokenizer loaded afresh: no prompt or passage of this level
        // tokenised before (the tokenizer remembers pieces of text it encoded).
        let ctx = Arc::new(EnvContext { tokenizer: Tokenizer::load(&model_dir)?, ..ctx.clone() });
        let (started, cpu_started) = (Instant::now(), cpu_seconds());
        let mut jobs = tokio::task::JoinSet::new();
        let semaphore = Arc::new(tokio::sync::Semaphore::new(c));
        for (i, task) in level.into_iter().enumerate() {
            let (ctx, env, semaphore) = (ctx.clone(), env.clone(), semaphore.clone());
            jobs.spawn(async move {
                let _permit = semaphore.acquire_owned().await.expect("open semaphore");
                let id = format!("{}-{i}", task.id);
                env.episode(&ctx, &task, id, &SamplingParams::default()).await
            });
        }
        let mut searched = 0;
        while let Some(result) = jobs.join_next().await {
            for t in result?.map_err(|e| anyhow::anyhow!("{e}"))? {
                searched += usize::from(t.stats.tool_calls.get("search").is_some_and(|s| s.ok == 1));
            }
        }
        anyhow::ensure!(searched == total, "only {searched} of {total} trajectories searched successfully");
        let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu_started);
        let overhead = wall / ideal - 1.0;
        println!(
            "{c:>11} {total:>12} {wall:>10.3} {ideal:>10.3} {:>14.1} {:>8.2}% {:>11.2}% {:>12.0}",
            total as f64 / wall,
            overhead * 100.0,
            (engine_only / ideal - 1.0) * 100.0,
            cpu / total as f64 * 1e6
        );
        overheads.push((c, overhead, engine_only / ideal - 1.0));
    }
    if let Some((_, overhead, engine_only)) = overheads.iter().find(|(c, ..)| *c == 256) {
        let met = if *overhead <= 0.02 { "met" } else { "missed" };
        println!(
            "target: overhead <= 2% at 256 concurrent trajectories: {:.2}% ({met}); the engine alone: {:.2}%",
            overhead * 100.0,
            engine_only * 100.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The `total` episodes of a level: each task `group` times in a row, the tasks in turn.
fn level_tasks(tasks: &[Task], group: usize, total: usize) -> Vec<Task> {
    tasks.iter().flat_map(|task| std::iter::repeat_n(task, group)).cycle().take(total).cloned().collect()
}

/// CPU time of this process so far (user and system, all threads), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_runs_each_question_group_size_times_in_a_row() {
        let task = |id: &str| Task {
            id: id.into(),
            messages: None,
            prompt: Some(id.into()),
            ground_truth: Vec::new(),
            data_source: "bench".into(),
            tools: None,
        };
        let tasks = [task("a"), task("b")];
        let ids = |group, total| -> Vec<String> {
            level_tasks(&tasks, group, total).into_iter().map(|t| t.id).collect()
        };
        assert_eq!(ids(1, 5), ["a", "b", "a", "b", "a"]);
        assert_eq!(ids(3, 8), ["a", "a", "a", "b", "b", "b", "a", "a"]);
    }
}
