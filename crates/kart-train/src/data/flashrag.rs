//! FlashRAG question files (`{"id", "question", "golden_answers"}` per line, plain or gzip) made
//! into upstream training files:
//! - the Search-R1 parquet that `scripts/data_process/nq_search.py` writes from them: the
//!   question stripped with `?` appended, put in `make_prefix`'s prompt, the golden answers as
//!   `reward_model.ground_truth.target`, the source columns kept ([`flashrag_to_search_r1`]);
//! - ASearcher's JSON lines (`question`, `answer`, `source`, `qid`, as in ASearcher-Base-35k),
//!   which ASearcher's `asearcher.py` and `evaluation/search_eval_async.py` read and which its
//!   prompt template formats itself ([`flashrag_to_asearcher`]).

use super::jsonl::write_json_lines;
use super::{Container, DataError, JsonLines, magic, write_search_r1};
use kart_core::agent::search_r1::{make_prefix, normalize_question};
use kart_core::chat::ChatMessage;
use kart_core::wire::Task;
use serde_json::{Value, json};
use std::path::Path;

/// The split a file is written as (`extra_info.split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Validation,
    Test,
}

impl std::str::FromStr for Split {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        [Split::Train, Split::Validation, Split::Test]
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| "expected train, validation or test".to_owned())
    }
}

impl Split {
    /// Its name in `extra_info.split`, as `nq_search.py` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
}

/// One FlashRAG question.
struct Question {
    id: String,
    question: String,
    answers: Vec<String>,
    /// The line it came from (0-based), for errors.
    line: usize,
}

/// The questions of the FlashRAG file `input`. A row without a usable `id`, `question` or
/// `golden_answers` fails naming its line and field.
fn read_questions(input: &Path) -> Result<Vec<Question>, DataError> {
    let gzip = match magic(input)? {
        Container::JsonLines { gzip } => gzip,
        Container::Parquet => {
            return Err(DataError::BadRow {
                file: input.to_owned(),
                row: 0,
                field: "(file)".into(),
                reason: "a parquet file; FlashRAG questions are JSON lines".into(),
            });
        }
    };
    let mut questions = Vec::new();
    for row in JsonLines::open(input, gzip)? {
        let (line, value) = row?;
        let bad = |field: &str, reason: String| bad_row(input, line, field, reason);
        let id = match value.get("id") {
            Some(Value::String(id)) => id.clone(),
            Some(Value::Number(id)) => id.to_string(),
            other => return Err(bad("id", format!("expected a string or a number, got {}", shown(other)))),
        };
        let Some(question) = value.get("question").and_then(Value::as_str) else {
            return Err(bad("question", format!("expected a string, got {}", shown(value.get("question")))));
        };
        if question.trim().is_empty() {
            return Err(bad("question", format!("empty: {question:?}")));
        }
        let answers: Vec<String> = match value.get("golden_answers") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|a| a.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("golden_answers", "expected a list of strings".into()))?,
            Some(Value::String(answer)) => vec![answer.clone()],
            other => {
                return Err(bad(
                    "golden_answers",
                    format!("expected a list of strings, got {}", shown(other)),
                ));
            }
        };
        questions.push(Question { id, question: question.to_owned(), answers, line });
    }
    Ok(questions)
}

/// Converts the FlashRAG file `input` of dataset `source` (`nq`, `hotpotqa`, …) into a Search-R1
/// parquet file `out`; returns the number of rows. A bad row fails naming its line and field, and
/// nothing is written.
pub fn flashrag_to_search_r1(
    input: &Path,
    source: &str,
    split: Split,
    out: &Path,
) -> Result<usize, DataError> {
    let (mut prompts, mut questions) = (Vec::new(), Vec::new());
    for q in read_questions(input)? {
        let bad =
            |e: kart_core::agent::search_r1::PromptError| bad_row(input, q.line, "question", e.to_string());
        let prompt = make_prefix(&q.question).map_err(bad)?;
        // nq_search.py rewrites the row's own `question` so before the prefix.
        questions.push(normalize_question(&q.question).map_err(bad)?);
        prompts.push(Task {
            id: q.id,
            messages: Some(vec![ChatMessage::new("user", prompt)]),
            prompt: None,
            ground_truth: q.answers,
            data_source: source.to_owned(),
            tools: None,
        });
    }
    write_search_r1(out, &prompts, &questions, "fact-reasoning", split.name())?;
    Ok(prompts.len())
}

/// Converts the FlashRAG file `input` of dataset `source` into ASearcher JSON lines `out`
/// (`{"question", "answer": [golden answers], "source", "qid"}` per line, the question as
/// written); returns the number of rows. A bad row fails naming its line and field, and nothing
/// is written.
pub fn flashrag_to_asearcher(input: &Path, source: &str, out: &Path) -> Result<usize, DataError> {
    let questions = read_questions(input)?;
    let rows = questions
        .iter()
        .map(|q| json!({"question": q.question, "answer": q.answers, "source": source, "qid": q.id}));
    write_json_lines(out, rows)?;
    Ok(questions.len())
}

fn bad_row(file: &Path, row: usize, field: &str, reason: String) -> DataError {
    DataError::BadRow { file: file.to_owned(), row, field: field.into(), reason }
}

/// A JSON value as an error shows it.
fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_owned(), Value::to_string)
}
