//! Conformance checks against test vectors produced by the upstream reference code (Search-R1,
//! ASearcher, verl), and chat templates rendered by transformers.
//!
//! A vector file holds one JSON case per line. Its schema is recognised from the case's fields, not
//! from the file name, so any file of the same schema works wherever it lives. Each schema computes
//! the `expect` fields with kart's own code and reports the first difference. A model folder with
//! transformers' oracle outputs (`expected.json`) is checked as a whole (with the `torch` feature),
//! and so is a file of sentence-transformers embeddings, against an encoder folder.

mod asearcher_reward;
mod chat_template;
pub mod compare;
pub mod encoder;
pub mod model;
mod search_r1_protocol;
mod search_r1_reward;
mod tensor_twins;
mod verl_core_algos;
mod verl_gae;

pub use compare::Mismatch;

use serde_json::Value;
use std::path::{Path, PathBuf};

/// One kind of conformance case.
pub trait Schema: Sync {
    /// A short name for reports, e.g. `search-r1/reward`.
    fn name(&self) -> &'static str;
    /// Whether `case` has the fields of this schema.
    fn recognises(&self, case: &Value) -> bool;
    /// Computes the case's expectations with kart's code; `Err` names the first difference.
    /// Files a case names (a chat template) are found in `dir`, the vector file's folder.
    fn check(&self, case: &Value, dir: &Path) -> Result<(), Mismatch>;
}

/// Every schema kart recognises, most specific first.
pub fn schemas() -> [&'static dyn Schema; 6] {
    [
        &chat_template::ChatTemplateRendering,
        &search_r1_protocol::SearchR1Protocol,
        &search_r1_reward::SearchR1Reward,
        &asearcher_reward::ASearcherReward,
        &verl_core_algos::VerlCoreAlgos,
        &verl_gae::VerlGae,
    ]
}

/// Why a file could not be checked at all.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: not valid JSON: {source}")]
    Json { path: PathBuf, line: usize, source: serde_json::Error },
    #[error("{path}:{line}: not a recognised conformance case (fields: {fields})")]
    Unrecognised { path: PathBuf, line: usize, fields: String },
    #[error("{path}: holds no conformance cases")]
    Empty { path: PathBuf },
    #[error("{path}: {reason}")]
    Model { path: PathBuf, reason: String },
}

/// A case that did not pass.
#[derive(Debug, Clone)]
pub struct Failure {
    pub path: PathBuf,
    pub line: usize,
    pub schema: &'static str,
    pub mismatch: Mismatch,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FAIL {}:{} [{}] {}", self.path.display(), self.line, self.schema, self.mismatch)
    }
}

/// The outcome of checking one or more files.
#[derive(Debug, Default)]
pub struct Report {
    pub passed: usize,
    pub failures: Vec<Failure>,
}

impl Report {
    /// Adds another report's counts and failures to this one.
    pub fn merge(&mut self, other: Report) {
        self.passed += other.passed;
        self.failures.extend(other.failures);
    }

    /// The closing line: `N passed, M failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed, self.failures.len())
    }
}

/// Checks every case of one JSON-lines vector file.
pub fn check_file(path: &Path) -> Result<Report, ConformanceError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConformanceError::Io { path: path.into(), source })?;
    let mut report = Report::default();
    let mut cases = 0;
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line_no = i + 1;
        let case: Value = serde_json::from_str(line).map_err(|source| ConformanceError::Json {
            path: path.into(),
            line: line_no,
            source,
        })?;
        let schema = schemas().into_iter().find(|s| s.recognises(&case)).ok_or_else(|| {
            ConformanceError::Unrecognised { path: path.into(), line: line_no, fields: field_names(&case) }
        })?;
        cases += 1;
        match schema.check(&case, path.parent().unwrap_or(Path::new("."))) {
            Ok(()) => report.passed += 1,
            Err(mismatch) => report.failures.push(Failure {
                path: path.into(),
                line: line_no,
                schema: schema.name(),
                mismatch,
            }),
        }
    }
    if cases == 0 {
        return Err(ConformanceError::Empty { path: path.into() });
    }
    Ok(report)
}

/// Something `kart conformance` checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A JSON-lines vector file.
    Vectors(PathBuf),
    /// A model folder with `expected.json` and `expected.safetensors`.
    Model(PathBuf),
    /// A file of sentence embeddings (`sentences`, `embeddings`), checked with an encoder's folder.
    Embeddings { file: PathBuf, encoder: PathBuf },
}

impl Target {
    /// The file or folder checked, as reports name it.
    pub fn path(&self) -> &Path {
        match self {
            Target::Vectors(path) | Target::Model(path) | Target::Embeddings { file: path, .. } => path,
        }
    }
}

/// Whether `dir` is a model folder with transformers' oracle outputs.
pub fn is_model_dir(dir: &Path) -> bool {
    dir.join("expected.json").is_file() && dir.join("config.json").is_file()
}

/// What a path names: a model folder, the file itself, or every model folder and `*.jsonl` file
/// below a folder, sorted.
pub fn targets(path: &Path) -> Result<Vec<Target>, ConformanceError> {
    if is_model_dir(path) {
        return Ok(vec![Target::Model(path.to_path_buf())]);
    }
    if !path.is_dir() {
        return Ok(vec![Target::Vectors(path.to_path_buf())]);
    }
    let mut entries = Vec::new();
    for entry in
        std::fs::read_dir(path).map_err(|source| ConformanceError::Io { path: path.into(), source })?
    {
        entries.push(entry.map_err(|source| ConformanceError::Io { path: path.into(), source })?.path());
    }
    entries.sort();
    let mut found = Vec::new();
    for p in entries {
        if p.is_dir() {
            found.extend(targets(&p)?);
        } else if p.extension().is_some_and(|e| e == "jsonl") {
            found.push(Target::Vectors(p));
        }
    }
    Ok(found)
}

/// Checks one target.
pub fn check(target: &Target) -> Result<Report, ConformanceError> {
    match target {
        Target::Vectors(file) => check_file(file),
        Target::Model(dir) => model::check_model_dir(dir),
        Target::Embeddings { file, encoder } => encoder::check_embeddings(encoder, file),
    }
}

fn field_names(case: &Value) -> String {
    match case {
        Value::Object(m) => m.keys().cloned().collect::<Vec<_>>().join(", "),
        other => format!("not an object: {}", other.to_string().chars().take(60).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kart-conformance-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn unrecognised_case_names_file_and_line() {
        let d = temp_dir("unrecognised");
        let p = write(&d, "x.jsonl", "\n{\"foo\": 1}\n");
        let err = check_file(&p).unwrap_err().to_string();
        assert!(err.contains("x.jsonl:2: not a recognised conformance case (fields: foo)"), "{err}");
    }

    #[test]
    fn invalid_json_names_file_and_line() {
        let d = temp_dir("badjson");
        let p =
            write(&d, "y.jsonl", "{\"kind\": \"normalize\", \"input\": \"a\", \"expect\": \"a\"}\n{oops\n");
        let err = check_file(&p).unwrap_err().to_string();
        assert!(err.contains("y.jsonl:2: not valid JSON"), "{err}");
    }

    #[test]
    fn empty_file_is_an_error() {
        let d = temp_dir("empty");
        let p = write(&d, "z.jsonl", "\n");
        assert!(matches!(check_file(&p), Err(ConformanceError::Empty { .. })));
    }
}
