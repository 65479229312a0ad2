//! Parquet files: rows read as JSON objects (only the columns a format uses), and the Search-R1
//! writer.
//!
//! The reader ignores the Arrow schema pandas/pyarrow store in the file and decodes the Parquet
//! types directly, so `large_string`, `large_list` or categorical columns written by any pandas
//! version arrive as plain strings and lists.

use super::DataError;
use super::rows::RowFormat;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{
    Array, ArrayRef, Int64Array, ListArray, OffsetSizeTrait, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Fields, Schema};
use kart_core::wire::Task;
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderOptions, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::{Map, Value};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows decoded per batch.
const BATCH_ROWS: usize = 1024;

/// The rows of a parquet file as JSON objects holding the columns `format` reads (detected from
/// the columns when `None`), numbered from 0.
pub(super) struct ParquetRows {
    file: PathBuf,
    reader: ParquetRecordBatchReader,
    pending: std::vec::IntoIter<Value>,
    next_row: usize,
}

impl ParquetRows {
    pub fn open(file: &Path, format: Option<RowFormat>) -> Result<(RowFormat, ParquetRows), DataError> {
        let builder = Self::builder(file)?;
        let roots = builder.parquet_schema().root_schema().get_fields();
        let has = |name: &str| roots.iter().any(|f| f.name() == name);
        let format = format.unwrap_or_else(|| RowFormat::detect(has));
        let wanted =
            roots.iter().enumerate().filter(|(_, f)| format.columns().contains(&f.name())).map(|(i, _)| i);
        let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
        Ok((format, Self::build(file, builder, mask)?))
    }

    /// The rows of a parquet file with every column.
    pub fn open_all(file: &Path) -> Result<ParquetRows, DataError> {
        Self::build(file, Self::builder(file)?, ProjectionMask::all())
    }

    fn builder(file: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, DataError> {
        let f = File::open(file).map_err(|source| DataError::Io { file: file.to_owned(), source })?;
        let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
        ParquetRecordBatchReaderBuilder::try_new_with_options(f, options)
            .map_err(|source| DataError::Parquet { file: file.to_owned(), source })
    }

    fn build(
        file: &Path,
        builder: ParquetRecordBatchReaderBuilder<File>,
        mask: ProjectionMask,
    ) -> Result<ParquetRows, DataError> {
        let reader = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|source| DataError::Parquet { file: file.to_owned(), source })?;
        Ok(ParquetRows { file: file.to_owned(), reader, pending: Vec::new().into_iter(), next_row: 0 })
    }

    fn decode(&self, batch: &RecordBatch) -> Result<Vec<Value>, DataError> {
        let mut rows = vec![Map::new(); batch.num_rows()];
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let values = json_values(column.as_ref()).map_err(|reason| DataError::Column {
                file: self.file.clone(),
                column: field.name().clone(),
                reason,
            })?;
            for (row, value) in rows.iter_mut().zip(values) {
                row.insert(field.name().clone(), value);
            }
        }
        Ok(rows.into_iter().map(Value::Object).collect())
    }
}

impl Iterator for ParquetRows {
    type Item = Result<(usize, Value), DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(value) = self.pending.next() {
                self.next_row += 1;
                return Some(Ok((self.next_row - 1, value)));
            }
            let batch = match self.reader.next()? {
                Ok(batch) => batch,
                Err(source) => return Some(Err(DataError::Arrow { file: self.file.clone(), source })),
            };
            match self.decode(&batch) {
                Ok(rows) => self.pending = rows.into_iter(),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// An Arrow array as JSON values (nulls as `null`, NaN as `null`), or the unsupported type.
fn json_values(array: &dyn Array) -> Result<Vec<Value>, String> {
    fn numbers<T: ArrowPrimitiveType>(array: &dyn Array) -> Vec<Value>
    where
        T::Native: Into<Value>,
    {
        array.as_primitive::<T>().iter().map(|v| v.map_or(Value::Null, Into::into)).collect()
    }
    fn strings<'a>(values: impl Iterator<Item = Option<&'a str>>) -> Vec<Value> {
        values.map(|v| v.map_or(Value::Null, |s| Value::String(s.to_owned()))).collect()
    }
    /// Splits a list's converted child values (the slice its rows cover) into the rows.
    fn lists(array: &dyn Array, child: Vec<Value>, length: impl Fn(usize) -> usize) -> Vec<Value> {
        let mut child = child.into_iter();
        (0..array.len())
            .map(|i| {
                let items: Vec<Value> = child.by_ref().take(length(i)).collect();
                if array.is_null(i) { Value::Null } else { Value::Array(items) }
            })
            .collect()
    }
    /// A list with offsets: only the child values its rows cover are converted (a batch's list
    /// shares its child array with the whole column chunk).
    fn offset_lists<O: OffsetSizeTrait>(array: &dyn Array) -> Result<Vec<Value>, String> {
        let list = array.as_list::<O>();
        let offsets = list.value_offsets();
        let (first, last) = (offsets[0].as_usize(), offsets[list.len()].as_usize());
        let child = json_values(list.values().slice(first, last - first).as_ref())?;
        Ok(lists(array, child, |i| (offsets[i + 1] - offsets[i]).as_usize()))
    }
    Ok(match array.data_type() {
        DataType::Null => vec![Value::Null; array.len()],
        DataType::Boolean => array.as_boolean().iter().map(|v| v.map_or(Value::Null, Value::Bool)).collect(),
        DataType::Int8 => numbers::<Int8Type>(array),
        DataType::Int16 => numbers::<Int16Type>(array),
        DataType::Int32 => numbers::<Int32Type>(array),
        DataType::Int64 => numbers::<Int64Type>(array),
        DataType::UInt8 => numbers::<UInt8Type>(array),
        DataType::UInt16 => numbers::<UInt16Type>(array),
        DataType::UInt32 => numbers::<UInt32Type>(array),
        DataType::UInt64 => numbers::<UInt64Type>(array),
        DataType::Float32 => numbers::<Float32Type>(array),
        DataType::Float64 => numbers::<Float64Type>(array),
        DataType::Utf8 => strings(array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => strings(array.as_string::<i64>().iter()),
        DataType::Utf8View => strings(array.as_string_view().iter()),
        DataType::List(_) => offset_lists::<i32>(array)?,
        DataType::LargeList(_) => offset_lists::<i64>(array)?,
        DataType::FixedSizeList(_, n) => {
            // Slicing a fixed-size list slices its child, so the child is exactly its rows.
            let n = *n as usize;
            lists(array, json_values(array.as_fixed_size_list().values().as_ref())?, |_| n)
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut columns = Vec::with_capacity(fields.len());
            for column in s.columns() {
                columns.push(json_values(column.as_ref())?.into_iter());
            }
            (0..array.len())
                .map(|i| {
                    let object: Map<String, Value> = fields
                        .iter()
                        .zip(columns.iter_mut())
                        .map(|(f, c)| (f.name().clone(), c.next().unwrap_or(Value::Null)))
                        .collect();
                    if s.is_null(i) { Value::Null } else { Value::Object(object) }
                })
                .collect()
        }
        other => return Err(format!("unsupported parquet type {other}")),
    })
}

/// Writes `prompts` as a Search-R1 parquet file, the columns and struct field order
/// `scripts/data_process/nq_search.py` produces (its `datasets.map` keeps the source columns):
/// `id`, `question` (`questions[i]`, the source question), `golden_answers`, `data_source`,
/// `prompt` [{role, content}], `ability`, `reward_model` {style: "rule", ground_truth: {target:
/// [str]}}, `extra_info` {split, index} with `index` the position in `prompts`; so
/// `pyarrow.concat_tables` joins kart's files and upstream's. A prompt without `messages` is
/// written as one user message holding its `prompt` (Search-R1 files carry the full prompt
/// text). Snappy-compressed, as pandas writes by default.
pub fn write_search_r1(
    file: &Path,
    prompts: &[Task],
    questions: &[String],
    ability: &str,
    split: &str,
) -> Result<(), DataError> {
    if questions.len() != prompts.len() {
        return Err(DataError::BadRow {
            file: file.to_owned(),
            row: questions.len().min(prompts.len()),
            field: "question".into(),
            reason: format!("{} questions for {} prompts", questions.len(), prompts.len()),
        });
    }
    let nullable = |name: &str, data_type| Arc::new(Field::new(name, data_type, true));
    let strings = |values: Vec<&str>| Arc::new(StringArray::from(values)) as ArrayRef;
    let list_of = |item: DataType, lengths: Vec<usize>, values: ArrayRef| {
        Arc::new(ListArray::new(nullable("element", item), OffsetBuffer::from_lengths(lengths), values, None))
            as ArrayRef
    };

    let mut messages = Vec::with_capacity(prompts.len());
    for (row, p) in prompts.iter().enumerate() {
        match (&p.messages, &p.prompt) {
            (Some(m), _) if !m.is_empty() => {
                messages.push(m.iter().map(|m| (&m.role[..], &m.content[..])).collect())
            }
            (_, Some(text)) => messages.push(vec![("user", &text[..])]),
            _ => {
                return Err(DataError::BadRow {
                    file: file.to_owned(),
                    row,
                    field: "messages".into(),
                    reason: "a prompt needs `messages` or `prompt`".into(),
                });
            }
        }
    }
    let message_fields =
        Fields::from(vec![nullable("role", DataType::Utf8), nullable("content", DataType::Utf8)]);
    let all = messages.iter().flatten();
    let message_array = StructArray::new(
        message_fields.clone(),
        vec![strings(all.clone().map(|m| m.0).collect()), strings(all.map(|m| m.1).collect())],
        None,
    );
    let prompt = list_of(
        DataType::Struct(message_fields),
        messages.iter().map(Vec::len).collect(),
        Arc::new(message_array),
    );

    let answers = || {
        list_of(
            DataType::Utf8,
            prompts.iter().map(|p| p.ground_truth.len()).collect(),
            strings(prompts.iter().flat_map(|p| p.ground_truth.iter().map(String::as_str)).collect()),
        )
    };
    let target = answers();
    let ground_truth_fields = Fields::from(vec![nullable("target", target.data_type().clone())]);
    let ground_truth = Arc::new(StructArray::new(ground_truth_fields.clone(), vec![target], None));
    let reward_fields = Fields::from(vec![
        nullable("style", DataType::Utf8),
        nullable("ground_truth", DataType::Struct(ground_truth_fields)),
    ]);
    let reward_model = StructArray::new(
        reward_fields.clone(),
        vec![strings(vec!["rule"; prompts.len()]), ground_truth],
        None,
    );

    let extra_fields =
        Fields::from(vec![nullable("split", DataType::Utf8), nullable("index", DataType::Int64)]);
    let index = Arc::new(Int64Array::from_iter_values(0..prompts.len() as i64)) as ArrayRef;
    let extra_info =
        StructArray::new(extra_fields.clone(), vec![strings(vec![split; prompts.len()]), index], None);

    let golden_answers = answers();
    let schema = Arc::new(Schema::new(vec![
        nullable("id", DataType::Utf8),
        nullable("question", DataType::Utf8),
        nullable("golden_answers", golden_answers.data_type().clone()),
        nullable("data_source", DataType::Utf8),
        nullable("prompt", prompt.data_type().clone()),
        nullable("ability", DataType::Utf8),
        nullable("reward_model", DataType::Struct(reward_fields)),
        nullable("extra_info", DataType::Struct(extra_fields)),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            strings(prompts.iter().map(|p| p.id.as_str()).collect()),
            strings(questions.iter().map(String::as_str).collect()),
            golden_answers,
            strings(prompts.iter().map(|p| p.data_source.as_str()).collect()),
            prompt,
            strings(vec![ability; prompts.len()]),
            Arc::new(reward_model),
            Arc::new(extra_info),
        ],
    )
    .map_err(|source| DataError::Arrow { file: file.to_owned(), source })?;

    let parquet = |source| DataError::Parquet { file: file.to_owned(), source };
    let out = File::create(file).map_err(|source| DataError::Io { file: file.to_owned(), source })?;
    let properties = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut writer = ArrowWriter::try_new(out, schema, Some(properties)).map_err(parquet)?;
    writer.write(&batch).map_err(parquet)?;
    writer.close().map_err(parquet)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use serde_json::json;

    #[test]
    fn sliced_lists_convert_only_their_rows() {
        let mut builder = ListBuilder::new(StringBuilder::new());
        builder.append_value([Some("a"), Some("b")]);
        builder.append(false);
        builder.append_value([Some("c"), None]);
        builder.append_value([Some("d")]);
        let list = builder.finish();
        assert_eq!(
            json_values(&list).unwrap(),
            [json!(["a", "b"]), Value::Null, json!(["c", null]), json!(["d"])]
        );
        assert_eq!(json_values(&list.slice(1, 2)).unwrap(), [Value::Null, json!(["c", null])]);
        let e = json_values(&arrow_array::Date32Array::from(vec![1])).unwrap_err();
        assert_eq!(e, "unsupported parquet type Date32");
    }
}
