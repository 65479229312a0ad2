//! The tool-calling ChatML template of the fixtures (`../shared/fixtures/chat-templates`) rendered
//! with any messages and tool schemas: rendering succeeds, shows every non-system message, and ends
//! with the assistant's header when asked to.
#![no_main]

use arbitrary::Arbitrary;
use kart_core::chat::ChatMessage;
use kart_tokenizer::ChatTemplate;
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::sync::LazyLock;

/// A conversation to render.
#[derive(Debug, Arbitrary)]
struct Conversation {
    messages: Vec<Message>,
    /// Names and descriptions of function tools.
    tools: Vec<(String, String)>,
    add_generation_prompt: bool,
}

/// One message, of a known role or any other.
#[derive(Debug, Arbitrary)]
struct Message {
    role: Role,
    content: String,
}

/// The roles the template treats apart, and any other.
#[derive(Debug, Arbitrary)]
enum Role {
    System,
    User,
    Assistant,
    Tool,
    Other(String),
}

/// The fixture template, loaded from a model folder made for it and removed once compiled.
static TEMPLATE: LazyLock<ChatTemplate> = LazyLock::new(|| {
    let source =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/chat-templates/tools-chatml.jinja");
    let dir = std::env::temp_dir().join(format!("kart-fuzz-chat-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    std::fs::copy(source, dir.join("chat_template.jinja")).expect("the fixture template");
    let template = ChatTemplate::load(&dir).expect("the template compiles").expect("a template");
    std::fs::remove_dir_all(&dir).expect("the temporary folder is removed");
    template
});

fuzz_target!(|conversation: Conversation| {
    let messages: Vec<ChatMessage> = conversation
        .messages
        .into_iter()
        .map(|Message { role, content }| {
            let role = match role {
                Role::System => "system".to_owned(),
                Role::User => "user".to_owned(),
                Role::Assistant => "assistant".to_owned(),
                Role::Tool => "tool".to_owned(),
                Role::Other(role) => role,
            };
            ChatMessage::new(role, content)
        })
        .collect();
    let tools: Vec<_> = conversation
        .tools
        .iter()
        .map(|(name, description)| {
            json!({"type": "function", "function": {"name": name, "description": description, "parameters": {}}})
        })
        .collect();
    let add_generation_prompt = conversation.add_generation_prompt;
    let rendered =
        TEMPLATE.render(&messages, add_generation_prompt, json!({"tools": tools})).expect("renders");
    for message in messages.iter().filter(|m| m.role != "system") {
        assert!(rendered.contains(&message.content), "{message:?} is missing from {rendered:?}");
    }
    assert!(!add_generation_prompt || rendered.ends_with("<|im_start|>assistant\n"));
});
