//! What `kart eval` and `kart infer` run on: a model folder, an engine, an environment and its
//! tools, as flags or from a training config.

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use kart_core::config::env::EnvConfig;
use kart_core::config::rollout::{ContextConfig, EngineConfig};
use kart_core::config::train::TrainConfig;
use kart_core::engine::Engine;
use kart_model::{CausalLm, EmbeddedEngine};
use kart_retriever::InProcess;
use kart_rollout::env::Context;
use kart_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

/// The model, engine, environment and tools.
#[derive(Debug, Args)]
pub struct Setup {
    /// The model folder (tokenizer, chat template, and the weights for the embedded engine).
    #[arg(long)]
    pub model: PathBuf,
    /// A training config whose environment, tools (`rollout.index`, `retriever_url`, …), engine
    /// batch and seed are taken, as its held-out evaluation uses them; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The environment (a `rollout.env` as JSON, e.g. `{"kind": "search-r1", "max_turns": 4}`).
    #[arg(long)]
    env: Option<String>,
    /// The retriever's URL.
    #[arg(long)]
    retriever: Option<String>,
    /// A local index folder searched in this process instead of a retriever.
    #[arg(long)]
    index: Option<PathBuf>,
    /// The inference engine.
    #[arg(long, value_enum, default_value_t = EngineKind::Embedded)]
    engine: EngineKind,
    /// SGLang or vLLM server URLs.
    #[arg(long)]
    engine_url: Vec<String>,
    /// The served model's name (vLLM).
    #[arg(long)]
    served_model: Option<String>,
    /// Sequences the embedded engine decodes together.
    #[arg(long)]
    max_batch: Option<usize>,
    /// The sampling seed.
    #[arg(long)]
    seed: Option<u64>,
}

/// `--engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EngineKind {
    Embedded,
    Sglang,
    Vllm,
}

/// What a [`Setup`] opened.
pub struct Opened {
    pub ctx: Context,
    pub env: EnvConfig,
    pub tokenizer: Tokenizer,
    pub seed: u64,
}

impl Setup {
    /// Opens the model, the engine and the tools (call within a Tokio runtime).
    pub async fn open(&self) -> anyhow::Result<Opened> {
        let config: Option<TrainConfig> = match &self.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
                Some(serde_json::from_str(&text).with_context(|| format!("--config {}", path.display()))?)
            }
            None => None,
        };
        let env: EnvConfig = match (&self.env, &config) {
            (Some(json), _) => serde_json::from_str(json).context("--env")?,
            (None, Some(c)) => c.rollout.env.clone(),
            (None, None) => EnvConfig::default(),
        };
        env.validate().context("--env")?;
        let mut context: ContextConfig =
            config.as_ref().map(|c| c.rollout.context.clone()).unwrap_or_default();
        if let Some(url) = &self.retriever {
            context.retriever_url = Some(url.clone());
        }
        let index = self.index.clone().or_else(|| config.as_ref().and_then(|c| c.rollout.index.clone()));
        let seed = self.seed.or(config.as_ref().map(|c| c.seed)).unwrap_or(0);
        let max_batch = self.max_batch.or(config.as_ref().map(|c| c.rollout.max_batch)).unwrap_or(64);
        let model_error = || format!("--model {}", self.model.display());
        let tokenizer = Tokenizer::load(&self.model).with_context(model_error)?;
        let engine: Arc<dyn Engine> = match self.engine {
            EngineKind::Embedded => {
                let model =
                    CausalLm::load(&self.model, kart_torch::auto("engine")).with_context(model_error)?;
                Arc::new(EmbeddedEngine::spawn(model, tokenizer.clone(), max_batch, 0, seed))
            }
            remote => {
                anyhow::ensure!(!self.engine_url.is_empty(), "--engine-url: needed with --engine {remote:?}");
                let urls = self.engine_url.clone();
                let config = match remote {
                    EngineKind::Sglang => EngineConfig::Sglang { urls, timeout_secs: 600.0 },
                    _ => EngineConfig::Vllm {
                        urls,
                        model: self
                            .served_model
                            .clone()
                            .context("--served-model: needed with --engine vllm")?,
                        timeout_secs: 600.0,
                    },
                };
                kart_rollout::engines::remote(&config).map_err(|e| anyhow::anyhow!("--engine-url: {e}"))?
            }
        };
        let local = index.as_deref().map(InProcess::open).transpose()?;
        let ctx = Context::build(&context, &env, engine, &self.model, local).await?;
        Ok(Opened { ctx, env, tokenizer, seed })
    }
}
