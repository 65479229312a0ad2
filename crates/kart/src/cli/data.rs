//! `kart data`: dataset preparation, writing the files upstream's scripts write.

use anyhow::Context;
use clap::{Args, Subcommand};
use kart_train::data::{Split, flashrag_to_asearcher, flashrag_to_search_r1, merge, verl_to_tir};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// FlashRAG questions (`id`, `question`, `golden_answers`) to the Search-R1 parquet
    /// `scripts/data_process/nq_search.py` writes (same columns, `make_prefix` prompt,
    /// `reward_model` and `extra_info`), readable by verl/Search-R1 and by `kart train`.
    SearchR1(SearchR1Args),
    /// FlashRAG questions to ASearcher's JSON lines (`question`, `answer` list, `source`, `qid`, as
    /// ASearcher-Base-35k), readable by ASearcher's training and evaluation scripts and by
    /// `kart train`.
    Asearcher(AsearcherArgs),
    /// verl math rows (ToRL's parquet, verl's GSM8K/MATH preprocessing: `prompt`,
    /// `reward_model.ground_truth`) to the JSON lines AReaL's TIR agent trains on (`messages`,
    /// `answer` as `\boxed{…}`, other columns kept), as its ToRL loader maps them.
    Tir(TirArgs),
    /// Files of one format merged into one training file, every column kept and group keys kept
    /// unique: Search-R1 parquet (`extra_info.index` renumbered within each `data_source`), or
    /// ASearcher or TIR JSON lines (a repeated id gets the first free suffix `#1`, `#2`, …).
    Merge(MergeArgs),
}

#[derive(Debug, Args)]
pub struct AsearcherArgs {
    /// FlashRAG JSON lines, plain or gzipped.
    #[arg(long)]
    input: PathBuf,
    /// The dataset's name, written as `source` (`nq`, `hotpotqa`, …).
    #[arg(long)]
    source: String,
    /// The JSON-lines file to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct TirArgs {
    /// verl math rows: parquet or JSON lines.
    #[arg(long)]
    input: PathBuf,
    /// The JSON-lines file to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The merged file to write.
    #[arg(long)]
    out: PathBuf,
    /// The files to merge, in order.
    #[arg(required = true, num_args = 2..)]
    inputs: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SearchR1Args {
    /// FlashRAG JSON lines, plain or gzipped (`train.jsonl`, `test.jsonl.gz`, …).
    #[arg(long)]
    input: PathBuf,
    /// The dataset's name, written as `data_source` (`nq`, `hotpotqa`, …).
    #[arg(long)]
    source: String,
    /// The split, written as `extra_info.split`: train, validation or test.
    #[arg(long)]
    split: Split,
    /// The parquet file to write.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::SearchR1(args) => {
            anyhow::ensure!(!args.source.is_empty(), "--source: empty; name the dataset (nq, hotpotqa, …)");
            let split = args.split;
            let rows = flashrag_to_search_r1(&args.input, &args.source, split, &args.out)
                .with_context(|| format!("kart data search-r1 --input {}", args.input.display()))?;
            eprintln!("{rows} rows of {} ({}) written to {}", args.source, split.name(), args.out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Asearcher(args) => {
            anyhow::ensure!(!args.source.is_empty(), "--source: empty; name the dataset (nq, hotpotqa, …)");
            let rows = flashrag_to_asearcher(&args.input, &args.source, &args.out)
                .with_context(|| format!("kart data asearcher --input {}", args.input.display()))?;
            eprintln!("{rows} rows of {} written to {}", args.source, args.out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Tir(args) => {
            let rows = verl_to_tir(&args.input, &args.out)
                .with_context(|| format!("kart data tir --input {}", args.input.display()))?;
            eprintln!("{rows} rows written to {}", args.out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Merge(args) => {
            let rows = merge(&args.inputs, &args.out).context("kart data merge")?;
            eprintln!("{rows} rows of {} files written to {}", args.inputs.len(), args.out.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
