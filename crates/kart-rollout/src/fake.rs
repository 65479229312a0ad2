//! Engines that answer from a script instead of a model: the process-free counterpart of an
//! inference server, for tests (every protocol path, chosen reply by reply) and for the rollout
//! benchmark (a fixed latency per call, measuring kart's own overhead); and a fixed search tool
//! for the environments' tests.

use futures::future::BoxFuture;
use kart_core::agent::search_r1::{RetrievalResult, document};
use kart_core::config::lora::LoraConfig;
use kart_core::engine::{Engine, EngineError, EngineOutput, LoadWeights, LoadWeightsError};
use kart_core::generation::{FinishReason, Generation, GenerationRequest};
use kart_core::tool::{Search, Searched, ToolError};
use kart_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
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
    /// The policy version of the last weights loaded.
    version: AtomicI64,
}

impl ScriptedEngine {
    /// An engine answering `script(context_text, call_index)`; every token gets log-probability
    /// -0.5 and the policy version of the last weights loaded (0 before any).
    pub fn new(tokenizer: Tokenizer, script: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> Self {
        ScriptedEngine {
            tokenizer,
            script: Box::new(script),
            latency: Duration::ZERO,
            calls: AtomicUsize::new(0),
            version: AtomicI64::new(0),
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
        let invalid = |e: kart_tokenizer::TokenizerError| EngineError::Invalid(e.to_string());
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
        let version = self.version.load(Ordering::SeqCst);
        Ok(EngineOutput::new(Generation { token_ids, logprobs, finish_reason }, version))
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

/// Takes any safetensors file as the weights of its version: the answers stay scripted, their
/// tokens carry the new version.
impl LoadWeights for ScriptedEngine {
    fn load_weights(
        &self,
        file: PathBuf,
        version: i64,
        _lora: Option<LoraConfig>,
    ) -> BoxFuture<'_, Result<(), LoadWeightsError>> {
        Box::pin(async move {
            let read = |e: &dyn std::fmt::Display| LoadWeightsError::Read(e.to_string());
            let bytes = tokio::fs::read(&file).await.map_err(|e| read(&e))?;
            safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| read(&e))?;
            self.version.store(version, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// A search tool answering every query with one passage about Paris, with document `id`
/// (`"France"\nParis is the capital.`), or failing (`connection refused`) unless `ok`.
pub struct FixedSearch {
    pub id: String,
    pub ok: bool,
}

impl Search for FixedSearch {
    fn search<'a>(&'a self, queries: &'a [String], _topk: usize) -> Searched<'a> {
        let answer = if self.ok {
            let document = document(self.id.clone(), "\"France\"\nParis is the capital.".into());
            Ok(queries
                .iter()
                .map(|_| vec![RetrievalResult { document: document.clone(), score: 2.0 }])
                .collect())
        } else {
            Err(ToolError { tool: "search", reason: "connection refused".into() })
        };
        Box::pin(std::future::ready(answer))
    }
}
