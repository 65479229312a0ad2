//! Chat messages: what a prompt is made of before a chat template renders it, in OpenAI's chat
//! format (`role`, `content`, an assistant's `tool_calls`), which is what transformers'
//! `apply_chat_template` and Hugging Face datasets' `messages` columns hold.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a conversation (also the element type of Search-R1's `prompt` column).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// The functions an assistant message calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    /// A message from `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: Vec::new() }
    }

    /// An assistant message saying `content` and calling `tool_calls`.
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        ChatMessage { role: "assistant".into(), content: content.into(), tool_calls }
    }
}

/// One function call of an assistant message: `{"type": "function", "function": {"name",
/// "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

impl ToolCall {
    /// A call of function `name` with `arguments` (a JSON object).
    pub fn function(name: impl Into<String>, arguments: Value) -> Self {
        ToolCall { kind: function_type(), function: FunctionCall { name: name.into(), arguments } }
    }
}

/// A function's name and arguments: a JSON object, or the JSON text of one as OpenAI's API
/// sends it (templates render either).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_read_and_write_openai_tool_calls() {
        let wire = json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"x\"}"}},
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}}
        ]});
        let message: ChatMessage = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(message.tool_calls[1], ToolCall::function("calculator", json!({"expression": "1+1"})));
        assert_eq!(serde_json::to_value(&message).unwrap(), wire);
        let plain = serde_json::to_value(ChatMessage::new("user", "hi")).unwrap();
        assert_eq!(plain, json!({"role": "user", "content": "hi"}), "no tool_calls key when none");
    }
}
