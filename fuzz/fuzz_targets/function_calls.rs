//! Function calls read from any model turn, in both formats, and checked against a schema: no
//! panic; every call's arguments are a JSON object; the text kept outside the calls is part of
//! the turn; a malformed call says why.
#![no_main]

use kart_core::agent::function_calls::{CallFormat, check, parse};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|turn: &str| {
    let schemas = [json!({"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "topk": {"type": "integer"}},
        "required": ["query"]}}})];
    for format in [CallFormat::Hermes, CallFormat::Llama3Json] {
        let parsed = parse(format, turn);
        assert!(turn.contains(&parsed.content), "{format:?}: content {:?} not in the turn", parsed.content);
        for call in &parsed.calls {
            match call {
                Ok(call) => {
                    assert!(call.function.arguments.is_object());
                    if let Err(bad) = check(call, &schemas) {
                        assert!(bad.message().starts_with("Error: ") && bad.reason.len() > 0);
                    }
                }
                Err(bad) => assert!(bad.message().starts_with("Error: ") && !bad.reason.is_empty()),
            }
        }
    }
});
