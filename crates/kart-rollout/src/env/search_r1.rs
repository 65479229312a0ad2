//! Search-R1's loop, as upstream `generation.py` runs it: each turn is generated, cut after its
//! first action ([`postprocess`]), parsed ([`parse_action`]) and answered — passages for a search,
//! the episode's end for an answer, the invalid-action reminder otherwise — with observations cut to
//! `max_obs_length` tokens; after `max_turns` rounds one final generation runs without search.
//!
//! Differences from upstream, both on by default and switchable: generation stops at `</search>` /
//! `</answer>` instead of running to `max_response_length` and cutting the text afterwards (the
//! "runaway generation" cost), and the tokens kept for a turn are exactly the sampled ones up to the
//! cut (upstream re-tokenises the cut text).

use super::turns::{Agent, Generated, Next, Protocol, Start, Turn};
use super::{Context, RolloutError};
use kart_core::agent::search_r1::{
    Action, Episode, STOP_STRINGS, make_prefix, parse_action, passages_to_string, postprocess,
};
use kart_core::agent::trajectory::Trajectory;
pub use kart_core::config::env::{RewardFn, SearchR1Config};
use kart_core::engine::EngineOutput;
use kart_core::generation::FinishReason;
use kart_core::reward::search_r1::{compute_score_em, compute_score_em_format, compute_score_subem};
use kart_core::wire::Task;

/// The Search-R1 environment.
#[derive(Debug, Clone)]
pub struct SearchR1Env {
    config: SearchR1Config,
}

impl SearchR1Env {
    pub fn new(config: SearchR1Config) -> Self {
        SearchR1Env { config }
    }
}

/// One Search-R1 episode: its turn rules and the environment's settings.
pub struct SearchR1Episode<'a> {
    config: &'a SearchR1Config,
    episode: Episode,
}

impl SearchR1Episode<'_> {
    /// The observation's passages: retrieved ones, or an error text when the search tool failed.
    async fn search(&self, ctx: &Context, query: &str, trajectory: &mut Trajectory) -> String {
        let Some(search) = &ctx.search else {
            trajectory.stats.record_tool_call("search", false);
            return "Error: no search tool is configured.".to_string();
        };
        match search.search(&[query.to_string()], self.config.topk).await {
            Ok(mut results) => {
                trajectory.stats.record_tool_call("search", true);
                passages_to_string(&results.pop().unwrap_or_default())
            }
            Err(e) => {
                tracing::warn!(error = %e, "search failed");
                trajectory.stats.record_tool_call("search", false);
                format!("Error: search failed: {}", e.reason)
            }
        }
    }
}

impl Protocol for SearchR1Episode<'_> {
    fn next_turn(&mut self) -> Option<Turn> {
        if self.episode.is_over() {
            return None;
        }
        let stop =
            if self.config.stop_at_action { STOP_STRINGS.map(String::from).to_vec() } else { Vec::new() };
        Some(Turn { context: None, max_new_tokens: Some(self.config.max_response_length), stop })
    }

    /// Keeps a turn's tokens up to the one that completes its first action, as upstream's text cut
    /// does; the tokens after it were generated (without stop strings) but are not part of the turn.
    fn cut(
        &self,
        ctx: &Context,
        mut output: EngineOutput,
        text: String,
    ) -> Result<(EngineOutput, String), RolloutError> {
        let g = &mut output.generation;
        let cut = postprocess(&text).len();
        if cut == text.len() {
            return Ok((output, text));
        }
        let mut stream = ctx.tokenizer.decode_stream(false);
        let mut seen = 0;
        for (i, &id) in g.token_ids.iter().enumerate() {
            seen += stream.step(id)?.len();
            if seen >= cut {
                g.token_ids.truncate(i + 1);
                g.logprobs.truncate(i + 1);
                g.finish_reason = FinishReason::Stop;
                break;
            }
        }
        let text = ctx.tokenizer.decode(&g.token_ids, false)?;
        Ok((output, text))
    }

    async fn respond(&mut self, ctx: &Context, turn: Generated<'_>) -> Result<Next, RolloutError> {
        let Generated { text, cut_by_cap, trajectory, .. } = turn;
        if cut_by_cap {
            return Ok(Next::Truncated);
        }
        let action = parse_action(postprocess(text));
        let passages = match &action {
            Some(Action::Search(query)) if self.episode.executes_search() => {
                self.search(ctx, query, trajectory).await
            }
            _ => String::new(),
        };
        let observation = self.episode.record(action.as_ref(), &passages);
        trajectory.stats.valid_actions = self.episode.stats().valid_actions;
        Ok(match observation {
            // Observations are cut to `max_obs_length` tokens (and to the room left).
            Some(text) if !text.is_empty() => {
                Next::Observe { text, max_tokens: Some(self.config.max_obs_length) }
            }
            _ => Next::Generate,
        })
    }

    fn reward(&self, ctx: &Context, task: &Task, trajectory: &Trajectory) -> Result<f64, RolloutError> {
        let text = ctx.tokenizer.decode(trajectory.token_ids(), false)?;
        let (c, gold) = (self.config, &task.ground_truth);
        Ok(match c.reward_fn {
            RewardFn::Em => compute_score_em(&text, gold, &c.reward),
            RewardFn::SubEm => compute_score_subem(&text, gold, &c.reward),
            RewardFn::EmFormat => compute_score_em_format(&text, gold, &c.reward),
        })
    }
}

impl Agent for SearchR1Env {
    type Protocol<'a> = SearchR1Episode<'a>;
    const NAME: &'static str = "search-r1";

    fn start<'a>(&'a self, ctx: &Context, task: &Task) -> Result<Start<SearchR1Episode<'a>>, RolloutError> {
        let messages = task.messages_or(|q| make_prefix(q).map_err(|e| e.to_string()))?;
        Ok(Start {
            prompt_ids: ctx.prompt_ids(&messages)?,
            protocol: SearchR1Episode { config: &self.config, episode: Episode::new(self.config.max_turns) },
            max_tokens: self.config.max_trajectory_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Context;
    use crate::fake::{FixedSearch, Reply, ScriptedEngine};
    use kart_core::agent::trajectory::Status;
    use kart_core::config::retry::RetryPolicy;
    use kart_core::engine::EngineError;
    use kart_core::generation::SamplingParams;
    use kart_core::reward::search_r1::SearchR1RewardWeights;
    use kart_tokenizer::ChatTemplate;
    use kart_tokenizer::Tokenizer;
    use std::sync::Arc;

    fn context(engine: ScriptedEngine, search_ok: bool) -> Context {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        Context {
            engine: Arc::new(engine),
            tokenizer,
            chat_template: ChatTemplate::load(kart_testing::model("tiny-qwen2")).unwrap(),
            search: Some(Arc::new(FixedSearch { id: "1".into(), ok: search_ok })),
            access: None,
            python: None,
            functions: kart_tools::functions::Functions::default(),
            rewards: Default::default(),
            retry: RetryPolicy { retries: 1, backoff_ms: 1 },
            roles: Vec::new(),
        }
    }

    fn task() -> Task {
        Task {
            id: "q1".into(),
            messages: None,
            prompt: Some("What is the capital of France".into()),
            ground_truth: vec!["Paris".into()],
            data_source: "nq".into(),
            tools: None,
        }
    }

    fn scripted(replies: Vec<Reply>) -> ScriptedEngine {
        ScriptedEngine::new(Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap(), move |_, call| {
            replies.get(call).cloned().unwrap_or_else(|| Reply::Text("<think>...</think>".into()))
        })
    }

    async fn run(config: SearchR1Config, ctx: &Context) -> Trajectory {
        SearchR1Env::new(config).run(ctx, &task(), "t0".into(), &SamplingParams::default()).await.unwrap()
    }

    fn decode(ctx: &Context, ids: &[u32]) -> String {
        ctx.tokenizer.decode(ids, false).unwrap()
    }

    #[tokio::test]
    async fn search_then_answer() {
        let ctx = context(
            scripted(vec![
                Reply::Text(
                    "<think>I need to look it up.</think>\n<search> capital of France </search> and more"
                        .into(),
                ),
                Reply::Text("<think>Found it.</think>\n<answer> Paris </answer> extra".into()),
            ]),
            true,
        );
        let t = run(SearchR1Config::default(), &ctx).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 1.0));
        assert_eq!((t.stats.turns, t.stats.valid_actions), (2, 2));
        assert_eq!(t.stats.tool_calls["search"].ok, 1);
        let text = decode(&ctx, t.token_ids());
        assert!(text.starts_with("<|im_start|>user\nAnswer the given question."), "{text}");
        assert!(text.contains("</search>\n\n<information>Doc 1(Title: \"France\") Paris is the capital.</information>\n\n<think>"), "{text}");
        assert!(
            !text.contains("and more") && !text.contains("extra"),
            "generation stops at the action: {text}"
        );
        // The reward saw exactly the decoded trajectory.
        assert_eq!(compute_score_em(&text, &["Paris"], &SearchR1RewardWeights::default()), t.reward);
        // Observation tokens are masked, with logprob 0 and no version; model tokens are trained.
        let obs = ctx
            .tokenizer
            .encode(
                "\n\n<information>Doc 1(Title: \"France\") Paris is the capital.</information>\n\n",
                false,
            )
            .unwrap();
        let masked: Vec<u32> = t.token_ids()[t.prompt_len()..]
            .iter()
            .zip(&t.loss_mask()[t.prompt_len()..])
            .filter(|(_, m)| **m == 0)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(masked, obs);
        for ((m, lp), v) in t.loss_mask().iter().zip(t.logprobs()).zip(t.versions()).skip(t.prompt_len()) {
            assert_eq!(*m == 1, *lp == -0.5);
            assert_eq!(*m == 1, *v == 0);
        }
    }

    #[tokio::test]
    async fn without_stop_strings_the_turn_is_cut_after_the_action_token_exactly() {
        let ctx = context(
            scripted(vec![
                Reply::Text(
                    "<search> capital of France </search> runaway text <answer> Rome </answer>".into(),
                ),
                Reply::Text("<answer> Paris </answer> more runaway".into()),
            ]),
            true,
        );
        let config = SearchR1Config { stop_at_action: false, ..SearchR1Config::default() };
        let t = run(config, &ctx).await;
        let text = decode(&ctx, t.token_ids());
        assert!(!text.contains("runaway"), "{text}");
        assert_eq!(t.reward, 1.0);
    }

    #[tokio::test]
    async fn invalid_actions_get_the_reminder_until_the_final_turn() {
        let ctx = context(scripted(vec![]), true);
        let t = run(SearchR1Config { max_turns: 2, ..SearchR1Config::default() }, &ctx).await;
        assert_eq!(t.stats.turns, 3, "two rounds plus the final one");
        assert_eq!(t.stats.valid_actions, 0);
        let text = decode(&ctx, t.token_ids());
        assert_eq!(text.matches("My previous action is invalid.").count(), 2, "{text}");
        assert_eq!(t.reward, 0.0);
        assert_eq!(t.status, Status::Completed);
    }

    #[tokio::test]
    async fn a_search_in_the_final_round_is_not_executed() {
        let search = |_: &str, _: usize| Reply::Text("<search> capital </search>".into());
        let ctx = context(
            ScriptedEngine::new(Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap(), search),
            true,
        );
        let t = run(SearchR1Config { max_turns: 1, ..SearchR1Config::default() }, &ctx).await;
        assert_eq!(t.stats.turns, 2);
        assert_eq!(t.stats.tool_calls["search"].ok, 1, "only the first round searched");
    }

    #[tokio::test]
    async fn tool_failure_is_a_masked_observation_and_a_counted_failure() {
        let ctx = context(
            scripted(vec![
                Reply::Text("<search> x </search>".into()),
                Reply::Text("<answer> Paris </answer>".into()),
            ]),
            false,
        );
        let t = run(SearchR1Config::default(), &ctx).await;
        assert_eq!(t.stats.tool_calls["search"].failed, 1);
        assert!(
            decode(&ctx, t.token_ids())
                .contains("<information>Error: search failed: connection refused</information>")
        );
        assert_eq!((t.status, t.reward), (Status::Completed, 1.0));
    }

    #[tokio::test]
    async fn engine_failure_after_retries_aborts() {
        let failing = EngineError::Unavailable { engine: "scripted".into(), reason: "down".into() };
        let ctx = context(
            scripted(vec![
                Reply::Text("<search> x </search>".into()),
                Reply::Fail(failing.clone()),
                Reply::Fail(failing),
            ]),
            true,
        );
        let t = run(SearchR1Config::default(), &ctx).await;
        assert_eq!(t.status, Status::Aborted);
        assert_eq!(t.stats.turns, 1);
    }

    #[tokio::test]
    async fn the_trajectory_token_cap_truncates() {
        let ctx = context(scripted(vec![Reply::Text("<think>".to_string() + &"long ".repeat(200))]), true);
        let prompt_len =
            run(SearchR1Config { max_trajectory_tokens: 100_000, ..SearchR1Config::default() }, &ctx)
                .await
                .prompt_len();
        let ctx = context(scripted(vec![Reply::Text("<think>".to_string() + &"long ".repeat(200))]), true);
        let t =
            run(SearchR1Config { max_trajectory_tokens: prompt_len + 20, ..SearchR1Config::default() }, &ctx)
                .await;
        assert_eq!(t.status, Status::Truncated);
        assert_eq!(t.len(), prompt_len + 20);
    }
}
