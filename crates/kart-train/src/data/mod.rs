//! Training and evaluation prompts: Search-R1 parquet, ASearcher and TIR JSON lines (plain or
//! gzip), read into the rollout API's [`Task`]s, and the seeded [`Sampler`] that orders them;
//! the files upstream's preparation scripts write: FlashRAG question files made into Search-R1
//! parquet ([`flashrag_to_search_r1`]) or ASearcher JSON lines ([`flashrag_to_asearcher`]), verl
//! math rows made into TIR JSON lines ([`verl_to_tir`]), and several files of one format merged
//! ([`merge`]).
//!
//! Any of the three row schemas may come in either container: a file starting with `PAR1` is
//! parquet, anything else JSON lines (gzip when it starts with gzip's magic bytes).
//! [`DataFormat::Auto`] picks the schema from the columns (parquet) or the first row's keys:
//! `reward_model` means Search-R1, `messages` or `problem` TIR, otherwise ASearcher.
//!
//! # Prompt ids
//! The trajectories of a prompt form one group, so ids must be unique in a dataset. A row's id is
//! - Search-R1: `{data_source}/{extra_info.index}`, or `{data_source}/{row}` without an index;
//! - ASearcher and TIR: `query_id`, `id` or `qid` (the first present, a string or an integer, as
//!   ASearcher's workflow reads it), or `{data_source}/{row}` without one;
//!
//! where `row` is the 0-based row (parquet) or line (JSON lines) number. An id already taken by an
//! earlier row gets the first free suffix `#1`, `#2`, …: upstream's merged NQ+HotpotQA files
//! number each source from 0, which the `data_source` prefix already separates, and any remaining
//! repeats stay apart in file order.

mod flashrag;
mod jsonl;
mod merge;
mod parquet;
mod rows;
mod sampler;
mod tir;

pub use flashrag::{Split, flashrag_to_asearcher, flashrag_to_search_r1};
pub use merge::merge;
pub use parquet::write_search_r1;
pub use sampler::{Sampler, permutation};
pub use tir::verl_to_tir;

use jsonl::JsonLines;
use kart_core::config::train::{DataConfig, DataFormat};
use kart_core::wire::Task;
use parquet::ParquetRows;
use rows::RowFormat;
use serde_json::Value;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The prompts of one file.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub prompts: Vec<Task>,
    /// Bad rows passed over (with `skip_bad_rows`).
    pub skipped: usize,
}

/// Why a dataset cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    #[error("{}: parquet: {source}", file.display())]
    Parquet { file: PathBuf, source: ::parquet::errors::ParquetError },
    #[error("{}: arrow: {source}", file.display())]
    Arrow { file: PathBuf, source: arrow_schema::ArrowError },
    /// A column whose type cannot be read at all.
    #[error("{}: column `{column}`: {reason}", file.display())]
    Column { file: PathBuf, column: String, reason: String },
    /// A row with a missing or mistyped field; skipped with `skip_bad_rows`.
    #[error("{}: row {row} (0-based): {field}: {reason}", file.display())]
    BadRow { file: PathBuf, row: usize, field: String, reason: String },
    #[error("{}: no usable prompts ({skipped} bad rows skipped)", file.display())]
    Empty { file: PathBuf, skipped: usize },
}

impl Dataset {
    /// The training prompts of `config` (`data.train`, at most `max_prompts`).
    pub fn train(config: &DataConfig) -> Result<Dataset, DataError> {
        Dataset::load(&config.train, config.format, config.skip_bad_rows, config.max_prompts)
    }

    /// The held-out prompts of `config` (`data.test`), at most `max_prompts` (0: all).
    pub fn test(config: &DataConfig, max_prompts: usize) -> Result<Option<Dataset>, DataError> {
        let Some(test) = &config.test else { return Ok(None) };
        Dataset::load(test, config.format, config.skip_bad_rows, max_prompts).map(Some)
    }

    /// Reads `file` as `format`. A bad row fails the load (naming file, row and field) unless
    /// `skip_bad_rows`, which skips and counts it. Reading stops after the first `max_prompts`
    /// good rows (0: all). A file with no good row is an error.
    pub fn load(
        file: &Path,
        format: DataFormat,
        skip_bad_rows: bool,
        max_prompts: usize,
    ) -> Result<Dataset, DataError> {
        let mut format = match format {
            DataFormat::Auto => None,
            DataFormat::SearchR1 => Some(RowFormat::SearchR1),
            DataFormat::Asearcher => Some(RowFormat::Asearcher),
            DataFormat::Tir => Some(RowFormat::Tir),
        };
        let rows: Box<dyn Iterator<Item = Result<(usize, Value), DataError>>> = match magic(file)? {
            Container::Parquet => {
                let (detected, rows) = ParquetRows::open(file, format)?;
                format = Some(detected);
                Box::new(rows)
            }
            Container::JsonLines { gzip } => Box::new(JsonLines::open(file, gzip)?),
        };
        let mut ids = Ids::default();
        let mut dataset = Dataset { prompts: Vec::new(), skipped: 0 };
        for row in rows {
            if max_prompts > 0 && dataset.prompts.len() == max_prompts {
                break;
            }
            let parsed = row.and_then(|(row, value)| {
                let format = *format.get_or_insert_with(|| {
                    RowFormat::detect(|key| value.as_object().is_some_and(|o| o.contains_key(key)))
                });
                format.parse(value).map(|parsed| (row, parsed)).map_err(|e| DataError::BadRow {
                    file: file.to_owned(),
                    row,
                    field: e.field,
                    reason: e.reason,
                })
            });
            match parsed {
                Ok((row, p)) => dataset.prompts.push(Task {
                    id: ids.unique(p.key.unwrap_or_else(|| format!("{}/{row}", p.data_source))),
                    messages: p.messages,
                    prompt: p.prompt,
                    ground_truth: p.ground_truth,
                    data_source: p.data_source,
                    tools: p.tools,
                }),
                Err(DataError::BadRow { .. }) if skip_bad_rows => dataset.skipped += 1,
                Err(e) => return Err(e),
            }
        }
        if dataset.prompts.is_empty() {
            return Err(DataError::Empty { file: file.to_owned(), skipped: dataset.skipped });
        }
        Ok(dataset)
    }
}

/// How a file is stored.
enum Container {
    Parquet,
    JsonLines { gzip: bool },
}

/// The container of `file`, from its first bytes.
fn magic(file: &Path) -> Result<Container, DataError> {
    let io = |source| DataError::Io { file: file.to_owned(), source };
    let mut head = Vec::with_capacity(4);
    std::fs::File::open(file).map_err(io)?.take(4).read_to_end(&mut head).map_err(io)?;
    Ok(match &head[..] {
        b"PAR1" => Container::Parquet,
        [0x1f, 0x8b, ..] => Container::JsonLines { gzip: true },
        _ => Container::JsonLines { gzip: false },
    })
}

/// Hands out unique ids: a taken id gets the first free suffix `#1`, `#2`, ….
#[derive(Default)]
struct Ids(HashSet<String>);

impl Ids {
    fn unique(&mut self, id: String) -> String {
        let id = match self.0.contains(&id) {
            false => id,
            true => (1usize..)
                .map(|k| format!("{id}#{k}"))
                .find(|candidate| !self.0.contains(candidate))
                .unwrap_or(id),
        };
        self.0.insert(id.clone());
        id
    }
}

#[cfg(test)]
mod tests;
