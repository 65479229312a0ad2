//! Tool-integrated reasoning's loop, as upstream `examples/tir/tir_workflow.py`
//! (`_multi_round_response`) runs it around the [`TirEpisode`] state machine: generation stops at
//! any tool's start marker, then at an end marker, and the call between them runs — Python code in
//! the [`PythonSandbox`](kart_tools::python::PythonSandbox), arithmetic in the
//! [`calculator`](kart_tools::calculator) — with its output appended as an observation (loss
//! mask 0) before generation resumes. The episode ends at an answer (`\boxed{…}` or
//! `<answer>…</answer>`), at the end of the sequence, once more than `max_turns` tool calls were
//! made (upstream's `turn <= max_turns`), or at `max_length` tokens (status `truncated`). The
//! reward is [`score`] of the completion against the first golden answer.
//!
//! Differences from upstream:
//! - upstream generates past `max_length`, cuts the sequence afterwards and scores the uncut
//!   text; kart never goes past it (each generation's budget is the room left, an observation is
//!   cut to it), so the reward scores exactly the decoded response tokens;
//! - every end-of-sequence token of the model ends the episode (upstream checks `eos_token_id` and
//!   `pad_token_id` only), and so does an empty generation;
//! - a Python call without a configured executor, or whose sandbox fails, is a failed call whose
//!   observation is the error.

use super::turns::{Agent, Generated, Next, Protocol, Start, Turn};
use super::{Context, RolloutError};
use kart_core::agent::tir::{
    FinishReason as TirFinish, Step, TirConfig, TirEpisode, Tool, ToolCall, ToolOutcome, system_prompt,
    torl_prompt,
};
use kart_core::agent::trajectory::Trajectory;
use kart_core::chat::ChatMessage;
use kart_core::config::env::tool_name;
pub use kart_core::config::env::{TirEnvConfig, TirPrompt};
use kart_core::generation::{FinishReason, Generation};
use kart_core::reward::math::score;
use kart_core::wire::{Task, TaskError};
use kart_tools::calculator::calculate;

/// The TIR environment.
#[derive(Debug, Clone)]
pub struct TirEnv {
    config: TirEnvConfig,
}

impl TirEnv {
    pub fn new(config: TirEnvConfig) -> Self {
        TirEnv { config }
    }

    /// The prompt's token ids. ToRL reads the first message after a leading system message (upstream
    /// reads `messages[1]` once the system prompt is first); the chat form puts the tools' system
    /// prompt in place of a leading system message, or before the messages.
    fn prompt_ids(&self, ctx: &Context, task: &Task) -> Result<Vec<u32>, RolloutError> {
        let mut messages = task.messages_or(|question| Ok(question.to_owned()))?;
        let has_system = messages[0].role == "system";
        match self.config.prompt {
            TirPrompt::Torl => {
                let question = messages.get(usize::from(has_system)).ok_or_else(|| TaskError::Invalid {
                    id: task.id.clone(),
                    field: "messages",
                    reason: "no message follows the system message".into(),
                })?;
                Ok(ctx.tokenizer.encode(&torl_prompt(&question.content), false)?)
            }
            TirPrompt::Chat => {
                let system = ChatMessage::new("system", system_prompt(&self.config.tools));
                if has_system {
                    messages[0] = system;
                } else {
                    messages.insert(0, system);
                }
                ctx.prompt_ids(&messages)
            }
        }
    }
}

/// One TIR episode: the protocol's state machine and the tools it may call.
pub struct TirTurns<'a> {
    tools: &'a [Tool],
    episode: TirEpisode,
}

impl Protocol for TirTurns<'_> {
    fn next_turn(&mut self) -> Option<Turn> {
        self.episode.within_turn_limit().then(|| Turn {
            context: None,
            max_new_tokens: None,
            stop: self.episode.stop_strings().into_iter().map(String::from).collect(),
        })
    }

    async fn respond(&mut self, ctx: &Context, turn: Generated<'_>) -> Result<Next, RolloutError> {
        let Generated { text, generation, trajectory, .. } = turn;
        let observation = match self.episode.consume_generation(text, finish(ctx, generation)) {
            Step::Generate => return Ok(Next::Generate),
            Step::Done => return Ok(Next::Done),
            Step::Execute(call) => {
                let (tool, outcome) = execute(ctx, call).await;
                let successes = self.episode.tool_successes();
                let observation = self.episode.record_tool_result(&outcome);
                let stats = &mut trajectory.stats;
                stats.record_tool_call(tool_name(tool), self.episode.tool_successes() > successes);
                stats.valid_actions += 1;
                observation
            }
            Step::Observe(observation) => {
                // A rejected call: the end marker that closed it names its tool.
                if let Some(tool) =
                    self.tools.iter().find(|tool| tool.end_markers().iter().any(|m| text.ends_with(m)))
                {
                    trajectory.stats.record_tool_call(tool_name(*tool), false);
                }
                observation
            }
        };
        Ok(Next::Observe { text: observation, max_tokens: None })
    }

    fn reward(&self, ctx: &Context, task: &Task, trajectory: &Trajectory) -> Result<f64, RolloutError> {
        let completion = ctx.tokenizer.decode(trajectory.response_ids(), false)?;
        Ok(task.ground_truth.first().map_or(0.0, |gold| score(&completion, gold)))
    }
}

/// How a generation ended, in the protocol's terms: the end of the sequence (see
/// [`Context::ends_sequence`]), the token budget, or a stop string.
fn finish(ctx: &Context, generation: &Generation) -> TirFinish {
    if ctx.ends_sequence(&generation.token_ids) {
        TirFinish::Eos
    } else if generation.finish_reason == FinishReason::Length {
        TirFinish::Length
    } else {
        TirFinish::Stop
    }
}

/// Runs a call; returns its tool and outcome.
async fn execute(ctx: &Context, call: ToolCall) -> (Tool, ToolOutcome) {
    match call {
        ToolCall::Python { code } => {
            let outcome = match &ctx.python {
                Some(sandbox) => sandbox.run(&code).await.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "python sandbox failed");
                    e.into()
                }),
                None => ToolOutcome::Failed { message: "no Python executor is configured".into() },
            };
            (Tool::Python, outcome)
        }
        ToolCall::Calculator { expression } => (Tool::Calculator, calculate(&expression)),
    }
}

impl Agent for TirEnv {
    type Protocol<'a> = TirTurns<'a>;
    const NAME: &'static str = "tir";

    fn start<'a>(&'a self, ctx: &Context, task: &Task) -> Result<Start<TirTurns<'a>>, RolloutError> {
        let c = &self.config;
        Ok(Start {
            prompt_ids: self.prompt_ids(ctx, task)?,
            protocol: TirTurns {
                tools: &c.tools,
                episode: TirEpisode::new(&TirConfig { tools: c.tools.clone(), max_turns: c.max_turns }),
            },
            max_tokens: c.max_length,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::EnvConfig;
    use crate::fake::{Reply, ScriptedEngine};
    use kart_core::agent::trajectory::Status;
    use kart_core::config::retry::RetryPolicy;
    use kart_core::engine::EngineError;
    use kart_core::generation::SamplingParams;
    use kart_tokenizer::ChatTemplate;
    use kart_tokenizer::Tokenizer;
    use kart_tools::python::{PythonSandbox, SandboxConfig};
    use std::sync::Arc;

    const QUESTION: &str = "What is 6 times 7?";

    /// A context answering `replies` in order (then failing), with the given Python executor.
    fn context(replies: Vec<Reply>, python: Option<SandboxConfig>) -> Context {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        let engine = ScriptedEngine::new(tokenizer.clone(), move |_, call| {
            replies.get(call).cloned().unwrap_or(Reply::Fail(EngineError::Invalid("script exhausted".into())))
        });
        Context {
            engine: Arc::new(engine),
            tokenizer,
            chat_template: ChatTemplate::load(kart_testing::model("tiny-qwen2")).unwrap(),
            search: None,
            access: None,
            python: python.map(|config| Arc::new(PythonSandbox::new(config).unwrap())),
            functions: kart_tools::functions::Functions::default(),
            rewards: Default::default(),
            retry: RetryPolicy { retries: 1, backoff_ms: 1 },
            roles: Vec::new(),
        }
    }

    fn texts(replies: &[&str]) -> Vec<Reply> {
        replies.iter().map(|r| Reply::Text(r.to_string())).collect()
    }

    async fn run(config: TirEnvConfig, ctx: &Context) -> Trajectory {
        let task = Task {
            id: "m1".into(),
            messages: None,
            prompt: Some(QUESTION.into()),
            ground_truth: vec!["42".into()],
            data_source: "math".into(),
            tools: None,
        };
        TirEnv::new(config).run(ctx, &task, "t0".into(), &SamplingParams::default()).await.unwrap()
    }

    fn with_tools(tools: &[Tool]) -> TirEnvConfig {
        TirEnvConfig { tools: tools.to_vec(), ..TirEnvConfig::default() }
    }

    /// Checks that the trajectory decodes to the ToRL prompt then `completion`, with `observations`
    /// as its only masked text after the prompt, and that its reward is the score of `completion`.
    fn assert_transcript(ctx: &Context, t: &Trajectory, completion: &str, observations: &[&str]) {
        let decode = |ids: &[u32]| ctx.tokenizer.decode(ids, false).unwrap();
        assert_eq!(decode(t.token_ids()), format!("{}{completion}", torl_prompt(QUESTION)));
        assert_eq!(decode(t.response_ids()), completion);
        assert_eq!(t.reward, score(completion, "42"));
        let masked: Vec<u32> = t
            .response_ids()
            .iter()
            .zip(&t.loss_mask()[t.prompt_len()..])
            .filter(|(_, m)| **m == 0)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(decode(&masked), observations.concat());
    }

    #[tokio::test]
    async fn python_success() {
        let ctx = context(
            texts(&["Let me compute.\n```python", "\nprint(6 * 7)\n```", "So the answer is \\boxed{42}."]),
            Some(SandboxConfig::default()),
        );
        let t = run(TirEnvConfig::default(), &ctx).await;
        assert_eq!((t.status, t.reward, t.stats.turns), (Status::Completed, 1.0, 3));
        assert_eq!((t.stats.tool_calls["python"].ok, t.stats.valid_actions), (1, 1));
        let observation = "\n```output\n42\n```\n";
        let completion = format!(
            "Let me compute.\n```python\nprint(6 * 7)\n```{observation}So the answer is \\boxed{{42}}."
        );
        assert_transcript(&ctx, &t, &completion, &[observation]);
    }

    #[tokio::test]
    async fn python_timeout_is_a_failed_call() {
        let ctx = context(
            texts(&["```python", "\nwhile True:\n    pass\n```", "I could not compute it: \\boxed{0}"]),
            Some(SandboxConfig { timeout_secs: 1, ..SandboxConfig::default() }),
        );
        let t = run(TirEnvConfig::default(), &ctx).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 0.0));
        assert_eq!(t.stats.tool_calls["python"].failed, 1);
        let observation = "\n```output\nError: Timeout Error\n```\n";
        let completion =
            format!("```python\nwhile True:\n    pass\n```{observation}I could not compute it: \\boxed{{0}}");
        assert_transcript(&ctx, &t, &completion, &[observation]);
    }

    #[tokio::test]
    async fn without_an_executor_python_calls_fail_with_an_error_observation() {
        let ctx = context(texts(&["<python>", "print(42)</python>", "\\boxed{42}"]), None);
        let t = run(TirEnvConfig::default(), &ctx).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 1.0));
        assert_eq!(t.stats.tool_calls["python"].failed, 1);
        let observation =
            "\n```output\nError: Tool execution failed - Error: no Python executor is configured\n```\n";
        assert_transcript(
            &ctx,
            &t,
            &format!("<python>print(42)</python>{observation}\\boxed{{42}}"),
            &[observation],
        );
    }

    #[tokio::test]
    async fn calculator_calls_and_rejections() {
        let ctx = context(
            texts(&[
                "First <calculator>",
                "2 ^ 3</calculator>",
                " Again: <calculator>",
                "6 * 7</calculator>",
                " so \\boxed{42}",
            ]),
            None,
        );
        let t = run(with_tools(&[Tool::Calculator]), &ctx).await;
        assert_eq!((t.status, t.reward, t.stats.turns), (Status::Completed, 1.0, 5));
        let calls = t.stats.tool_calls["calculator"];
        assert_eq!((calls.ok, calls.failed, t.stats.valid_actions), (1, 1, 1));
        let rejected = "\n```output\nError: Tool execution failed - Error: Invalid expression\n```\n";
        let value = "\n```output\n42\n```\n";
        let completion = format!(
            "First <calculator>2 ^ 3</calculator>{rejected} Again: <calculator>6 * 7</calculator>{value} so \\boxed{{42}}"
        );
        assert_transcript(&ctx, &t, &completion, &[rejected, value]);
    }

    #[tokio::test]
    async fn an_answer_ends_the_episode() {
        let ctx = context(texts(&["6 * 7 = 42, so \\boxed{42}. To check: ```python"]), None);
        let t = run(TirEnvConfig::default(), &ctx).await;
        assert_eq!((t.status, t.reward, t.stats.turns), (Status::Completed, 1.0, 1));
        assert_transcript(&ctx, &t, "6 * 7 = 42, so \\boxed{42}. To check: ```python", &[]);
    }

    #[tokio::test]
    async fn an_end_of_sequence_token_ends_the_episode() {
        let ctx = context(texts(&["It is 42.<|im_end|>"]), None);
        let t = run(TirEnvConfig::default(), &ctx).await;
        assert_eq!((t.status, t.stats.turns), (Status::Completed, 1));
    }

    #[tokio::test]
    async fn generation_stops_after_max_turns_calls() {
        let ctx = context(texts(&["<calculator>", "1 + 1</calculator>", "never generated"]), None);
        let t = run(TirEnvConfig { max_turns: 0, ..with_tools(&[Tool::Calculator]) }, &ctx).await;
        assert_eq!((t.status, t.stats.turns, t.stats.tool_calls["calculator"].ok), (Status::Completed, 2, 1));
    }

    #[tokio::test]
    async fn engine_failure_after_retries_aborts_keeping_the_tokens() {
        let ctx = context(texts(&["Let me compute.\n```python"]), None);
        let t = run(TirEnvConfig::default(), &ctx).await;
        assert_eq!((t.status, t.stats.turns), (Status::Aborted, 1));
        assert_transcript(&ctx, &t, "Let me compute.\n```python", &[]);
    }

    #[tokio::test]
    async fn max_length_truncates() {
        let ctx = context(texts(&[&"long ".repeat(100)]), None);
        let prompt_len = ctx.tokenizer.encode(&torl_prompt(QUESTION), false).unwrap().len();
        let t = run(TirEnvConfig { max_length: prompt_len + 10, ..TirEnvConfig::default() }, &ctx).await;
        assert_eq!((t.status, t.len(), t.stats.turns), (Status::Truncated, prompt_len + 10, 1));
    }

    #[tokio::test]
    async fn the_chat_prompt_describes_the_tools() {
        let ctx = context(texts(&["\\boxed{42}"]), None);
        let t = run(TirEnvConfig { prompt: TirPrompt::Chat, ..TirEnvConfig::default() }, &ctx).await;
        let text = ctx.tokenizer.decode(t.token_ids(), false).unwrap();
        assert!(
            text.starts_with("<|im_start|>system\n\nYou are a helpful assistant that can use tools"),
            "{text}"
        );
        assert!(text.contains("Tool Name: python_executor") && !text.contains("python calculator"), "{text}");
        assert!(
            text.ends_with(&format!(
                "<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n\\boxed{{42}}"
            )),
            "{text}"
        );
    }

    #[test]
    fn config_names_the_tools() {
        let config: EnvConfig =
            serde_json::from_str(r#"{"kind": "tir", "tools": ["python", "calculator"]}"#).unwrap();
        assert_eq!(config, EnvConfig::Tir(with_tools(&[Tool::Python, Tool::Calculator])));
        let json = serde_json::to_value(TirEnvConfig::default()).unwrap();
        assert_eq!(json["tools"], serde_json::json!(["python"]));
        let err = serde_json::from_str::<EnvConfig>(r#"{"kind": "tir", "tools": ["shell"]}"#).unwrap_err();
        assert!(err.to_string().contains("unknown variant `shell`"), "{err}");
    }
}
