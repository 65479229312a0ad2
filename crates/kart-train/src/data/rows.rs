//! One row of a dataset (a JSON object, whichever file it came from) read as a prompt of one of
//! the three formats.

use kart_core::chat::ChatMessage;
use kart_core::json::kind;
use serde_json::{Map, Value};

/// The columns of a Search-R1 row kart reads; others (`ability`, `golden_answers`, …) are ignored.
const SEARCH_R1_COLUMNS: &[&str] = &["data_source", "prompt", "reward_model", "extra_info", "tools"];

/// The keys of an ASearcher or TIR row kart reads.
const QA_COLUMNS: &[&str] = &[
    "query_id",
    "id",
    "qid",
    "data_source",
    "source",
    "messages",
    "question",
    "problem",
    "answer",
    "answers",
    "tools",
];

/// The keys a row's id may have, in the order ASearcher's workflow looks for them.
pub(super) const ID_KEYS: &[&str] = &["query_id", "id", "qid"];

/// A row's prompt before it gets its unique id.
#[derive(Debug)]
pub(super) struct Parsed {
    /// The row's own key (`{data_source}/{extra_info.index}`, or `id`), when it has one.
    pub key: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt: Option<String>,
    pub ground_truth: Vec<String>,
    pub data_source: String,
    /// The functions the row offers (its `tools` column).
    pub tools: Option<Vec<Value>>,
}

/// What is wrong with a row: the field (a path like `prompt[0].content`) and why.
#[derive(Debug, PartialEq)]
pub(super) struct RowError {
    pub field: String,
    pub reason: String,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> RowError {
    RowError { field: field.into(), reason: reason.into() }
}

/// The schema of a dataset's rows (a [`DataFormat`](kart_core::config::train::DataFormat) once `auto`
/// is decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RowFormat {
    SearchR1,
    Asearcher,
    Tir,
}

impl RowFormat {
    /// The format a row looks like: Search-R1 with `reward_model`, TIR with `messages` or
    /// `problem`, ASearcher otherwise.
    pub fn detect(has_key: impl Fn(&str) -> bool) -> RowFormat {
        if has_key("reward_model") {
            RowFormat::SearchR1
        } else if has_key("messages") || has_key("problem") {
            RowFormat::Tir
        } else {
            RowFormat::Asearcher
        }
    }

    /// The keys this format reads.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            RowFormat::SearchR1 => SEARCH_R1_COLUMNS,
            RowFormat::Asearcher | RowFormat::Tir => QA_COLUMNS,
        }
    }

    /// Reads `row` as a prompt of this format (moving its strings out).
    pub fn parse(self, row: Value) -> Result<Parsed, RowError> {
        let row = object(row).map_err(|r| bad("(row)", r))?;
        match self {
            RowFormat::SearchR1 => search_r1(row),
            RowFormat::Asearcher => qa(row, "asearcher"),
            RowFormat::Tir => qa(row, "tir"),
        }
    }
}

/// Search-R1 (verl) row: `data_source`, `prompt` [{role, content}],
/// `reward_model.ground_truth.target` (list of strings or one string; a bare
/// `reward_model.ground_truth` string or list is accepted too), optional `extra_info.index`.
fn search_r1(mut row: Map<String, Value>) -> Result<Parsed, RowError> {
    let data_source = string(&mut row, "data_source")?;
    let messages = messages(required(&mut row, "prompt")?, "prompt")?;
    let mut reward_model = object(required(&mut row, "reward_model")?).map_err(|r| bad("reward_model", r))?;
    let ground_truth = match take(&mut reward_model, "ground_truth") {
        None => return Err(bad("reward_model.ground_truth", "missing")),
        Some(Value::Object(mut g)) => {
            let field = "reward_model.ground_truth.target";
            answers(take(&mut g, "target").ok_or_else(|| bad(field, "missing"))?, field)?
        }
        Some(other) => answers(other, "reward_model.ground_truth")?,
    };
    let index = match take(&mut row, "extra_info") {
        None => None,
        Some(extra) => match object(extra).map_err(|r| bad("extra_info", r))?.get("index") {
            None | Some(Value::Null) => None,
            Some(index) => Some(scalar_id(index, "extra_info.index")?),
        },
    };
    Ok(Parsed {
        key: index.map(|index| format!("{data_source}/{index}")),
        messages: Some(messages),
        prompt: None,
        ground_truth,
        data_source,
        tools: tools(&mut row)?,
    })
}

/// ASearcher or TIR row: `messages` or `question` or `problem`; `answer` or `answers`; optional
/// id (`query_id`, `id` or `qid`, the first present, as ASearcher's workflow reads it) and source
/// (`data_source`, or ASearcher's `source`; default: the format's name).
fn qa(mut row: Map<String, Value>, default_source: &str) -> Result<Parsed, RowError> {
    let (messages, prompt) = match take(&mut row, "messages") {
        Some(m) => (Some(messages(m, "messages")?), None),
        None if has(&row, "question") => (None, Some(string(&mut row, "question")?)),
        None if has(&row, "problem") => (None, Some(string(&mut row, "problem")?)),
        None => return Err(bad("question", "missing (a row needs `question`, `problem` or `messages`)")),
    };
    let ground_truth = match (take(&mut row, "answer"), take(&mut row, "answers")) {
        (Some(a), _) => answers(a, "answer")?,
        (None, Some(a)) => answers(a, "answers")?,
        (None, None) => return Err(bad("answer", "missing (a row needs `answer` or `answers`)")),
    };
    let data_source = match ["data_source", "source"].into_iter().find(|key| has(&row, key)) {
        Some(key) => string(&mut row, key)?,
        None => default_source.to_owned(),
    };
    let key = match ID_KEYS.iter().find(|key| has(&row, key)) {
        Some(key) => Some(scalar_id(&take(&mut row, key).unwrap_or_default(), key)?),
        None => None,
    };
    let tools = tools(&mut row)?;
    Ok(Parsed { key, messages, prompt, ground_truth, data_source, tools })
}

/// The `tools` column: a list of OpenAI function schemas (`{"type": "function", "function":
/// {"name", …}}` or bare `{"name", …}`), or the JSON text of one as many datasets store it.
fn tools(row: &mut Map<String, Value>) -> Result<Option<Vec<Value>>, RowError> {
    let value = match take(row, "tools") {
        None => return Ok(None),
        Some(Value::String(text)) => serde_json::from_str(&text)
            .map_err(|e| bad("tools", format!("not a JSON list of functions: {e}")))?,
        Some(value) => value,
    };
    let Value::Array(items) = value else {
        return Err(bad("tools", format!("expected a list of function schemas, got {}", kind(&value))));
    };
    for (i, item) in items.iter().enumerate() {
        let name = kart_core::agent::function_calls::function_of(item).get("name").and_then(Value::as_str);
        if name.is_none_or(str::is_empty) {
            return Err(bad(format!("tools[{i}].function.name"), "missing (a function schema needs a name)"));
        }
    }
    Ok(Some(items))
}

/// Whether `row` has a non-null `key`.
fn has(row: &Map<String, Value>, key: &str) -> bool {
    row.get(key).is_some_and(|v| !v.is_null())
}

/// Removes `key` from `row`, `None` when absent or null.
fn take(row: &mut Map<String, Value>, key: &str) -> Option<Value> {
    row.remove(key).filter(|v| !v.is_null())
}

fn required(row: &mut Map<String, Value>, key: &str) -> Result<Value, RowError> {
    take(row, key).ok_or_else(|| bad(key, "missing"))
}

/// The string `key` of `row` (also its field name).
fn string(row: &mut Map<String, Value>, key: &str) -> Result<String, RowError> {
    as_string(required(row, key)?).map_err(|r| bad(key, r))
}

fn as_string(value: Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(format!("expected a string, got {}", kind(&other))),
    }
}

fn object(value: Value) -> Result<Map<String, Value>, String> {
    match value {
        Value::Object(m) => Ok(m),
        other => Err(format!("expected an object, got {}", kind(&other))),
    }
}

/// A non-empty list of `{role, content}` objects.
pub(super) fn messages(value: Value, field: &str) -> Result<Vec<ChatMessage>, RowError> {
    let Value::Array(items) = value else {
        return Err(bad(field, format!("expected a list of {{role, content}}, got {}", kind(&value))));
    };
    if items.is_empty() {
        return Err(bad(field, "empty"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let at = |part: &str, reason: String| bad(format!("{field}[{i}]{part}"), reason);
            let mut m = object(item).map_err(|r| at("", r))?;
            let mut get = |key: &str| {
                take(&mut m, key)
                    .ok_or_else(|| "missing".to_owned())
                    .and_then(as_string)
                    .map_err(|r| at(&format!(".{key}"), r))
            };
            Ok(ChatMessage::new(get("role")?, get("content")?))
        })
        .collect()
}

/// Golden answers: a string or number, or a non-empty list of them.
fn answers(value: Value, field: &str) -> Result<Vec<String>, RowError> {
    fn one(value: Value) -> Result<String, String> {
        match value {
            Value::String(s) => Ok(s),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(format!("expected a string or a number, got {}", kind(&other))),
        }
    }
    match value {
        Value::Array(items) if items.is_empty() => Err(bad(field, "empty")),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| one(v).map_err(|r| bad(format!("{field}[{i}]"), r)))
            .collect(),
        v => one(v).map_err(|r| bad(field, r)).map(|a| vec![a]),
    }
}

/// An id or index: a string or an integer.
fn scalar_id(value: &Value, field: &str) -> Result<String, RowError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        other => Err(bad(field, format!("expected a string or an integer, got {}", kind(other)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn search_r1_rows_accept_list_or_string_targets() {
        let row = json!({
            "data_source": "nq", "ability": "fact-reasoning",
            "prompt": [{"content": "Q?", "role": "user"}],
            "reward_model": {"ground_truth": {"target": ["a", "b"]}, "style": "rule"},
            "extra_info": {"index": 7, "split": "train"},
            "golden_answers": ["a", "b"],
        });
        let p = RowFormat::SearchR1.parse(row.clone()).unwrap();
        assert_eq!(p.key.as_deref(), Some("nq/7"));
        assert_eq!(p.messages.unwrap(), [ChatMessage::new("user", "Q?")]);
        assert_eq!(p.ground_truth, ["a", "b"]);
        let mut row = row;
        row["reward_model"]["ground_truth"]["target"] = json!("c");
        row["extra_info"] = Value::Null;
        let p = RowFormat::SearchR1.parse(row.clone()).unwrap();
        assert_eq!((p.key, p.ground_truth), (None, vec!["c".to_owned()]));
    }

    #[test]
    fn wrong_or_missing_fields_are_named() {
        let err = |row: Value, format| RowFormat::parse(format, row).unwrap_err();
        let ok = json!({"data_source": "nq", "prompt": [{"role": "user", "content": "Q"}],
                        "reward_model": {"ground_truth": {"target": ["a"]}}});
        let mut row = ok.clone();
        row["prompt"][0]["content"] = json!(3);
        assert_eq!(
            err(row, RowFormat::SearchR1),
            bad("prompt[0].content", "expected a string, got a number")
        );
        let mut row = ok.clone();
        row["reward_model"]["ground_truth"]["target"] = json!([]);
        assert_eq!(err(row, RowFormat::SearchR1), bad("reward_model.ground_truth.target", "empty"));
        let mut row = ok.clone();
        row.as_object_mut().unwrap().remove("data_source");
        assert_eq!(err(row, RowFormat::SearchR1), bad("data_source", "missing"));
        let mut row = ok;
        row["extra_info"] = json!({"index": 1.5});
        assert_eq!(err(row, RowFormat::SearchR1).field, "extra_info.index");
        assert_eq!(err(json!({"question": "Q"}), RowFormat::Asearcher).field, "answer");
        assert_eq!(err(json!({"answer": "A"}), RowFormat::Tir).field, "question");
        assert_eq!(err(json!({"question": "Q", "answer": [null]}), RowFormat::Tir).field, "answer[0]");
        assert_eq!(err(json!([1]), RowFormat::Tir).field, "(row)");
    }

    #[test]
    fn qa_rows_take_question_or_messages_and_any_answer_form() {
        let p =
            RowFormat::Asearcher.parse(json!({"id": 12, "question": "Q", "answers": ["x", "y"]})).unwrap();
        assert_eq!(
            (p.key.as_deref(), p.prompt.as_deref(), &p.ground_truth[..]),
            (Some("12"), Some("Q"), &["x".to_owned(), "y".to_owned()][..])
        );
        assert_eq!(p.data_source, "asearcher");
        let p = RowFormat::Tir.parse(json!({"problem": "1+1", "answer": 2, "data_source": "math"})).unwrap();
        assert_eq!(
            (p.prompt.as_deref(), &p.ground_truth[..], &p.data_source[..]),
            (Some("1+1"), &["2".to_owned()][..], "math")
        );
        let p = RowFormat::Tir
            .parse(json!({"messages": [{"role": "user", "content": "2*3"}], "answer": "6"}))
            .unwrap();
        assert_eq!((p.messages.unwrap().len(), p.prompt, p.key), (1, None, None));
    }

    #[test]
    fn asearcher_rows_name_their_id_and_source_as_asearcher_does() {
        // ASearcher-Base-35k's keys: `qid` and `source`, an answer list and an `aug_answer`.
        let row =
            json!({"question": "Q", "answer": ["x"], "source": "hotpotqa", "aug_answer": ["y"], "qid": 7});
        let p = RowFormat::Asearcher.parse(row).unwrap();
        assert_eq!((p.key.as_deref(), &p.data_source[..]), (Some("7"), "hotpotqa"));
        // The workflow's order: `query_id`, then `id`, then `qid`; `data_source` before `source`.
        let row = json!({"qid": "c", "id": "b", "query_id": "a", "question": "Q", "answer": "x",
                         "source": "s", "data_source": "d"});
        let p = RowFormat::Asearcher.parse(row).unwrap();
        assert_eq!((p.key.as_deref(), &p.data_source[..]), (Some("a"), "d"));
        let bad =
            RowFormat::Asearcher.parse(json!({"qid": 1.5, "question": "Q", "answer": "x"})).unwrap_err();
        assert_eq!(bad.field, "qid");
    }

    #[test]
    fn formats_are_told_apart_by_their_keys() {
        let keys = |ks: &'static [&'static str]| move |k: &str| ks.contains(&k);
        assert_eq!(RowFormat::detect(keys(&["prompt", "reward_model"])), RowFormat::SearchR1);
        assert_eq!(RowFormat::detect(keys(&["messages", "answer"])), RowFormat::Tir);
        assert_eq!(RowFormat::detect(keys(&["question", "answer"])), RowFormat::Asearcher);
    }
}
