//! `kart eval`: any model on any number of benchmark files, through the same environment code as
//! training, greedy or sampled, with a table per data source in the layout of the Search-R1
//! paper's table, JSON for scripts, and the trajectories on request.

use super::setup::{Opened, Setup};
use anyhow::Context as _;
use clap::Args;
use kart_core::config::train::DataFormat;
use kart_core::generation::SamplingParams;
use kart_core::wire::Task;
use kart_train::data::Dataset;
use kart_train::eval::{self, Pass, Report, Summary};
use kart_train::pool::InProcessPool;
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// The Search-R1 paper's benchmark columns, in its order.
const PAPER_COLUMNS: [(&str, &str); 7] = [
    ("nq", "NQ"),
    ("triviaqa", "TriviaQA"),
    ("popqa", "PopQA"),
    ("hotpotqa", "HotpotQA"),
    ("2wikimultihopqa", "2Wiki"),
    ("musique", "Musique"),
    ("bamboogle", "Bamboogle"),
];

/// Evaluate a model on benchmark files through kart's environments.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    setup: Setup,
    /// Benchmark files (Search-R1 parquet, ASearcher or TIR JSON lines).
    #[arg(long, required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Trajectories per question.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// At most this many questions per file (0: all).
    #[arg(long, default_value_t = 0)]
    max_prompts: usize,
    /// Where to write the figures as JSON.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where to write every trajectory (JSON lines).
    #[arg(long)]
    trajectories: Option<PathBuf>,
}

pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.n >= 1, "--n: 0; at least one trajectory per question");
    anyhow::ensure!(
        args.temperature >= 0.0 && (args.temperature > 0.0 || args.n == 1),
        "--temperature {}: greedy decoding (0) gives one trajectory per question; sample (> 0) for --n {}",
        args.temperature,
        args.n
    );
    let mut prompts: Vec<Task> = Vec::new();
    for file in &args.data {
        let dataset = Dataset::load(file, DataFormat::Auto, false, args.max_prompts)?;
        let tag = file.display().to_string();
        // Ids stay unique across files.
        prompts.extend(dataset.prompts.into_iter().map(|t| Task { id: format!("{tag}:{}", t.id), ..t }));
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let (report, trajectories) = runtime.block_on(async {
        let Opened { ctx, env, tokenizer, seed } = args.setup.open().await?;
        let pool = InProcessPool::new(ctx, None);
        let sampling =
            SamplingParams { temperature: args.temperature, top_p: 1.0, top_k: -1, seed: Some(seed) };
        let pass = Pass { n: args.n, sampling, policy_version: None };
        let bar = kart_train::progress::bar("eval", prompts.len() as u64, 0);
        let scored = eval::score(&pool, &tokenizer, &env, &prompts, &pass, Some(&bar)).await?;
        bar.finish_and_clear();
        anyhow::Ok(scored)
    })?;

    print!("{}", table(&report));
    let figures = figures(&report, &args);
    if let Some(path) = &args.out {
        std::fs::write(path, serde_json::to_string_pretty(&figures)? + "\n")
            .with_context(|| format!("--out {}", path.display()))?;
    }
    if let Some(path) = &args.trajectories {
        let mut file = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("--trajectories {}", path.display()))?,
        );
        for t in &trajectories {
            writeln!(file, "{}", serde_json::to_string(t)?)?;
        }
        file.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The data sources in the paper's column order, then the others by name.
fn columns(report: &Report) -> Vec<(String, &Summary)> {
    let mut columns: Vec<(String, &Summary)> = PAPER_COLUMNS
        .iter()
        .filter_map(|(source, title)| report.by_source.get(*source).map(|s| (title.to_string(), s)))
        .collect();
    let known = |source: &str| PAPER_COLUMNS.iter().any(|(s, _)| *s == source);
    columns.extend(report.by_source.iter().filter(|(s, _)| !known(s)).map(|(s, v)| (s.clone(), v)));
    columns.push(("all".into(), &report.all));
    columns
}

/// How a table row shows a summary.
type Figure = fn(&Summary) -> String;

/// The figures as a table: a row per figure, a column per data source.
fn table(report: &Report) -> String {
    let columns = columns(report);
    let rows: [(&str, Figure); 7] = [
        ("trajectories", |s| s.count.to_string()),
        ("EM", |s| format!("{:.3}", s.exact_match)),
        ("F1", |s| format!("{:.3}", s.f1)),
        ("reward", |s| format!("{:.3}", s.reward)),
        ("searches / question", |s| format!("{:.2}", s.tool_calls)),
        ("valid format", |s| format!("{:.3}", s.valid_format)),
        ("answer length (tokens)", |s| format!("{:.1}", s.response_tokens)),
    ];
    let width = columns.iter().map(|(c, _)| c.len()).max().unwrap_or(0).max(9);
    let mut out = format!("{:<24}", "");
    for (title, _) in &columns {
        out += &format!(" {title:>width$}");
    }
    out.push('\n');
    for (name, value) in rows {
        out += &format!("{name:<24}");
        for (_, summary) in &columns {
            out += &format!(" {:>width$}", value(summary));
        }
        out.push('\n');
    }
    out
}

/// The figures as JSON: per data source and over all.
fn figures(report: &Report, args: &EvalArgs) -> Value {
    let summary = |s: &Summary| {
        json!({"trajectories": s.count, "exact_match": s.exact_match, "f1": s.f1, "reward": s.reward,
               "searches": s.tool_calls, "valid_format": s.valid_format, "response_tokens": s.response_tokens})
    };
    let sources: serde_json::Map<String, Value> =
        report.by_source.iter().map(|(source, s)| (source.clone(), summary(s))).collect();
    json!({
        "model": args.setup.model,
        "data": args.data,
        "n": args.n,
        "temperature": args.temperature,
        "all": summary(&report.all),
        "sources": sources,
    })
}
