//! What environments run against ([`Context`]): the engine, the model's tokenizer and chat
//! template, and the tools, built in one place from a [`ContextConfig`] for a rollout worker, the
//! trainer's in-process pool and the rollout benchmark alike.

use super::RolloutError;
use kart_core::chat::ChatMessage;
use kart_core::config::ConfigError;
use kart_core::config::env::EnvConfig;
use kart_core::config::retry::RetryPolicy;
use kart_core::config::rollout::ContextConfig;
use kart_core::engine::Engine;
use kart_core::tool::{Access, Search};
use kart_tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use kart_tools::python::{PythonSandbox, SandboxError};
use kart_tools::search::{CachedSearch, HttpRetriever};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// What environments run against: the engine, the tokenizer and chat template, and the tools.
#[derive(Clone)]
pub struct Context {
    pub engine: Arc<dyn Engine>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub search: Option<Arc<dyn Search>>,
    pub access: Option<Arc<dyn Access>>,
    /// The Python executor of tool-integrated reasoning.
    pub python: Option<Arc<PythonSandbox>>,
    pub retry: RetryPolicy,
}

impl Context {
    /// The prompt's text: the chat template applied with the generation prompt; without a
    /// template, the contents concatenated.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, RolloutError> {
        Ok(match &self.chat_template {
            Some(template) => template.render(messages, true, serde_json::Value::Null)?,
            None => messages.iter().map(|m| m.content.as_str()).collect(),
        })
    }

    /// The prompt's token ids: [`render`](Self::render)'s text tokenised once, without special
    /// tokens added (the template writes them).
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, RolloutError> {
        Ok(self.tokenizer.encode(&self.render(messages)?, false)?)
    }

    /// Whether a generation ended the sequence: its last token is an end-of-sequence or padding
    /// token, or it has no token at all.
    pub fn ends_sequence(&self, generated: &[u32]) -> bool {
        generated.last().is_none_or(|&id| {
            self.tokenizer.stop_token_ids().contains(&id) || self.tokenizer.pad_token_id() == Some(id)
        })
    }
}

/// Why a context could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("python: {0}")]
    Sandbox(#[from] SandboxError),
}

impl Context {
    /// The context of `engine` with the tokenizer and chat template of the model folder `model`
    /// and the tools of `config`: searches go to `local` when given (a local index in this
    /// process), else to the retriever at `retriever_url`, through a cache; page access to that
    /// retriever; the Python sandbox only when `env` runs model-written code.
    pub fn build(
        config: &ContextConfig,
        env: &EnvConfig,
        engine: Arc<dyn Engine>,
        model: &Path,
        local: Option<Arc<dyn Search>>,
    ) -> Result<Context, ContextError> {
        config.validate()?;
        let timeout = Duration::from_secs_f64(config.tool_timeout_secs);
        let retriever = config.retriever_url.as_deref().map(|url| Arc::new(HttpRetriever::new(url, timeout)));
        let search = local.or_else(|| retriever.clone().map(|r| r as Arc<dyn Search>)).map(|inner| {
            Arc::new(CachedSearch::new(inner, config.search_cache_entries, config.search_concurrency))
                as Arc<dyn Search>
        });
        let python = env.runs_python().then(|| PythonSandbox::new(config.python.clone())).transpose()?;
        if let Some(sandbox) = &python {
            tracing::info!(protections = %sandbox.protections(), "python sandbox ready");
        }
        Ok(Context {
            engine,
            tokenizer: Tokenizer::load(model)?,
            chat_template: ChatTemplate::load(model)?,
            search,
            access: retriever.map(|r| r as Arc<dyn Access>),
            python: python.map(Arc::new),
            retry: config.retry.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FixedSearch, Reply, ScriptedEngine};
    use kart_core::tool::Searched;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A search tool counting the queries that reach it.
    struct Counting(AtomicUsize, FixedSearch);

    impl Search for Counting {
        fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
            self.0.fetch_add(queries.len(), Ordering::SeqCst);
            self.1.search(queries, topk)
        }
    }

    fn build(config: &ContextConfig, local: Option<Arc<dyn Search>>) -> Result<Context, ContextError> {
        let model = kart_testing::model("tiny-qwen2");
        let engine = ScriptedEngine::new(Tokenizer::load(&model).unwrap(), |_, _| Reply::Text(String::new()));
        Context::build(config, &EnvConfig::default(), Arc::new(engine), &model, local)
    }

    #[tokio::test]
    async fn the_cache_settings_reach_the_search_tool() {
        for (entries, reached) in [(0, 3), (10, 1)] {
            let counting = Arc::new(Counting(AtomicUsize::new(0), FixedSearch { id: "1".into(), ok: true }));
            let config = ContextConfig { search_cache_entries: entries, ..ContextConfig::default() };
            let ctx = build(&config, Some(counting.clone())).unwrap();
            for _ in 0..3 {
                ctx.search.as_ref().unwrap().search(&["q".to_string()], 3).await.unwrap();
            }
            assert_eq!(counting.0.load(Ordering::SeqCst), reached, "search_cache_entries {entries}");
        }
    }

    #[test]
    fn tools_follow_the_config() {
        let ctx = build(&ContextConfig::default(), None).unwrap();
        assert!(ctx.search.is_none() && ctx.access.is_none(), "no retriever, no search or access");
        let config = ContextConfig {
            retriever_url: Some("http://retriever:8000".into()),
            retry: RetryPolicy { retries: 7, backoff_ms: 3 },
            ..ContextConfig::default()
        };
        let ctx = build(&config, None).unwrap();
        assert!(ctx.search.is_some() && ctx.access.is_some());
        assert_eq!(ctx.retry, config.retry);
        let bad = ContextConfig { tool_timeout_secs: -1.0, ..ContextConfig::default() };
        let err = build(&bad, None).err().expect("a negative timeout is refused").to_string();
        assert!(err.contains("tool_timeout_secs = -1"), "{err}");
        let bad = ContextConfig { retriever_url: Some("retriever:8000".into()), ..ContextConfig::default() };
        let err = build(&bad, None).err().expect("a URL without a scheme is refused").to_string();
        assert!(err.contains("retriever_url = retriever:8000"), "{err}");
    }
}
