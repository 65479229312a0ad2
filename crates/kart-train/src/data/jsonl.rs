//! JSON-lines files, plain or gzip-compressed: one JSON object per line; read by [`JsonLines`],
//! written by [`write_json_lines`].

use super::DataError;
use flate2::read::MultiGzDecoder;
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The rows of a JSON-lines file, numbered by line from 0; blank lines are passed over. A line
/// that is not JSON is a bad row, so it can be skipped; a read error ends the file.
pub(super) struct JsonLines {
    file: PathBuf,
    lines: std::iter::Enumerate<std::io::Lines<Box<dyn BufRead>>>,
}

impl JsonLines {
    /// Opens `file`, decompressing it when `gzip`.
    pub fn open(file: &Path, gzip: bool) -> Result<JsonLines, DataError> {
        let f = File::open(file).map_err(|source| DataError::Io { file: file.to_owned(), source })?;
        let reader: Box<dyn Read> = if gzip { Box::new(MultiGzDecoder::new(f)) } else { Box::new(f) };
        let reader: Box<dyn BufRead> = Box::new(BufReader::new(reader));
        Ok(JsonLines { file: file.to_owned(), lines: reader.lines().enumerate() })
    }
}

impl Iterator for JsonLines {
    type Item = Result<(usize, Value), DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (row, line) = self.lines.next()?;
            let line = match line {
                Ok(line) => line,
                Err(source) => return Some(Err(DataError::Io { file: self.file.clone(), source })),
            };
            if line.trim().is_empty() {
                continue;
            }
            return Some(serde_json::from_str(&line).map(|value| (row, value)).map_err(|e| {
                DataError::BadRow {
                    file: self.file.clone(),
                    row,
                    field: "(line)".into(),
                    reason: format!("not JSON: {e}"),
                }
            }));
        }
    }
}

/// Writes `rows` to `file` as JSON lines (plain), one object per line.
pub(super) fn write_json_lines(file: &Path, rows: impl Iterator<Item = Value>) -> Result<(), DataError> {
    let io = |source| DataError::Io { file: file.to_owned(), source };
    let mut out = BufWriter::new(File::create(file).map_err(io)?);
    for row in rows {
        serde_json::to_writer(&mut out, &row).map_err(|e| io(e.into()))?;
        out.write_all(b"\n").map_err(io)?;
    }
    out.flush().map_err(io)
}
