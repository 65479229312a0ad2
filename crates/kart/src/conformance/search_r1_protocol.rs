//! The `search-r1/protocol` vectors: Search-R1's prompt, turn postprocessing, action parsing,
//! passage formatting, observations and answer normalisation.

use super::compare::{compare, field, str_field, typed_field};
use super::{Mismatch, Schema};
use kart_core::agent::search_r1::{
    RetrievalResult, execute, make_prefix, parse_action, passages_to_string, postprocess,
};
use kart_core::reward::normalize::normalize_answer;
use serde_json::{Value, json};
use std::path::Path;

/// The case kinds of the protocol vectors.
const KINDS: [&str; 6] = ["postprocess", "parse_action", "passages", "observation", "prompt", "normalize"];

/// Cases with a `kind` field naming one of the protocol functions.
pub struct SearchR1Protocol;

impl Schema for SearchR1Protocol {
    fn name(&self) -> &'static str {
        "search-r1/protocol"
    }

    fn recognises(&self, case: &Value) -> bool {
        case.get("kind").and_then(Value::as_str).is_some_and(|kind| KINDS.contains(&kind))
    }

    fn check(&self, case: &Value, _dir: &Path) -> Result<(), Mismatch> {
        let actual = match str_field(case, "kind")? {
            "postprocess" => json!(postprocess(str_field(case, "input")?)),
            "parse_action" => {
                let action = parse_action(str_field(case, "input")?);
                json!({
                    "action": action.as_ref().map(|a| a.name()),
                    "content": action.as_ref().map_or("", |a| a.content()),
                })
            }
            "passages" => json!(passages_to_string(&typed_field::<Vec<RetrievalResult>>(case, "input")?)),
            "observation" => {
                let action = parse_action(str_field(case, "action_text")?);
                let results = passages_to_string(&typed_field::<Vec<RetrievalResult>>(case, "retrieval")?);
                let step = execute(action.as_ref(), &results);
                json!({
                    "observation": step.observation,
                    "done": step.done,
                    "valid_action": step.valid_action,
                    "is_search": step.is_search,
                })
            }
            "prompt" => {
                json!(make_prefix(str_field(case, "question")?).map_err(|e| Mismatch(e.to_string()))?)
            }
            "normalize" => json!(normalize_answer(str_field(case, "input")?)),
            other => return Err(Mismatch(format!("unknown kind {other:?}"))),
        };
        compare("expect", field(case, "expect")?, &actual, 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use crate::conformance::check_file;

    #[test]
    fn all_upstream_protocol_vectors_pass() {
        let path = kart_testing::conformance("search-r1/protocol.jsonl");
        let report = check_file(&path).unwrap();
        let first: Vec<String> = report.failures.iter().take(5).map(ToString::to_string).collect();
        assert!(report.failures.is_empty(), "{}\n{}", report.summary(), first.join("\n"));
        assert_eq!(report.passed, 1800);
    }
}
