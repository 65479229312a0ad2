//! Math rows as verl prepares them (ToRL's parquet, verl's GSM8K and MATH preprocessing:
//! `prompt` as `[{role, content}]`, `reward_model.ground_truth` a string or number) made into the
//! JSON lines AReaL's TIR agent trains on, as its ToRL loader (`areal/dataset/torl_data.py`) maps
//! them: `messages` is the prompt, `answer` the ground truth inside `\boxed{}`, and every other
//! column (`data_source`, `ability`, `extra_info`, …) kept before them.

use super::jsonl::write_json_lines;
use super::parquet::ParquetRows;
use super::rows::messages;
use super::{Container, DataError, JsonLines, magic};
use kart_core::json::kind;
use serde_json::{Map, Value};
use std::path::Path;

/// Converts the verl math file `input` (parquet or JSON lines) into TIR JSON lines `out`; returns
/// the number of rows. A row without a usable `prompt` or `reward_model.ground_truth` fails naming
/// its row and field, and nothing is written.
pub fn verl_to_tir(input: &Path, out: &Path) -> Result<usize, DataError> {
    let rows: Box<dyn Iterator<Item = Result<(usize, Value), DataError>>> = match magic(input)? {
        Container::Parquet => Box::new(ParquetRows::open_all(input)?),
        Container::JsonLines { gzip } => Box::new(JsonLines::open(input, gzip)?),
    };
    let converted = rows
        .map(|row| {
            let (row, value) = row?;
            tir_row(value).map_err(|(field, reason)| DataError::BadRow {
                file: input.to_owned(),
                row,
                field,
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rows = converted.len();
    write_json_lines(out, converted.into_iter())?;
    Ok(rows)
}

/// One TIR row from one verl row, or the field that is wrong and why.
fn tir_row(value: Value) -> Result<Value, (String, String)> {
    let Value::Object(row) = value else {
        return Err(("(row)".into(), format!("expected an object, got {}", kind(&value))));
    };
    let prompt = row.get("prompt").cloned().ok_or(("prompt".to_owned(), "missing".to_owned()))?;
    messages(prompt.clone(), "prompt").map_err(|e| (e.field, e.reason))?;
    let truth = match row.get("reward_model").and_then(|r| r.get("ground_truth")) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        other => {
            let got = other.map_or("nothing", kind);
            return Err((
                "reward_model.ground_truth".into(),
                format!("expected a string or a number, got {got}"),
            ));
        }
    };
    let mut tir: Map<String, Value> =
        row.into_iter().filter(|(key, _)| key != "prompt" && key != "reward_model").collect();
    tir.insert("messages".into(), prompt);
    tir.insert("answer".into(), Value::String(format!("\\boxed{{{truth}}}")));
    Ok(Value::Object(tir))
}
