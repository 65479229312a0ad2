//! Model folders with transformers' oracle outputs (`expected.json` + `expected.safetensors`, as in
//! `shared/fixtures/models/`): tokenisation, logits, teacher-forced greedy log-probabilities and the
//! chat template, each within the fixtures' parity criteria.

use super::compare::{Mismatch, compare};
use super::{ConformanceError, Failure, Report};
use kart_core::chat::ChatMessage;
use kart_model::CausalLm;
use kart_model::logprobs::{DEFAULT_CHUNK, token_logprobs};
use kart_tokenizer::{ChatTemplate, Tokenizer};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Parity criterion of the fixtures: logits and greedy logprobs within 1e-3 absolute.
const TOLERANCE: f64 = 1e-3;

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
    chat_template_example: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    input_ids: Vec<u32>,
    greedy_continuation: Vec<u32>,
}

/// Checks one model folder on the CPU in f32, as the oracle was computed.
pub fn check_model_dir(dir: &Path) -> Result<Report, ConformanceError> {
    let model_error =
        |e: &dyn std::fmt::Display| ConformanceError::Model { path: dir.into(), reason: e.to_string() };
    let expected_path = dir.join("expected.json");
    let text = std::fs::read_to_string(&expected_path)
        .map_err(|source| ConformanceError::Io { path: expected_path.clone(), source })?;
    let expected: Expected = serde_json::from_str(&text).map_err(|source| ConformanceError::Json {
        path: expected_path.clone(),
        line: 1,
        source,
    })?;
    let oracle: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join("expected.safetensors"))
        .map_err(|e| model_error(&e))?
        .into_iter()
        .collect();
    let model = CausalLm::load(dir, Device::Cpu).map_err(|e| model_error(&e))?;
    let tokenizer = Tokenizer::load(dir).map_err(|e| model_error(&e))?;

    let mut report = Report::default();
    let mut record = |case: usize, schema: &'static str, result: Result<(), Mismatch>| match result {
        Ok(()) => report.passed += 1,
        Err(mismatch) => {
            report.failures.push(Failure { path: expected_path.clone(), line: case, schema, mismatch })
        }
    };
    for (i, case) in expected.cases.iter().enumerate() {
        let n = i + 1;
        record(n, "model/tokenizer", check_tokenizer(&tokenizer, case));
        record(n, "model/logits", check_logits(&model, case, oracle.get(&format!("logits_{i}"))));
        record(
            n,
            "model/greedy-logprobs",
            check_greedy(&model, case, oracle.get(&format!("greedy_logprobs_{i}"))),
        );
    }
    if let Some(example) = &expected.chat_template_example {
        record(0, "model/chat-template", check_chat_template(dir, example));
    }
    Ok(report)
}

fn check_tokenizer(tokenizer: &Tokenizer, case: &Case) -> Result<(), Mismatch> {
    let ids = tokenizer.encode(&case.prompt, false).map_err(|e| Mismatch(e.to_string()))?;
    compare("input_ids", &json!(case.input_ids), &json!(ids), 0.0)
}

fn check_logits(model: &CausalLm, case: &Case, oracle: Option<&Tensor>) -> Result<(), Mismatch> {
    let oracle = oracle.ok_or_else(|| Mismatch("expected.safetensors has no logits for this case".into()))?;
    let ids = ids_tensor(&case.input_ids);
    let logits = tch::no_grad(|| model.lm_head(&model.forward(&ids, &positions(ids.size()[1]), None, None)));
    max_difference("logits", &logits.squeeze_dim(0), oracle)
}

fn check_greedy(model: &CausalLm, case: &Case, oracle: Option<&Tensor>) -> Result<(), Mismatch> {
    let oracle =
        oracle.ok_or_else(|| Mismatch("expected.safetensors has no greedy_logprobs for this case".into()))?;
    let all: Vec<u32> = case.input_ids.iter().chain(&case.greedy_continuation).copied().collect();
    let ids = ids_tensor(&all);
    let (p, g) = (case.input_ids.len() as i64, case.greedy_continuation.len() as i64);
    let logprobs = tch::no_grad(|| {
        let hidden = model.forward(&ids, &positions(ids.size()[1]), None, None);
        // The hidden state at position t predicts token t + 1.
        let predicting = hidden.narrow(1, p - 1, g);
        let targets = ids.narrow(1, p, g);
        token_logprobs(model, &predicting, &targets, 1.0, false, DEFAULT_CHUNK).logprobs
    });
    max_difference("greedy_logprobs", &logprobs.squeeze_dim(0), oracle)
}

fn check_chat_template(dir: &Path, example: &str) -> Result<(), Mismatch> {
    let template = ChatTemplate::load(dir)
        .map_err(|e| Mismatch(e.to_string()))?
        .ok_or_else(|| Mismatch("the folder has no chat template".into()))?;
    let hi = [ChatMessage::new("user", "hi")];
    let rendered = template.render(&hi, true, json!({})).map_err(|e| Mismatch(e.to_string()))?;
    compare("chat_template_example", &json!(example), &json!(rendered), 0.0)
}

fn ids_tensor(ids: &[u32]) -> Tensor {
    Tensor::from_slice(&ids.iter().map(|&t| t as i64).collect::<Vec<_>>()).view([1, -1])
}

fn positions(len: i64) -> Tensor {
    Tensor::arange(len, (Kind::Int64, Device::Cpu)).view([1, len])
}

fn max_difference(name: &str, actual: &Tensor, expected: &Tensor) -> Result<(), Mismatch> {
    if actual.size() != expected.size() {
        return Err(Mismatch(format!(
            "{name}: expected shape {:?}, got {:?}",
            expected.size(),
            actual.size()
        )));
    }
    let diff = (actual.to_kind(Kind::Double) - expected.to_kind(Kind::Double)).abs();
    let worst = diff.max().double_value(&[]);
    if worst <= TOLERANCE {
        return Ok(());
    }
    let at = diff.view([-1]).argmax(0, false).int64_value(&[]);
    let cols = *expected.size().last().unwrap_or(&1);
    Err(Mismatch(format!(
        "{name}: max |diff| {worst:.3e} > {TOLERANCE:e} at [{}, {}] (expected {}, got {})",
        at / cols,
        at % cols,
        expected.view([-1]).double_value(&[at]),
        actual.view([-1]).double_value(&[at])
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixture_model_matches_transformers() {
        for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
            let report = check_model_dir(&kart_testing::model(name)).unwrap();
            for f in &report.failures {
                eprintln!("{f}");
            }
            assert!(report.failures.is_empty(), "{name}: {}", report.summary());
            assert!(report.passed >= 7, "{name}: every case ran: {}", report.summary());
        }
    }
}
