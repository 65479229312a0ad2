//! The chat-template vectors: conversations with function calls rendered by transformers'
//! `apply_chat_template(messages, tools=tools, chat_template=..., add_generation_prompt=...)`,
//! which kart's renderer must reproduce byte for byte. A case names its template file
//! (`template`), found beside the vector file.

use super::compare::{str_field, string_difference, typed_field};
use super::{Mismatch, Schema};
use kart_core::chat::ChatMessage;
use kart_tokenizer::ChatTemplate;
use serde_json::{Value, json};
use std::path::Path;

/// Cases with a `template`, `messages` and the `rendered` text.
pub struct ChatTemplateRendering;

impl Schema for ChatTemplateRendering {
    fn name(&self) -> &'static str {
        "chat-template/render"
    }

    fn recognises(&self, case: &Value) -> bool {
        ["template", "messages", "rendered"].iter().all(|key| case.get(key).is_some())
    }

    fn check(&self, case: &Value, dir: &Path) -> Result<(), Mismatch> {
        let file = dir.join(str_field(case, "template")?);
        let template = ChatTemplate::from_file(&file).map_err(|e| Mismatch(e.to_string()))?;
        let messages: Vec<ChatMessage> = typed_field(case, "messages")?;
        let tools = case.get("tools").cloned().unwrap_or(Value::Null);
        let generation_prompt = case.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(false);
        let rendered = template
            .render(&messages, generation_prompt, json!({"tools": tools}))
            .map_err(|e| Mismatch(format!("rendering failed: {e}")))?;
        let expect = str_field(case, "rendered")?;
        if rendered == expect {
            return Ok(());
        }
        Err(Mismatch(format!("rendered: {}", string_difference(expect, &rendered))))
    }
}
