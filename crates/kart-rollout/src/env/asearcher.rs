//! ASearcher's loop, as upstream `ASearcher/train/asearcher.py` (`collect_agent_trajectory`) runs
//! it around the [`SearchAgent`] state machine: while the agent is not finished and has turns
//! left, it prepares a query, the model generates up to the query's stop strings, and the turn's
//! first action runs — a search ([`Search`](kart_core::tool::Search), top-k results) or a
//! page access ([`Access`](kart_core::tool::Access)), whose results the agent queues as
//! summarisation jobs read one per turn (stopping at `</think>`), or the answer, which ends the
//! episode. An end-of-sequence token ends it too.
//!
//! # One token sequence
//! Upstream re-renders the prompt text from the agent's memory every turn, re-tokenises it, and
//! trains each model turn as a separate sample on that input. kart keeps one sequence: the prompt
//! tokenised once, then per turn only the text the agent's query adds to the memory it was built
//! from — a summarisation job `\n\n<information>…</information>\n<think>\n`, nothing for an action
//! turn — tokenised once with loss mask 0, then the model's tokens exactly as sampled (loss mask 1).
//!
//! Where upstream's prompt does not extend the previous context: after a page chunk has been read,
//! upstream's memory shows only its short text (the first 100 characters) in later prompts. A
//! token sequence cannot shrink, and the model did see the chunk in full when it summarised it,
//! so kart keeps the chunk in full and later turns are generated with it in context. Search
//! results stay in full upstream too, so without page reads the contexts are identical; with
//! them kart's are longer, bounded by `max_trajectory_tokens`.
//!
//! # Reward
//! Upstream's: the score (F1 by default, or EM) of the turn whose first action is the answer —
//! computed on that turn's text, decoded from exactly its tokens, which scores the same as
//! upstream's `<answer>…</answer>` action text — or 0 when no turn answered; times 0 unless every
//! turn passes [`correct_format`]; and -0.5 under the valid-question instruction when the final
//! answer calls the question invalid.
//!
//! Tool failures never fail the trajectory: a failed search reads as no results and a failed
//! page access as a page without information (the agent's own notices), counted as failed calls.

use super::turns::{Agent, Generated, Next, Protocol, Start, Turn};
use super::{Context, RolloutError};
use kart_core::agent::asearcher::{SearchAgent, Tag, ToolResponse, build_prompt};
use kart_core::agent::search_r1::Document;
use kart_core::agent::trajectory::Trajectory;
pub use kart_core::config::env::{AsearcherConfig, AsearcherReward};
use kart_core::reward::asearcher::{compute_score_em, compute_score_f1, correct_format};
use kart_core::tool::ToolError;
use kart_core::wire::{Task, TaskError};

/// Upstream's `judge_q_invalid`: an answer holding any of these calls the question invalid.
const INVALID_QUESTION_MARKERS: [&str; 4] = ["question", "invalid", "appropriate", "valid"];

/// The reward of an answer that calls the question invalid under the valid-question instruction.
const INVALID_QUESTION_REWARD: f64 = -0.5;

/// The ASearcher environment.
#[derive(Debug, Clone)]
pub struct AsearcherEnv {
    config: AsearcherConfig,
}

impl AsearcherEnv {
    pub fn new(config: AsearcherConfig) -> Self {
        AsearcherEnv { config }
    }
}

/// One ASearcher episode: the agent's state machine and what the reward needs.
pub struct AsearcherEpisode<'a> {
    config: &'a AsearcherConfig,
    agent: SearchAgent,
    /// Whether the prompt told the model the question is valid.
    valid_instruction: bool,
    /// Whether every turn so far passed upstream's format check.
    well_formatted: bool,
    /// The turn whose first action is the answer.
    answer_turn: Option<String>,
}

impl AsearcherEpisode<'_> {
    /// Searches for `query`: the top-k results as the agent reads them, or none when the search
    /// fails.
    async fn search(&self, ctx: &Context, query: &str, trajectory: &mut Trajectory) -> ToolResponse {
        let result = match &ctx.search {
            Some(search) => search.search(&[query.to_owned()], self.config.agent.topk).await,
            None => Err(ToolError { tool: "search", reason: "no search tool is configured".into() }),
        };
        trajectory.stats.record_tool_call("search", result.is_ok());
        let hits = match result {
            Ok(mut results) => results.pop().unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "search failed");
                Vec::new()
            }
        };
        ToolResponse::Search {
            documents: hits.iter().map(|hit| document_text(&hit.document)).collect(),
            urls: hits.into_iter().map(|hit| hit.document.id).collect(),
        }
    }
}

impl Protocol for AsearcherEpisode<'_> {
    fn next_turn(&mut self) -> Option<Turn> {
        if self.agent.num_turns() >= self.config.max_turns || self.agent.is_finished() {
            return None;
        }
        let memory = self.agent.memory_prompt();
        let query = self.agent.prepare_llm_query();
        // The query is the memory plus what is new to the model: a summarisation job, if any.
        let job = query.prompt.strip_prefix(&memory).expect("a query starts with the agent's memory");
        Some(Turn {
            context: Some(job.to_owned()),
            max_new_tokens: Some(self.config.max_response_length),
            stop: query.stop.iter().map(|s| s.to_string()).collect(),
        })
    }

    async fn respond(&mut self, ctx: &Context, turn: Generated<'_>) -> Result<Next, RolloutError> {
        let Generated { text, generation, cut_by_cap, trajectory } = turn;
        self.well_formatted &= correct_format(text);
        // Upstream runs a turn's first action only.
        if let Some(call) = self.agent.consume_llm_response(text).into_iter().next() {
            trajectory.stats.valid_actions += 1;
            let response = match call.tag {
                Tag::Search => self.search(ctx, call.argument(), trajectory).await,
                Tag::Access => access(ctx, call.argument(), trajectory).await,
                Tag::Answer => {
                    self.answer_turn = Some(text.to_owned());
                    return Ok(Next::Done);
                }
            };
            if let Err(e) = self.agent.consume_tool_response(&response) {
                tracing::warn!(error = %e, "summarisation jobs dropped");
            }
        }
        Ok(if cut_by_cap {
            Next::Truncated
        } else if ctx.ends_sequence(&generation.token_ids) {
            Next::Done
        } else {
            Next::Generate
        })
    }

    fn reward(&self, _ctx: &Context, task: &Task, _trajectory: &Trajectory) -> Result<f64, RolloutError> {
        let c = self.config;
        let score = self.answer_turn.as_ref().map_or(0.0, |turn| match c.reward {
            AsearcherReward::F1 => compute_score_f1(turn, &task.ground_truth),
            AsearcherReward::Em => compute_score_em(turn, &task.ground_truth),
        });
        let calls_question_invalid =
            self.agent.answer().is_some_and(|a| INVALID_QUESTION_MARKERS.iter().any(|m| a.contains(m)));
        Ok(if self.valid_instruction && calls_question_invalid {
            INVALID_QUESTION_REWARD
        } else if c.require_format && !self.well_formatted {
            0.0
        } else {
            score
        })
    }
}

/// Reads the page at `url`; a failed access reads as a missing page.
async fn access(ctx: &Context, url: &str, trajectory: &mut Trajectory) -> ToolResponse {
    let result = match &ctx.access {
        Some(access) => access.access(url).await,
        None => Err(ToolError { tool: "access", reason: "no page access tool is configured".into() }),
    };
    trajectory.stats.record_tool_call("access", result.is_ok());
    let page = result.inspect_err(|e| tracing::warn!(error = %e, url, "page access failed")).ok();
    ToolResponse::Access { page }
}

/// A search result as the agent reads it: `title text` (upstream's online `title + " " + snippet`),
/// or the contents when the corpus has no separate title and text.
fn document_text(document: &Document) -> String {
    match (&document.title, &document.text) {
        (Some(title), Some(text)) => format!("{title} {text}"),
        _ => document.contents.clone(),
    }
}

impl Agent for AsearcherEnv {
    type Protocol<'a> = AsearcherEpisode<'a>;
    const NAME: &'static str = "asearcher";

    fn start<'a>(&'a self, ctx: &Context, task: &Task) -> Result<Start<AsearcherEpisode<'a>>, RolloutError> {
        let c = &self.config;
        let (prompt, valid_instruction) = match (&task.messages, &task.prompt) {
            (Some(messages), _) if !messages.is_empty() => (ctx.render(messages)?, false),
            (_, Some(question)) => {
                (build_prompt(c.template, question, c.valid_instruction), c.valid_instruction)
            }
            _ => return Err(TaskError::NoPrompt { id: task.id.clone() }.into()),
        };
        Ok(Start {
            prompt_ids: ctx.tokenizer.encode(&prompt, false)?,
            protocol: AsearcherEpisode {
                config: c,
                agent: SearchAgent::new(prompt, c.agent),
                valid_instruction,
                well_formatted: true,
                answer_turn: None,
            },
            max_tokens: c.max_trajectory_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FixedSearch, Reply, ScriptedEngine};
    use futures::future::BoxFuture;
    use kart_core::agent::asearcher::{AgentConfig, PromptTemplate};
    use kart_core::agent::trajectory::Status;
    use kart_core::config::retry::RetryPolicy;
    use kart_core::engine::EngineError;
    use kart_core::generation::SamplingParams;
    use kart_core::tool::Access;
    use kart_tokenizer::ChatTemplate;
    use kart_tokenizer::Tokenizer;
    use std::num::NonZeroUsize;
    use std::sync::{Arc, Mutex};

    const URL: &str = "https://en.wikipedia.org/wiki/Paris";
    const QUESTION: &str = "What is the capital of France";

    /// Serves one page for every URL, or fails.
    struct FixedAccess(Option<String>);

    impl Access for FixedAccess {
        fn access<'a>(&'a self, _url: &'a str) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(
                async move { self.0.clone().ok_or(ToolError { tool: "access", reason: "timed out".into() }) },
            )
        }
    }

    /// A context whose engine answers `script(call)` and records the decoded context of each call.
    fn context(
        script: impl Fn(usize) -> Reply + Send + Sync + 'static,
        search_ok: bool,
        page: Option<&str>,
    ) -> (Context, Arc<Mutex<Vec<String>>>) {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let engine = ScriptedEngine::new(tokenizer.clone(), move |context, call| {
            record.lock().unwrap().push(context.to_owned());
            script(call)
        });
        let ctx = Context {
            engine: Arc::new(engine),
            tokenizer,
            chat_template: ChatTemplate::load(kart_testing::model("tiny-qwen2")).unwrap(),
            search: Some(Arc::new(FixedSearch { id: URL.into(), ok: search_ok })),
            access: Some(Arc::new(FixedAccess(page.map(str::to_owned)))),
            python: None,
            functions: kart_tools::functions::Functions::default(),
            rewards: Default::default(),
            retry: RetryPolicy { retries: 1, backoff_ms: 1 },
            roles: Vec::new(),
        };
        (ctx, seen)
    }

    /// A context answering `replies` in order, then thinking without acting.
    fn replying(replies: &[&str]) -> Context {
        let replies: Vec<String> = replies.iter().map(|r| r.to_string()).collect();
        let script =
            move |call: usize| Reply::Text(replies.get(call).cloned().unwrap_or("<think>...</think>".into()));
        context(script, true, None).0
    }

    async fn run(config: AsearcherConfig, ctx: &Context) -> Trajectory {
        let task = Task {
            id: "q1".into(),
            messages: None,
            prompt: Some(QUESTION.into()),
            ground_truth: vec!["Paris".into()],
            data_source: "nq".into(),
            tools: None,
        };
        AsearcherEnv::new(config).run(ctx, &task, "t0".into(), &SamplingParams::default()).await.unwrap()
    }

    fn prompt() -> String {
        build_prompt(PromptTemplate::SearchAccess, QUESTION, true)
    }

    /// The trajectory as runs of equal loss mask, each decoded.
    fn segments(ctx: &Context, t: &Trajectory) -> Vec<(u8, String)> {
        let mut runs: Vec<(u8, Vec<u32>)> = Vec::new();
        for (&id, &mask) in t.token_ids().iter().zip(t.loss_mask()) {
            match runs.last_mut() {
                Some((m, ids)) if *m == mask => ids.push(id),
                _ => runs.push((mask, vec![id])),
            }
        }
        runs.into_iter().map(|(mask, ids)| (mask, ctx.tokenizer.decode(&ids, false).unwrap())).collect()
    }

    fn decode(ctx: &Context, t: &Trajectory) -> String {
        ctx.tokenizer.decode(t.token_ids(), false).unwrap()
    }

    fn page_job(n: usize, chunk: &str) -> String {
        format!("\n\n<information>\n>>>> Page {n} >>>>\n\n{chunk}\n</information>\n<think>\n")
    }

    #[tokio::test]
    async fn search_then_answer() {
        let ctx = replying(&[
            "<think>I need to look it up.</think>\n<search> capital of France </search> and more",
            "Paris is the capital of France.</think> ignored <search> x </search>",
            "\n<answer> Paris </answer> extra",
        ]);
        let t = run(AsearcherConfig::default(), &ctx).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 1.0));
        assert_eq!((t.stats.turns, t.stats.valid_actions), (3, 2));
        assert_eq!(t.stats.tool_calls["search"].ok, 1);
        assert_eq!(t.stats.total_tool_calls(), 1, "the summary turn stopped at </think>");
        let search = "<think>I need to look it up.</think>\n<search> capital of France </search>";
        let job = format!(
            "\n\n<information>\n[Doc 1]({URL}):\nFrance Paris is the capital.\n</information>\n<think>\n"
        );
        let (summary, answer) = ("Paris is the capital of France.</think>", "\n<answer> Paris </answer>");
        // One sequence: the prompt, the model's turns (trained) and the job the agent added (masked).
        let expected =
            vec![(0, prompt()), (1, search.to_owned()), (0, job.clone()), (1, format!("{summary}{answer}"))];
        assert_eq!(segments(&ctx, &t), expected);
        let text = decode(&ctx, &t);
        assert_eq!(text, format!("{}{search}{job}{summary}{answer}", prompt()));
        assert_eq!(ctx.tokenizer.encode(&prompt(), false).unwrap().len(), t.prompt_len());
        // The reward saw exactly the answer turn's decoded tokens, the end of the sequence.
        assert!(text.ends_with(answer));
        assert_eq!(compute_score_f1(answer, &["Paris"]), t.reward);
        for ((m, lp), v) in t.loss_mask().iter().zip(t.logprobs()).zip(t.versions()) {
            assert_eq!(*m == 1, *lp == -0.5);
            assert_eq!(*m == 1, *v == 0);
        }
    }

    #[tokio::test]
    async fn a_long_page_is_read_chunk_by_chunk_in_summary_turns() {
        let page: String =
            "Paris is the capital and most populous city of France. ".repeat(8).chars().take(400).collect();
        let replies = [
            format!("<access> {URL} </access>"),
            "First part.</think> <search> x </search>".into(),
            "Second part.</think> <search> x </search>".into(),
            "Third part.</think>".into(),
            "<answer> Paris </answer>".into(),
        ];
        let (ctx, seen) = context(move |call| Reply::Text(replies[call].clone()), true, Some(&page));
        let agent =
            AgentConfig { page_chunk_chars: NonZeroUsize::new(150).unwrap(), ..AgentConfig::default() };
        let t = run(AsearcherConfig { agent, ..AsearcherConfig::default() }, &ctx).await;
        assert_eq!((t.status, t.reward, t.stats.turns), (Status::Completed, 1.0, 5));
        assert_eq!(t.stats.tool_calls["access"].ok, 1);
        assert!(!t.stats.tool_calls.contains_key("search"), "summary turns stop at </think>");
        let chunks = [&page[..150], &page[150..300], &page[300..]];
        let expected = vec![
            (0, prompt()),
            (1, format!("<access> {URL} </access>")),
            (0, page_job(1, chunks[0])),
            (1, "First part.</think>".into()),
            (0, page_job(2, chunks[1])),
            (1, "Second part.</think>".into()),
            (0, page_job(3, chunks[2])),
            (1, "Third part.</think><answer> Paris </answer>".into()),
        ];
        assert_eq!(segments(&ctx, &t), expected);
        // Later turns keep the chunks read in full (upstream's memory shortens them to 100 characters).
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 5);
        assert!(seen[4].contains(&page_job(1, chunks[0])) && seen[4].contains(&page_job(3, chunks[2])));
        assert_eq!(seen[4], decode(&ctx, &t).trim_end_matches("<answer> Paris </answer>"));
    }

    #[tokio::test]
    async fn turns_without_an_action_continue_until_max_turns() {
        let ctx = replying(&[]);
        let t = run(AsearcherConfig { max_turns: 3, ..AsearcherConfig::default() }, &ctx).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 0.0));
        assert_eq!((t.stats.turns, t.stats.valid_actions, t.stats.env_tokens), (3, 0, 0));
        assert_eq!(decode(&ctx, &t), format!("{}{}", prompt(), "<think>...</think>".repeat(3)));
    }

    #[tokio::test]
    async fn max_turns_counts_summary_turns() {
        let script = |call: usize| {
            Reply::Text(
                if call.is_multiple_of(2) { "<search> capital </search>" } else { "Nothing new.</think>" }
                    .into(),
            )
        };
        let (ctx, _) = context(script, true, None);
        let t = run(AsearcherConfig { max_turns: 4, ..AsearcherConfig::default() }, &ctx).await;
        assert_eq!((t.status, t.reward, t.stats.turns), (Status::Completed, 0.0, 4));
        assert_eq!(t.stats.tool_calls["search"].ok, 2);
        assert!(decode(&ctx, &t).ends_with("Nothing new.</think>"));
    }

    #[tokio::test]
    async fn tool_failures_are_masked_notices_and_counted_failures() {
        let replies = [
            "<search> x </search>",
            "No results.</think>",
            "<access> https://example.org </access>",
            "Nothing there.</think>",
            "<answer> Paris </answer>",
        ];
        let (ctx, _) = context(move |call| Reply::Text(replies[call].into()), false, None);
        let t = run(AsearcherConfig::default(), &ctx).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 1.0));
        assert_eq!((t.stats.tool_calls["search"].failed, t.stats.tool_calls["access"].failed), (1, 1));
        let masked: Vec<String> =
            segments(&ctx, &t).into_iter().skip(1).filter(|(m, _)| *m == 0).map(|(_, s)| s).collect();
        assert_eq!(
            masked,
            [
                "\n\n<information>\nNo search results are found.\n</information>\n<think>\n",
                "\n\n<information>\nNo More Information is Found for this URL.\n</information>\n<think>\n",
            ]
        );
    }

    #[tokio::test]
    async fn engine_failure_after_retries_aborts_keeping_the_tokens() {
        let failing = EngineError::Unavailable { engine: "scripted".into(), reason: "down".into() };
        let script = move |call: usize| match call {
            0 => Reply::Text("<search> x </search>".into()),
            _ => Reply::Fail(failing.clone()),
        };
        let (ctx, _) = context(script, true, None);
        let t = run(AsearcherConfig::default(), &ctx).await;
        assert_eq!((t.status, t.stats.turns), (Status::Aborted, 1));
        assert!(decode(&ctx, &t).starts_with(&format!("{}<search> x </search>\n\n<information>", prompt())));
    }

    #[tokio::test]
    async fn an_end_of_sequence_token_ends_the_episode() {
        let ctx = replying(&["<think>I give up.</think><|im_end|>"]);
        let t = run(AsearcherConfig::default(), &ctx).await;
        assert_eq!((t.status, t.stats.turns), (Status::Completed, 1));
    }

    #[tokio::test]
    async fn the_trajectory_token_cap_truncates() {
        let long = "<think>".to_owned() + &"long ".repeat(200);
        let ctx = replying(&[&long]);
        let prompt_len = ctx.tokenizer.encode(&prompt(), false).unwrap().len();
        let t = run(
            AsearcherConfig { max_trajectory_tokens: prompt_len + 20, ..AsearcherConfig::default() },
            &ctx,
        )
        .await;
        assert_eq!((t.status, t.len()), (Status::Truncated, prompt_len + 20));
    }

    #[tokio::test]
    async fn reward_options() {
        let score = |config: AsearcherConfig, answer: &'static str| async move {
            run(config, &replying(&[answer])).await.reward
        };
        let partial = "<answer> Paris France </answer>";
        assert!((score(AsearcherConfig::default(), partial).await - 2.0 / 3.0).abs() < 1e-9);
        let em = AsearcherConfig { reward: AsearcherReward::Em, ..AsearcherConfig::default() };
        assert_eq!(score(em, partial).await, 0.0);
        // A turn failing upstream's format check zeroes the score, unless the check is off.
        let badly_formatted = "<think>As the Assistant I know.</think><answer> Paris </answer>";
        assert_eq!(score(AsearcherConfig::default(), badly_formatted).await, 0.0);
        let lenient = AsearcherConfig { require_format: false, ..AsearcherConfig::default() };
        assert_eq!(score(lenient, badly_formatted).await, 1.0);
        // Calling the question invalid costs 0.5 when the prompt said it is valid.
        let invalid = "<answer> the question is invalid. </answer>";
        assert_eq!(score(AsearcherConfig::default(), invalid).await, -0.5);
        let uninstructed = AsearcherConfig { valid_instruction: false, ..AsearcherConfig::default() };
        assert_eq!(score(uninstructed, invalid).await, 0.0);
    }

    #[test]
    fn config_parses_from_the_env_kind() {
        let config: crate::env::EnvConfig = serde_json::from_str(
            r#"{"kind": "asearcher", "reward": "em", "max_turns": 32, "agent": {"topk": 3}}"#,
        )
        .unwrap();
        let expected = AsearcherConfig {
            reward: AsearcherReward::Em,
            max_turns: 32,
            agent: AgentConfig { topk: 3, ..AgentConfig::default() },
            ..AsearcherConfig::default()
        };
        assert_eq!(config, crate::env::EnvConfig::Asearcher(expected));
    }
}
