//! Several dataset files merged into one training file, every column kept and the group keys
//! kept unique:
//! - Search-R1 parquet, as Search-R1's `qa_search_train_merge.py` does: `extra_info.index` is
//!   renumbered within each `data_source` in the merged order, so that the group keys
//!   `{data_source}/{index}` stay unique even when a source comes from several files;
//! - ASearcher or TIR JSON lines, all of one format: the rows in order, and an id (`query_id`,
//!   `id`, `qid` or ASearcher's `idx`) already taken by an earlier row gets the first free suffix
//!   `#1`, `#2`, … (rows without an id are keyed by their line, unique in the merged file).

use super::jsonl::write_json_lines;
use super::rows::{ID_KEYS, RowFormat};
use super::{Container, DataError, Ids, JsonLines, magic};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, RecordBatchReader, StructArray};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Merges `inputs` into `out`: Search-R1 parquet files of one schema (as `nq_search.py` and
/// `kart data search-r1` write them), or ASearcher or TIR JSON lines of one format; returns the
/// number of rows. Nothing is written when an input is unreadable or of another kind.
pub fn merge(inputs: &[PathBuf], out: &Path) -> Result<usize, DataError> {
    let mut parquet = Vec::with_capacity(inputs.len());
    for file in inputs {
        parquet.push(matches!(magic(file)?, Container::Parquet));
    }
    match (parquet.iter().all(|p| *p), parquet.iter().any(|p| *p)) {
        (true, _) => merge_search_r1(inputs, out),
        (false, false) => merge_json_lines(inputs, out),
        (false, true) => {
            let odd = inputs.iter().zip(&parquet).find(|(_, p)| **p != parquet[0]).map(|(f, _)| f);
            Err(DataError::Column {
                file: odd.unwrap_or(&inputs[0]).to_owned(),
                column: "(file)".into(),
                reason: format!(
                    "{} while {} is {}; merged files need one container",
                    if parquet[0] { "JSON lines" } else { "parquet" },
                    inputs[0].display(),
                    if parquet[0] { "parquet" } else { "JSON lines" }
                ),
            })
        }
    }
}

/// ASearcher or TIR JSON lines merged in order, ids made unique.
fn merge_json_lines(inputs: &[PathBuf], out: &Path) -> Result<usize, DataError> {
    // ASearcher's ground-truth lookup also keys rows by `idx`.
    let keys: Vec<&str> = ID_KEYS.iter().copied().chain(["idx"]).collect();
    let mut ids: HashMap<&str, Ids> = HashMap::new();
    let mut first: Option<(RowFormat, &Path)> = None;
    let mut rows = Vec::new();
    for file in inputs {
        let gzip = matches!(magic(file)?, Container::JsonLines { gzip: true });
        for (index, row) in JsonLines::open(file, gzip)?.enumerate() {
            let (line, mut value) = row?;
            let bad = |field: &str, reason: String| DataError::BadRow {
                file: file.to_owned(),
                row: line,
                field: field.into(),
                reason,
            };
            let Value::Object(object) = &mut value else {
                return Err(bad("(row)", "expected an object".into()));
            };
            if index == 0 {
                let format = RowFormat::detect(|key| object.contains_key(key));
                match first {
                    None => first = Some((format, file)),
                    Some((expected, origin)) if expected != format => {
                        return Err(bad(
                            "(row)",
                            format!("{format:?} rows, while {} has {expected:?} rows", origin.display()),
                        ));
                    }
                    Some(_) => {}
                }
            }
            for key in &keys {
                let Some(id) = object.get_mut(*key).filter(|v| !v.is_null()) else { continue };
                let text = match &*id {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let unique = ids.entry(key).or_default().unique(text.clone());
                if unique != text {
                    *id = Value::String(unique);
                }
            }
            rows.push(value);
        }
    }
    let count = rows.len();
    write_json_lines(out, rows.into_iter())?;
    Ok(count)
}

/// Search-R1 parquet files of one schema merged, `extra_info.index` renumbered.
fn merge_search_r1(inputs: &[PathBuf], out: &Path) -> Result<usize, DataError> {
    let mut schema: Option<SchemaRef> = None;
    let mut batches = Vec::new();
    for file in inputs {
        let parquet = |source| DataError::Parquet { file: file.to_owned(), source };
        let f = File::open(file).map_err(|source| DataError::Io { file: file.to_owned(), source })?;
        // Without pandas' stored Arrow schema, its `large_string` columns read as `string`.
        let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
        let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(f, options)
            .map_err(parquet)?
            .build()
            .map_err(parquet)?;
        let this = reader.schema();
        match &schema {
            None => schema = Some(this.clone()),
            Some(first) if first.fields() != this.fields() => {
                let differs =
                    first.fields().iter().zip(this.fields().iter()).find(|(a, b)| a != b).map_or_else(
                        || "the number of columns".to_owned(),
                        |(a, _)| format!("`{}`", a.name()),
                    );
                return Err(DataError::Column {
                    file: file.to_owned(),
                    column: differs,
                    reason: format!("differs from {}'s; merged files need one schema", inputs[0].display()),
                });
            }
            Some(_) => {}
        }
        for batch in reader {
            batches.push((file, batch.map_err(|source| DataError::Arrow { file: file.to_owned(), source })?));
        }
    }
    let Some(schema) = schema else { return Ok(0) };
    let mut counters: HashMap<String, i64> = HashMap::new();
    let mut renumbered = Vec::with_capacity(batches.len());
    for (file, batch) in batches {
        renumbered.push(renumber(file, &batch, &mut counters)?);
    }
    let parquet = |source| DataError::Parquet { file: out.to_owned(), source };
    let f = File::create(out).map_err(|source| DataError::Io { file: out.to_owned(), source })?;
    let properties = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut writer = ArrowWriter::try_new(f, schema, Some(properties)).map_err(parquet)?;
    let mut rows = 0;
    for batch in &renumbered {
        writer.write(batch).map_err(parquet)?;
        rows += batch.num_rows();
    }
    writer.close().map_err(parquet)?;
    Ok(rows)
}

/// `batch` with `extra_info.index` numbered on from `counters` within each `data_source`.
fn renumber(
    file: &Path,
    batch: &RecordBatch,
    counters: &mut HashMap<String, i64>,
) -> Result<RecordBatch, DataError> {
    let column = |name: &str, reason: &str| DataError::Column {
        file: file.to_owned(),
        column: name.to_owned(),
        reason: reason.to_owned(),
    };
    let sources = batch
        .column_by_name("data_source")
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| column("data_source", "missing or not strings"))?;
    let position = batch.schema().index_of("extra_info").map_err(|_| column("extra_info", "missing"))?;
    let extra = batch.column(position).as_struct_opt().ok_or_else(|| column("extra_info", "not a struct"))?;
    let (fields, mut children, nulls) = extra.clone().into_parts();
    let at = fields.iter().position(|f| f.name() == "index" && *f.data_type() == DataType::Int64);
    let at = at.ok_or_else(|| column("extra_info.index", "missing or not a 64-bit integer"))?;
    let index: Int64Array = (0..batch.num_rows())
        .map(|row| {
            let source = if sources.is_null(row) { "" } else { sources.value(row) };
            let next = counters.entry(source.to_owned()).or_insert(0);
            *next += 1;
            Some(*next - 1)
        })
        .collect();
    children[at] = Arc::new(index) as ArrayRef;
    let extra = StructArray::try_new(fields, children, nulls)
        .map_err(|source| DataError::Arrow { file: file.to_owned(), source })?;
    let mut columns = batch.columns().to_vec();
    columns[position] = Arc::new(extra);
    RecordBatch::try_new(batch.schema(), columns)
        .map_err(|source| DataError::Arrow { file: file.to_owned(), source })
}
