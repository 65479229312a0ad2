//! Engines that answer from a script instead of a model: the process-free counterpart of an
//! inference server, for tests (every protocol path, chosen reply by reply) and for the rollout
//! benchmark (a fixed latency per call, measuring kart's own overhead).

use super::engine::{Engine, EngineError, EngineOutput};
use crate::model::{FinishReason, Generation, GenerationRequest, Tokenizer};
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What a scripted engine answers to one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Generate this text (cut at the request's stop strings and token limit, like a real engine).
    Text(String),
    /// Fail the call.
    Fail(EngineError),
}

type Script = dyn Fn(&str, usize) -> Reply + Send + Sync;

/// An engine whose replies a function chooses from the decoded context and the call number.
pub struct ScriptedEngine {
    tokenizer: Tokenizer,
    script: Box<Script>,
    latency: Duration,
    calls: AtomicUsize,
}

impl ScriptedEngine {
    /// An engine answering `script(context_text, call_index)`; every token gets log-probability
    /// -0.5 and policy version 0.
    pub fn new(tokenizer: Tokenizer, script: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> Self {
        ScriptedEngine {
            tokenizer,
            script: Box::new(script),
            latency: Duration::ZERO,
            calls: AtomicUsize::new(0),
        }
    }

    /// Waits `latency` before answering each call, as a remote engine would.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Calls answered so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn answer(&self, request: &GenerationRequest, text: &str) -> Result<EngineOutput, EngineError> {
        let invalid = |e: crate::model::ModelError| EngineError::Invalid(e.to_string());
        let (mut text, mut finish_reason) = (text.to_string(), FinishReason::Stop);
        if let Some(end) =
            request.stop.iter().filter_map(|s| text.find(s.as_str()).map(|at| at + s.len())).min()
        {
            text.truncate(end);
        }
        let mut token_ids = self.tokenizer.encode(&text, false).map_err(invalid)?;
        if token_ids.len() >= request.max_new_tokens {
            token_ids.truncate(request.max_new_tokens);
            finish_reason = FinishReason::Length;
        }
        let logprobs = vec![-0.5; token_ids.len()];
        Ok(EngineOutput { generation: Generation { token_ids, logprobs, finish_reason }, version: 0 })
    }
}

impl Engine for ScriptedEngine {
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
        Box::pin(async move {
            if !self.latency.is_zero() {
                tokio::time::sleep(self.latency).await;
            }
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let context = self
                .tokenizer
                .decode(&request.input_ids, false)
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            match (self.script)(&context, call) {
                Reply::Text(text) => self.answer(&request, &text),
                Reply::Fail(e) => Err(e),
            }
        })
    }

    fn name(&self) -> &str {
        "scripted"
    }
}
