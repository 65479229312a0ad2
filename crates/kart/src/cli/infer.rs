//! `kart infer`: one question through an agent, its trajectory printed turn by turn with what the
//! environment returned (the retrieved passages), like Search-R1's `infer.py`; `--interactive`
//! asks for questions until end of input.

use super::setup::{Opened, Setup};
use clap::Args;
use kart_core::generation::SamplingParams;
use kart_core::wire::Task;
use kart_rollout::env;
use kart_train::dump::segments;
use kart_train::eval::answer_of;
use std::io::BufRead;
use std::process::ExitCode;

/// Run one question (or a prompt loop) through an agent and print its trajectory.
#[derive(Debug, Args)]
pub struct InferArgs {
    #[command(flatten)]
    setup: Setup,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Ask for questions on standard input, one a line, until end of input.
    #[arg(long)]
    interactive: bool,
    /// The question.
    #[arg(required_unless_present = "interactive")]
    question: Option<String>,
}

pub fn run(args: InferArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.temperature >= 0.0,
        "--temperature {}: must be 0 (greedy) or more",
        args.temperature
    );
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let opened = args.setup.open().await?;
        if let Some(question) = &args.question {
            answer(&opened, question, args.temperature).await?;
        }
        if args.interactive {
            let stdin = std::io::stdin();
            eprint!("question> ");
            for line in stdin.lock().lines() {
                let line = line?;
                if !line.trim().is_empty() {
                    answer(&opened, line.trim(), args.temperature).await?;
                }
                eprint!("question> ");
            }
            eprintln!();
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `question` and prints each trajectory of its episode, span by span.
async fn answer(opened: &Opened, question: &str, temperature: f64) -> anyhow::Result<()> {
    let task = Task {
        id: "question".into(),
        messages: None,
        prompt: Some(question.to_owned()),
        ground_truth: Vec::new(),
        data_source: "infer".into(),
        tools: None,
    };
    let sampling = SamplingParams { temperature, top_p: 1.0, top_k: -1, seed: Some(opened.seed) };
    let environment = env::build(&opened.env);
    let trajectories = environment.episode(&opened.ctx, &task, "question".into(), &sampling).await?;
    for t in &trajectories {
        if let Some(role) = &t.stats.role {
            println!("════ {} ({role}) ════", t.id);
        }
        for span in segments(t, &opened.tokenizer)? {
            let title = match span["role"].as_str() {
                Some("model") => "model",
                Some("env") => "environment",
                _ => "prompt",
            };
            println!("── {title} ──\n{}", span["text"].as_str().unwrap_or_default());
        }
        let response = opened.tokenizer.decode(t.response_ids(), true)?;
        let answer = answer_of(&response).unwrap_or_else(|| "(none)".into());
        let searches = t.stats.total_tool_calls();
        let status = serde_json::to_value(t.status)?;
        let status = status.as_str().unwrap_or_default();
        println!("── answer: {answer} · {} turns, {searches} tool calls, {status} ──", t.stats.turns);
    }
    Ok(())
}
