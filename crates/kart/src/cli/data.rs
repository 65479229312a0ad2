//! `kart data`: dataset preparation, writing the files upstream's scripts write.

use anyhow::Context;
use clap::{Args, Subcommand};
use kart_train::data::{Split, flashrag_to_search_r1, merge_search_r1};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// FlashRAG questions (`id`, `question`, `golden_answers`) to the Search-R1 parquet
    /// `scripts/data_process/nq_search.py` writes (same columns, `make_prefix` prompt,
    /// `reward_model` and `extra_info`), readable by verl/Search-R1 and by `kart train`.
    SearchR1(SearchR1Args),
    /// Search-R1 parquet files of one schema merged into one training file, every column kept and
    /// `extra_info.index` renumbered within each `data_source` (group keys stay unique).
    Merge(MergeArgs),
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
        Command::Merge(args) => {
            let rows = merge_search_r1(&args.inputs, &args.out).context("kart data merge")?;
            eprintln!("{rows} rows of {} files written to {}", args.inputs.len(), args.out.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
