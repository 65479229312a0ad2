//! Function calls in a model's text, in the format its chat template teaches
//! ([`CallFormat`]), parsed as vLLM's and SGLang's tool parsers read them; and the checks a call
//! must pass against the function schemas it was offered (OpenAI's function format).
//!
//! A call that cannot be read or does not fit its schema is kept as a [`Malformed`] call: the
//! environment answers it with [`Malformed::message`] as the tool's response, so the model sees
//! what went wrong, and counts it as a failed call.

use crate::chat::ToolCall;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::LazyLock;

/// How a model writes function calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallFormat {
    /// Qwen2.5, Qwen3 and Hermes: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block
    /// per call, after optional text (vLLM's `hermes` parser).
    #[default]
    Hermes,
    /// Llama 3.1 and 3.2: the whole message is a JSON object `{"name": …, "parameters": {…}}`, or
    /// several separated by `;`, optionally after `<|python_tag|>` (vLLM's `llama3_json` parser).
    Llama3Json,
}

/// An assistant turn read as text and calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedTurn {
    /// The text outside the calls, trimmed.
    pub content: String,
    /// The calls in the order written; malformed ones where they were.
    pub calls: Vec<Result<ToolCall, Malformed>>,
}

/// A call that could not be read, or does not fit the function it names.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct Malformed {
    /// The function named, when the call got that far.
    pub name: Option<String>,
    pub reason: String,
}

impl Malformed {
    fn new(name: Option<&str>, reason: impl Into<String>) -> Self {
        Malformed { name: name.map(str::to_owned), reason: reason.into() }
    }

    /// What the model is told in the call's tool response.
    pub fn message(&self) -> String {
        format!("Error: {}", self.reason)
    }
}

static HERMES: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"(?s)<tool_call>(.*?)</tool_call>|<tool_call>(.*)").expect("valid regex")
});

/// Reads the calls of `text`, a generated assistant turn without its end-of-turn token.
pub fn parse(format: CallFormat, text: &str) -> ParsedTurn {
    match format {
        CallFormat::Hermes => parse_hermes(text),
        CallFormat::Llama3Json => parse_llama3(text),
    }
}

fn parse_hermes(text: &str) -> ParsedTurn {
    let Some(first) = text.find("<tool_call>") else {
        return ParsedTurn { content: text.trim().to_owned(), calls: Vec::new() };
    };
    let calls = HERMES
        .captures_iter(&text[first..])
        .map(|c| {
            let body = c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str());
            if c.get(2).is_some() {
                return Err(Malformed::new(None, "a <tool_call> block is not closed with </tool_call>"));
            }
            read_call(body.trim(), "arguments")
        })
        .collect();
    ParsedTurn { content: text[..first].trim().to_owned(), calls }
}

fn parse_llama3(text: &str) -> ParsedTurn {
    let body = text.trim_start();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    if !body.starts_with('{') {
        return ParsedTurn { content: text.trim().to_owned(), calls: Vec::new() };
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => calls.push(call_of(value, "parameters")),
            Some(Err(e)) => {
                calls.push(Err(Malformed::new(None, format!("the call is not valid JSON ({e})"))));
                break;
            }
            None => break,
        }
        let after = rest[stream.byte_offset()..].trim_start();
        rest = match after.strip_prefix(';') {
            Some(more) => more.trim_start(),
            None if after.is_empty() => after,
            None => {
                calls.push(Err(Malformed::new(
                    None,
                    format!("unexpected text after a call: {:?}", clip(after)),
                )));
                break;
            }
        };
    }
    ParsedTurn { content: String::new(), calls }
}

/// A call written as JSON text: `{"name": …, "<arguments key>": {…}}`.
fn read_call(body: &str, arguments_key: &str) -> Result<ToolCall, Malformed> {
    match serde_json::from_str::<Value>(body) {
        Ok(value) => call_of(value, arguments_key),
        Err(e) => {
            Err(Malformed::new(None, format!("the tool call is not valid JSON ({e}): {:?}", clip(body))))
        }
    }
}

/// A call from its JSON: an object with a string `name` and an object of arguments under
/// `arguments_key` (either key is accepted; missing arguments are none).
fn call_of(value: Value, arguments_key: &str) -> Result<ToolCall, Malformed> {
    let Value::Object(mut call) = value else {
        return Err(Malformed::new(
            None,
            "a tool call must be a JSON object with \"name\" and \"arguments\"",
        ));
    };
    let name = match call.remove("name") {
        Some(Value::String(name)) if !name.is_empty() => name,
        _ => return Err(Malformed::new(None, "a tool call needs a \"name\" string")),
    };
    let arguments = call
        .remove(arguments_key)
        .or_else(|| call.remove("arguments"))
        .or_else(|| call.remove("parameters"))
        .unwrap_or_else(|| Value::Object(Map::new()));
    // Some models write the arguments as a JSON string, as OpenAI's API carries them.
    let arguments = match arguments {
        Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        other => other,
    };
    if !arguments.is_object() {
        return Err(Malformed::new(Some(&name), format!("the arguments of `{name}` must be a JSON object")));
    }
    Ok(ToolCall::function(name, arguments))
}

/// Checks `call` against the offered `functions` (OpenAI function schemas, `{"type":
/// "function", "function": {"name", "parameters"}}` or the bare function object): the function
/// exists, its required arguments are there, and arguments of a declared primitive type have it.
pub fn check(call: &ToolCall, functions: &[Value]) -> Result<(), Malformed> {
    let name = call.function.name.as_str();
    let Some(function) =
        functions.iter().map(function_of).find(|f| f.get("name").and_then(Value::as_str) == Some(name))
    else {
        let known: Vec<&str> =
            functions.iter().filter_map(|f| function_of(f).get("name").and_then(Value::as_str)).collect();
        return Err(Malformed::new(
            Some(name),
            format!("no function named `{name}`; the functions are: {}", known.join(", ")),
        ));
    };
    let arguments = call.function.arguments.as_object().cloned().unwrap_or_default();
    let parameters = function.get("parameters").cloned().unwrap_or(Value::Null);
    for required in parameters.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(key) = required.as_str()
            && !arguments.contains_key(key)
        {
            return Err(Malformed::new(Some(name), format!("`{name}` needs the argument `{key}`")));
        }
    }
    let properties = parameters.get("properties").and_then(Value::as_object);
    for (key, value) in &arguments {
        let declared =
            properties.and_then(|p| p.get(key)).and_then(|p| p.get("type")).and_then(Value::as_str);
        let fits = match declared {
            Some("string") => value.is_string(),
            Some("integer") => value.is_i64() || value.is_u64(),
            Some("number") => value.is_number(),
            Some("boolean") => value.is_boolean(),
            Some("array") => value.is_array(),
            Some("object") => value.is_object(),
            _ => true,
        };
        if !fits {
            return Err(Malformed::new(
                Some(name),
                format!(
                    "argument `{key}` of `{name}` must be of type {}, got {value}",
                    declared.unwrap_or("?")
                ),
            ));
        }
    }
    Ok(())
}

/// The function object of a tool schema (`{"type": "function", "function": {…}}` or bare).
pub fn function_of(tool: &Value) -> &Value {
    tool.get("function").unwrap_or(tool)
}

fn clip(text: &str) -> &str {
    match text.char_indices().nth(80) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(calls: &[Result<ToolCall, Malformed>]) -> Vec<ToolCall> {
        calls.iter().map(|c| c.clone().expect("a well-formed call")).collect()
    }

    #[test]
    fn hermes_blocks_are_read_in_order_after_the_text() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": \\\"1+1\\\"}\"}\n</tool_call>";
        let turn = parse(CallFormat::Hermes, text);
        assert_eq!(turn.content, "Let me look.");
        assert_eq!(
            ok(&turn.calls),
            [
                ToolCall::function("search", json!({"query": "Paris"})),
                ToolCall::function("calculator", json!({"expression": "1+1"}))
            ]
        );
        let plain = parse(CallFormat::Hermes, " <answer>Paris</answer> ");
        assert_eq!((plain.content.as_str(), plain.calls.len()), ("<answer>Paris</answer>", 0));
    }

    #[test]
    fn broken_hermes_calls_say_what_is_wrong() {
        let reasons = |text: &str| -> Vec<String> {
            parse(CallFormat::Hermes, text).calls.into_iter().map(|c| c.unwrap_err().message()).collect()
        };
        assert!(
            reasons("<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": }}</tool_call>")[0]
                .starts_with("Error: the tool call is not valid JSON")
        );
        assert_eq!(
            reasons("<tool_call>{\"arguments\": {}}</tool_call>"),
            ["Error: a tool call needs a \"name\" string"]
        );
        assert_eq!(
            reasons("<tool_call>[1]</tool_call>")[0],
            "Error: a tool call must be a JSON object with \"name\" and \"arguments\""
        );
        assert_eq!(
            reasons("<tool_call>{\"name\": \"s\", \"arguments\": 3}</tool_call>"),
            ["Error: the arguments of `s` must be a JSON object"]
        );
        assert_eq!(
            reasons("<tool_call>{\"name\": \"search\", \"arguments\": {}}"),
            ["Error: a <tool_call> block is not closed with </tool_call>"]
        );
    }

    #[test]
    fn llama3_json_calls_are_the_whole_message() {
        let turn = parse(
            CallFormat::Llama3Json,
            "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}; {\"name\": \"calculator\", \"parameters\": {\"expression\": \"2*3\"}}",
        );
        assert_eq!(
            ok(&turn.calls),
            [
                ToolCall::function("search", json!({"query": "x"})),
                ToolCall::function("calculator", json!({"expression": "2*3"}))
            ]
        );
        let answer = parse(CallFormat::Llama3Json, "The answer is Paris.");
        assert_eq!((answer.content.as_str(), answer.calls.len()), ("The answer is Paris.", 0));
        let broken = parse(
            CallFormat::Llama3Json,
            "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}} and more",
        );
        assert!(broken.calls[0].is_ok());
        assert!(broken.calls[1].as_ref().unwrap_err().reason.starts_with("unexpected text after a call"));
    }

    #[test]
    fn calls_are_checked_against_their_schemas() {
        let tools = [
            json!({"type": "function", "function": {"name": "search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}, "topk": {"type": "integer"}},
            "required": ["query"]}}}),
            json!({"name": "calculator"}),
        ];
        assert_eq!(check(&ToolCall::function("search", json!({"query": "x", "topk": 3})), &tools), Ok(()));
        assert_eq!(check(&ToolCall::function("calculator", json!({"anything": 1})), &tools), Ok(()));
        let err = |call: ToolCall| check(&call, &tools).unwrap_err().reason;
        assert_eq!(
            err(ToolCall::function("find", json!({}))),
            "no function named `find`; the functions are: search, calculator"
        );
        assert_eq!(
            err(ToolCall::function("search", json!({"topk": 3}))),
            "`search` needs the argument `query`"
        );
        assert_eq!(
            err(ToolCall::function("search", json!({"query": "x", "topk": "3"}))),
            "argument `topk` of `search` must be of type integer, got \"3\""
        );
    }
}
