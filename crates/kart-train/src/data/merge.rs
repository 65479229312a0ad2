//! Several Search-R1 parquet files merged into one training file, as Search-R1's
//! `qa_search_train_merge.py` does, every column kept; `extra_info.index` is renumbered within
//! each `data_source` in the merged order, so that the group keys `{data_source}/{index}` stay
//! unique even when a source comes from several files.

use super::DataError;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, RecordBatchReader, StructArray};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Merges `inputs` (Search-R1 parquet files of one schema, as `nq_search.py` and
/// `kart data search-r1` write them) into `out`; returns the number of rows.
pub fn merge_search_r1(inputs: &[PathBuf], out: &Path) -> Result<usize, DataError> {
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
