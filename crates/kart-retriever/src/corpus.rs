//! Streaming reader of the Search-R1 corpus format.
//!
//! A corpus is a JSON-lines file, optionally gzipped (detected by its magic bytes, not its name),
//! with one passage a line in either of two shapes:
//!
//! ```text
//! {"id": "0", "contents": "\"Aaron\"\nAaron is a prophet ..."}
//! {"id": 1, "title": "Aaron", "text": "Aaron is a prophet ..."}
//! ```
//!
//! Numeric ids are kept as their decimal text; a `title`/`text` row becomes Search-R1's
//! `contents` through [`contents`](kart_core::agent::search_r1::contents). Other fields (`url`,
//! …) are kept with the passage, to be returned with it; blank lines are skipped.
//! [`CorpusReader`] reads one line at a time, so memory stays bounded whatever the corpus size,
//! and reports how far it has read through the file for progress bars.

use crate::RetrieverError;
use flate2::read::MultiGzDecoder;
use kart_core::json::kind;
use serde::Deserialize;
use serde_json::Value;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One passage of a corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    /// The corpus id.
    pub id: String,
    /// Search-R1's `contents`: `"{title}"`, a newline, then the text.
    pub contents: String,
    /// The row's other fields (all but `id`, `contents`, `title` and `text`).
    pub fields: serde_json::Map<String, Value>,
}

/// Iterates over the passages of a corpus file, in file order.
///
/// Each item is a passage or the error of its line; iteration may go on after an error.
pub struct CorpusReader {
    path: PathBuf,
    lines: Box<dyn BufRead + Send>,
    /// Bytes of the file (compressed, for a gzipped corpus) consumed so far.
    consumed: Arc<AtomicU64>,
    total_bytes: u64,
    line: u64,
    buffer: Vec<u8>,
}

impl CorpusReader {
    /// Opens a corpus file, plain or gzipped.
    pub fn open(path: &Path) -> Result<Self, RetrieverError> {
        let Lines { reader: lines, consumed, total_bytes } = open_lines(path)?;
        Ok(CorpusReader {
            path: path.to_path_buf(),
            lines,
            consumed,
            total_bytes,
            line: 0,
            buffer: Vec::new(),
        })
    }

    /// Bytes of the file read so far (compressed bytes for a gzipped corpus).
    pub fn bytes_read(&self) -> u64 {
        self.consumed.load(Ordering::Relaxed)
    }

    /// Size of the file in bytes (compressed size for a gzipped corpus).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn error(&self, reason: String) -> RetrieverError {
        RetrieverError::Corpus { path: self.path.clone(), line: self.line, reason }
    }
}

impl Iterator for CorpusReader {
    type Item = Result<Passage, RetrieverError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buffer.clear();
            match self.lines.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => self.line += 1,
                Err(e) => return Some(Err(RetrieverError::Io { path: self.path.clone(), source: e })),
            }
            if !self.buffer.iter().all(u8::is_ascii_whitespace) {
                return Some(parse_row(&self.buffer).map_err(|reason| self.error(reason)));
            }
        }
    }
}

/// An open JSON-lines file.
pub(crate) struct Lines {
    /// Its lines, decompressed.
    pub reader: Box<dyn BufRead + Send>,
    /// Bytes of the file consumed so far (compressed bytes for a gzipped file).
    pub consumed: Arc<AtomicU64>,
    /// Size of the file in bytes.
    pub total_bytes: u64,
}

/// Opens a JSON-lines file, plain or gzipped (told by its magic bytes).
pub(crate) fn open_lines(path: &Path) -> Result<Lines, RetrieverError> {
    let io_error = |source| RetrieverError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_error)?;
    let total_bytes = file.metadata().map_err(io_error)?.len();
    let consumed = Arc::new(AtomicU64::new(0));
    let mut raw = BufReader::new(CountingReader { inner: file, consumed: Arc::clone(&consumed) });
    let gzipped = raw.fill_buf().map_err(io_error)?.starts_with(&[0x1f, 0x8b]);
    let lines: Box<dyn BufRead + Send> =
        if gzipped { Box::new(BufReader::new(MultiGzDecoder::new(raw))) } else { Box::new(raw) };
    Ok(Lines { reader: lines, consumed, total_bytes })
}

/// The fields of a row, as a fast typed parse sees them; see [`diagnose`] for why a row fails it.
#[derive(Deserialize)]
struct Row {
    id: Option<Value>,
    contents: Option<String>,
    title: Option<String>,
    text: Option<String>,
    #[serde(flatten)]
    fields: serde_json::Map<String, Value>,
}

/// The passage of one JSON line, or why the line is not a corpus row.
fn parse_row(line: &[u8]) -> Result<Passage, String> {
    let row: Row = serde_json::from_slice(line).map_err(|e| diagnose(line, e))?;
    let id = match row.id {
        Some(Value::String(id)) => id,
        Some(Value::Number(id)) => id.to_string(),
        Some(other) => {
            return Err(format!("field \"id\" must be a string or a number, found {}", kind(&other)));
        }
        None => return Err("missing field \"id\"".into()),
    };
    let contents = match (row.contents, row.title, row.text) {
        (Some(contents), _, _) => contents,
        (None, Some(title), Some(text)) => kart_core::agent::search_r1::contents(&title, &text),
        (None, Some(_), None) => return Err("missing field \"text\" (a row with \"title\" needs it)".into()),
        (None, None, _) => return Err("missing field \"contents\" (or \"title\" and \"text\")".into()),
    };
    Ok(Passage { id, contents, fields: row.fields })
}

/// Names what makes `line` fail the typed parse: invalid JSON, not an object, or the field of the
/// wrong type.
fn diagnose(line: &[u8], typed: serde_json::Error) -> String {
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => return format!("invalid JSON: {e}"),
    };
    let Some(object) = value.as_object() else {
        return format!("expected a JSON object, found {}", kind(&value));
    };
    ["contents", "title", "text"]
        .into_iter()
        .find_map(|field| match object.get(field) {
            Some(v) if !v.is_string() && !v.is_null() => {
                Some(format!("field \"{field}\" must be a string, found {}", kind(v)))
            }
            _ => None,
        })
        .unwrap_or_else(|| typed.to_string())
}

/// Counts the bytes read through it.
struct CountingReader<R> {
    inner: R,
    consumed: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    const ROWS: &str = concat!(
        r#"{"id": "0", "contents": "\"Aaron\"\nAaron is a prophet."}"#,
        "\n\n",
        r#"{"id": 17, "title": "Paris", "text": "Capital of France.", "extra": [1]}"#,
        "\n",
        r#"{"id": 2.5, "contents": "no title line"}"#,
    );

    fn read_all(path: &Path) -> Vec<Passage> {
        CorpusReader::open(path).unwrap().collect::<Result<_, _>>().unwrap()
    }

    fn expected() -> Vec<Passage> {
        vec![
            Passage {
                id: "0".into(),
                contents: "\"Aaron\"\nAaron is a prophet.".into(),
                fields: serde_json::Map::new(),
            },
            Passage {
                id: "17".into(),
                contents: "\"Paris\"\nCapital of France.".into(),
                fields: serde_json::json!({"extra": [1]}).as_object().unwrap().clone(),
            },
            Passage { id: "2.5".into(), contents: "no title line".into(), fields: serde_json::Map::new() },
        ]
    }

    #[test]
    fn reads_plain_rows_of_both_shapes_with_numeric_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus.jsonl");
        std::fs::write(&path, ROWS).unwrap();
        assert_eq!(read_all(&path), expected());
    }

    #[test]
    fn reads_gzipped_corpus_by_magic_bytes_and_counts_compressed_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // Named like a plain file: detection must not rely on the extension.
        let path = dir.path().join("corpus.jsonl");
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(ROWS.as_bytes()).unwrap();
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let mut reader = CorpusReader::open(&path).unwrap();
        let total = std::fs::metadata(&path).unwrap().len();
        assert_eq!(reader.total_bytes(), total);
        assert_eq!(reader.by_ref().collect::<Result<Vec<_>, _>>().unwrap(), expected());
        assert_eq!(reader.bytes_read(), total);
    }

    #[test]
    fn bad_rows_name_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        let rows = [
            r#"{"id": "a", "contents": "ok"}"#,
            r#"{"contents": "no id"}"#,
            r#"{"id": [1], "contents": "x"}"#,
            r#"{"id": "b", "contents": 3}"#,
            r#"{"id": "c", "title": "T"}"#,
            r#"{"id": "d"}"#,
            r#"{"id": "e", "contents": "#,
            r#"["not", "an", "object"]"#,
        ];
        std::fs::write(&path, rows.join("\n")).unwrap();
        let errors: Vec<String> =
            CorpusReader::open(&path).unwrap().skip(1).map(|r| r.unwrap_err().to_string()).collect();
        let shown = path.display();
        let expected = [
            format!("{shown}:2: missing field \"id\""),
            format!("{shown}:3: field \"id\" must be a string or a number, found an array"),
            format!("{shown}:4: field \"contents\" must be a string, found a number"),
            format!("{shown}:5: missing field \"text\" (a row with \"title\" needs it)"),
            format!("{shown}:6: missing field \"contents\" (or \"title\" and \"text\")"),
        ];
        assert_eq!(errors[..5], expected);
        assert!(errors[5].starts_with(&format!("{shown}:7: invalid JSON: ")), "{}", errors[5]);
        assert_eq!(errors[6], format!("{shown}:8: expected a JSON object, found an array"));
    }

    #[test]
    fn missing_file_is_named() {
        let err = CorpusReader::open(Path::new("/nonexistent/corpus.jsonl")).err().unwrap();
        assert!(err.to_string().starts_with("/nonexistent/corpus.jsonl: "), "{err}");
    }
}
