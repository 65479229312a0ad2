//! What environments run against ([`Context`]): the engine, the model's tokenizer and chat
//! template, and the tools, built in one place from a [`ContextConfig`] for a rollout worker, the
//! trainer's in-process pool and the rollout benchmark alike.

use super::RolloutError;
use crate::reward::Rewards;
use kart_core::chat::ChatMessage;
use kart_core::config::ConfigError;
use kart_core::config::env::{EnvConfig, ToolsConfig};
use kart_core::config::functions::{Builtin, FunctionConfig};
use kart_core::config::retry::RetryPolicy;
use kart_core::config::rollout::ContextConfig;
use kart_core::engine::Engine;
use kart_core::tool::{Access, Function, Search};
use kart_tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use kart_tools::batched_search::BatchedSearch;
use kart_tools::functions::builtin::{AccessFunction, CalculatorFunction, PythonFunction, SearchFunction};
use kart_tools::functions::http::HttpFunction;
use kart_tools::functions::mcp::{McpClient, McpError};
use kart_tools::functions::{DuplicateFunction, Functions};
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
    /// The functions of the `tools` environment, by name.
    pub functions: Functions,
    /// The reward services combined with the environments' own rewards.
    pub rewards: Arc<Rewards>,
    pub retry: RetryPolicy,
    /// A workflow's roles' contexts, in role order: this one with each role's functions.
    pub roles: Vec<Context>,
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

    /// The prompt's token ids: [`render`](Self::render)'s text tokenised, without special tokens
    /// added (the template writes them); the pieces of a prompt seen before (a group's, a
    /// system prompt's) from the tokenizer's memory.
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, RolloutError> {
        Ok(self.tokenizer.encode_cached(&self.render(messages)?)?)
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
    #[error(transparent)]
    Duplicate(#[from] DuplicateFunction),
    #[error("functions[{at}].mcp: {source}")]
    Mcp { at: usize, source: McpError },
    #[error("role `{role}`: {source}")]
    Role { role: String, source: Box<ContextError> },
}

impl Context {
    /// The context of `engine` with the tokenizer and chat template of the model folder `model`
    /// and the tools of `config`: searches go to `local` when given (a local index in this
    /// process), else to the retriever at `retriever_url`, through a cache; page access to that
    /// retriever; the Python sandbox only when `env` runs model-written code; the functions of a
    /// `tools` environment, an MCP server's listed now (a workflow's role contexts each with
    /// their own).
    pub async fn build(
        config: &ContextConfig,
        env: &EnvConfig,
        engine: Arc<dyn Engine>,
        model: &Path,
        local: Option<Arc<dyn Search>>,
    ) -> Result<Context, ContextError> {
        config.validate()?;
        env.validate()?;
        let timeout = Duration::from_secs_f64(config.tool_timeout_secs);
        let retriever = match config.retriever_url.as_deref() {
            Some(url) => Some(Arc::new(
                HttpRetriever::new(url, timeout)
                    .map_err(|_| ConfigError::new("retriever_url", url, "is not a URL"))?,
            )),
            None => None,
        };
        let search = local.or_else(|| retriever.clone().map(|r| r as Arc<dyn Search>)).map(|inner| {
            let batched = Arc::new(BatchedSearch::new(inner, config.search_concurrency));
            Arc::new(CachedSearch::new(batched, config.search_cache_entries)) as Arc<dyn Search>
        });
        let python =
            env.runs_python().then(|| PythonSandbox::new(config.python.clone())).transpose()?.map(Arc::new);
        if let Some(sandbox) = &python {
            tracing::info!(protections = %sandbox.protections(), "python sandbox ready");
        }
        let access = retriever.map(|r| r as Arc<dyn Access>);
        let base = Context {
            engine,
            tokenizer: Tokenizer::load(model)?,
            chat_template: ChatTemplate::load(model)?,
            search,
            access,
            python,
            functions: Functions::default(),
            rewards: Arc::new(Rewards::new(&config.reward)),
            retry: config.retry.clone(),
            roles: Vec::new(),
        };
        match env {
            EnvConfig::Workflow(workflow) => {
                let mut roles = Vec::with_capacity(workflow.roles.len());
                for role in &workflow.roles {
                    let functions = base
                        .functions_of(&role.env)
                        .await
                        .map_err(|e| ContextError::Role { role: role.name.clone(), source: Box::new(e) })?;
                    roles.push(Context { functions, ..base.clone() });
                }
                Ok(Context { roles, ..base })
            }
            _ => Ok(Context { functions: base.functions_of(env).await?, ..base }),
        }
    }

    /// The functions of `env` on this context's back ends (none but a `tools` environment's).
    async fn functions_of(&self, env: &EnvConfig) -> Result<Functions, ContextError> {
        match env {
            EnvConfig::Tools(tools) => {
                functions(tools, self.search.as_ref(), self.access.as_ref(), self.python.as_ref()).await
            }
            _ => Ok(Functions::default()),
        }
    }
}

/// The functions `config` names, on their back ends.
async fn functions(
    config: &ToolsConfig,
    search: Option<&Arc<dyn Search>>,
    access: Option<&Arc<dyn Access>>,
    python: Option<&Arc<PythonSandbox>>,
) -> Result<Functions, ContextError> {
    let mut functions = Functions::default();
    for (i, function) in config.functions.iter().enumerate() {
        let missing = |what: &'static str| {
            ContextError::Config(ConfigError::new(format!("functions[{i}]"), what, MISSING))
        };
        let added: Vec<Arc<dyn Function>> = match function {
            FunctionConfig::Builtin(Builtin::Search) => {
                let search = search.ok_or_else(|| missing("search"))?;
                vec![Arc::new(SearchFunction::new(search.clone(), config.search_topk))]
            }
            FunctionConfig::Builtin(Builtin::Access) => {
                vec![Arc::new(AccessFunction::new(access.ok_or_else(|| missing("access"))?.clone()))]
            }
            FunctionConfig::Builtin(Builtin::Python) => {
                vec![Arc::new(PythonFunction::new(python.ok_or_else(|| missing("python"))?.clone()))]
            }
            FunctionConfig::Builtin(Builtin::Calculator) => vec![Arc::new(CalculatorFunction::default())],
            FunctionConfig::Http(http) => vec![Arc::new(HttpFunction::new(http))],
            FunctionConfig::Mcp(server) => McpClient::connect(server)
                .await
                .map_err(|source| ContextError::Mcp { at: i, source })?
                .into_iter()
                .map(|tool| Arc::new(tool) as Arc<dyn Function>)
                .collect(),
        };
        for f in added {
            functions.add(f)?;
        }
    }
    tracing::info!(functions = ?functions, "functions ready");
    Ok(functions)
}

/// Why a built-in function cannot run.
const MISSING: &str = "needs a back end this worker lacks (search and access need rollout.index or \
    retriever_url; python needs the sandbox)";

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

    async fn build(config: &ContextConfig, local: Option<Arc<dyn Search>>) -> Result<Context, ContextError> {
        let model = kart_testing::model("tiny-qwen2");
        let engine = ScriptedEngine::new(Tokenizer::load(&model).unwrap(), |_, _| Reply::Text(String::new()));
        Context::build(config, &EnvConfig::default(), Arc::new(engine), &model, local).await
    }

    #[tokio::test]
    async fn the_cache_settings_reach_the_search_tool() {
        for (entries, reached) in [(0, 3), (10, 1)] {
            let counting = Arc::new(Counting(AtomicUsize::new(0), FixedSearch { id: "1".into(), ok: true }));
            let config = ContextConfig { search_cache_entries: entries, ..ContextConfig::default() };
            let ctx = build(&config, Some(counting.clone())).await.unwrap();
            for _ in 0..3 {
                ctx.search.as_ref().unwrap().search(&["q".to_string()], 3).await.unwrap();
            }
            assert_eq!(counting.0.load(Ordering::SeqCst), reached, "search_cache_entries {entries}");
        }
    }

    /// A search tool holding every call until released, recording each call's query count and
    /// the calls in flight.
    #[derive(Default)]
    struct Held {
        in_flight: AtomicUsize,
        calls: std::sync::Mutex<Vec<usize>>,
        release: Option<tokio::sync::watch::Receiver<bool>>,
    }

    impl Search for Held {
        fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
            Box::pin(async move {
                self.calls.lock().unwrap().push(queries.len());
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                let mut release = self.release.clone().expect("a release signal");
                release.wait_for(|released| *released).await.expect("the test holds the sender");
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                FixedSearch { id: "1".into(), ok: true }.search(queries, topk).await
            })
        }
    }

    /// Yields to the other tasks until `done` holds, failing after many rounds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never happened: {what}");
    }

    #[tokio::test]
    async fn search_concurrency_bounds_the_requests_in_flight() {
        for limit in [2, 8] {
            let (release, released) = tokio::sync::watch::channel(false);
            let held = Arc::new(Held { release: Some(released), ..Held::default() });
            let config = ContextConfig {
                search_concurrency: limit,
                search_cache_entries: 0,
                ..ContextConfig::default()
            };
            let ctx = Arc::new(build(&config, Some(held.clone())).await.unwrap());
            let search = |query: &str| {
                let (ctx, query) = (ctx.clone(), query.to_string());
                tokio::spawn(async move { ctx.search.as_ref().unwrap().search(&[query], 3).await })
            };
            let mut searches = vec![search("a")];
            until("a is searched", || held.in_flight.load(Ordering::SeqCst) == 1).await;
            searches.push(search("b"));
            until("b is searched", || held.in_flight.load(Ordering::SeqCst) == 2).await;
            searches.extend(["c", "d", "e"].map(search));
            if limit > 2 {
                until("c goes out at once", || held.in_flight.load(Ordering::SeqCst) >= 3).await;
            } else {
                for _ in 0..100 {
                    tokio::task::yield_now().await;
                }
                assert_eq!(held.in_flight.load(Ordering::SeqCst), 2, "c, d and e wait for a free request");
            }
            release.send(true).unwrap();
            for search in searches {
                assert_eq!(search.await.unwrap().unwrap().len(), 1);
            }
            let calls = held.calls.lock().unwrap().clone();
            assert_eq!(calls.iter().sum::<usize>(), 5, "{calls:?}");
            if limit == 2 {
                assert_eq!(calls, [1, 1, 3], "c, d and e left together when a request finished");
            }
        }
    }

    #[tokio::test]
    async fn prompt_ids_are_the_rendered_prompt_tokenised() {
        let ctx = build(&ContextConfig::default(), None).await.unwrap();
        let question = vec![ChatMessage::new("user", "who wrote hamlet?\nAnswer briefly.")];
        let text = ctx.render(&question).unwrap();
        let ids = ctx.prompt_ids(&question).unwrap();
        assert_eq!(ids, ctx.tokenizer.encode(&text, false).unwrap());
        assert_eq!(ctx.prompt_ids(&question).unwrap(), ids, "the same ids from the tokenizer's memory");
    }

    #[tokio::test]
    async fn tools_follow_the_config() {
        let ctx = build(&ContextConfig::default(), None).await.unwrap();
        assert!(ctx.search.is_none() && ctx.access.is_none(), "no retriever, no search or access");
        let config = ContextConfig {
            retriever_url: Some("http://retriever:8000".into()),
            retry: RetryPolicy { retries: 7, backoff_ms: 3 },
            ..ContextConfig::default()
        };
        let ctx = build(&config, None).await.unwrap();
        assert!(ctx.search.is_some() && ctx.access.is_some());
        assert_eq!(ctx.retry, config.retry);
        let bad = ContextConfig { tool_timeout_secs: -1.0, ..ContextConfig::default() };
        let err = build(&bad, None).await.err().expect("a negative timeout is refused").to_string();
        assert!(err.contains("tool_timeout_secs = -1"), "{err}");
        let bad = ContextConfig { retriever_url: Some("retriever:8000".into()), ..ContextConfig::default() };
        let err = build(&bad, None).await.err().expect("a URL without a scheme is refused").to_string();
        assert!(err.contains("retriever_url = retriever:8000"), "{err}");
        let bad = ContextConfig {
            retriever_url: Some("http://retri ever:8000".into()),
            ..ContextConfig::default()
        };
        let err = build(&bad, None).await.err().expect("a host with a space is refused").to_string();
        assert_eq!(err, "retriever_url = http://retri ever:8000: is not a URL");
    }
}
