//! The turn loop every environment runs, written once: an environment is an [`Agent`] (how an
//! episode starts) whose episodes follow a [`Protocol`] (what each turn asks the engine for, and
//! what the environment answers); the loop does the rest, and every `Agent` is an
//! [`Environment`].
//!
//! Each turn: the protocol's context text (masked) is appended; the engine is asked for at most
//! the turn's token budget, cut to the room left under the trajectory's cap, retried per the
//! context's policy; the model's tokens are appended exactly as sampled; the protocol answers
//! with an observation (masked, cut to its own limit and to the room left), another generation,
//! or the end. The episode ends `truncated` when the cap cuts text the environment appends, when
//! no room is left for a generation, or when the protocol ends it so (a turn the cap cut);
//! `aborted` when the engine fails for good; `completed` otherwise.

use super::{Context, Environment, RolloutError};
use crate::builder::TrajectoryBuilder;
use crate::retry;
use crate::reward::Scoring;
use futures::future::BoxFuture;
use kart_core::agent::trajectory::{Status, Trajectory};
use kart_core::engine::EngineOutput;
use kart_core::generation::{FinishReason, Generation, GenerationRequest, SamplingParams};
use kart_core::wire::Task;
use std::future::Future;
use std::time::Instant;

/// How an episode starts: the prompt's token ids, the protocol's state, and the trajectory's cap.
pub struct Start<P> {
    pub prompt_ids: Vec<u32>,
    pub protocol: P,
    /// Most tokens in the whole trajectory, prompt included.
    pub max_tokens: usize,
}

/// What the next turn asks for.
pub struct Turn {
    /// Text the environment appends (masked) before the generation.
    pub context: Option<String>,
    /// Most tokens the turn may generate (`None`: the room left).
    pub max_new_tokens: Option<usize>,
    /// Stop strings of the generation.
    pub stop: Vec<String>,
}

/// A generated turn as its protocol answers it, with the trajectory so far (for statistics).
pub struct Generated<'a> {
    /// The decoding of exactly the turn's tokens.
    pub text: &'a str,
    pub generation: &'a Generation,
    /// Whether the trajectory's cap cut the turn: it reached the room left, which was less than
    /// the turn's budget.
    pub cut_by_cap: bool,
    pub trajectory: &'a mut Trajectory,
}

/// How the episode goes on after a turn.
pub enum Next {
    /// Append this observation (masked), cut to `max_tokens` tokens when given, then generate.
    Observe { text: String, max_tokens: Option<usize> },
    /// Generate again, appending nothing.
    Generate,
    /// The episode is over.
    Done,
    /// The episode is over because a limit cut it.
    Truncated,
}

/// An environment's side of the turn loop, holding one episode's state.
pub trait Protocol: Send {
    /// The next turn, or `None` when the episode is over.
    fn next_turn(&mut self) -> Option<Turn>;

    /// The part of a generation that is the turn (all of it, unless the protocol cuts turns), with
    /// its text; `text` is the decoding of all of `output`'s tokens.
    fn cut(
        &self,
        _ctx: &Context,
        output: EngineOutput,
        text: String,
    ) -> Result<(EngineOutput, String), RolloutError> {
        Ok((output, text))
    }

    /// Answers a generated `turn`.
    fn respond(
        &mut self,
        ctx: &Context,
        turn: Generated<'_>,
    ) -> impl Future<Output = Result<Next, RolloutError>> + Send;

    /// The reward of the finished trajectory.
    fn reward(&self, ctx: &Context, task: &Task, trajectory: &Trajectory) -> Result<f64, RolloutError>;
}

/// An environment as the turn loop runs it: its name and how an episode starts.
pub trait Agent: Send + Sync {
    /// The episode's protocol.
    type Protocol<'a>: Protocol
    where
        Self: 'a;

    /// The environment's name in metrics and logs (`search-r1`, `asearcher`, `tir`).
    const NAME: &'static str;

    /// The prompt of `task`, its episode's protocol and the trajectory's cap.
    fn start<'a>(&'a self, ctx: &Context, task: &Task) -> Result<Start<Self::Protocol<'a>>, RolloutError>;

    /// Runs one episode of `task`: its trajectory, with id `id`.
    fn run<'a>(
        &'a self,
        ctx: &'a Context,
        task: &'a Task,
        id: String,
        sampling: &'a SamplingParams,
    ) -> impl Future<Output = Result<Trajectory, RolloutError>> + Send + 'a
    where
        Self: Sized,
    {
        run(self, ctx, task, id, sampling)
    }
}

impl<A: Agent> Environment for A {
    fn name(&self) -> &'static str {
        A::NAME
    }

    fn episode<'a>(
        &'a self,
        ctx: &'a Context,
        task: &'a Task,
        episode_id: String,
        sampling: &'a SamplingParams,
    ) -> BoxFuture<'a, Result<Vec<Trajectory>, RolloutError>> {
        Box::pin(async move { Ok(vec![run(self, ctx, task, episode_id, sampling).await?]) })
    }
}

/// Runs one episode of `task`: the agent builds the prompt and the protocol, then turns run until
/// the episode ends; the trajectory carries the reward, the status and the wall time.
async fn run<A: Agent>(
    agent: &A,
    ctx: &Context,
    task: &Task,
    id: String,
    sampling: &SamplingParams,
) -> Result<Trajectory, RolloutError> {
    let started = Instant::now();
    let Start { prompt_ids, mut protocol, max_tokens } = agent.start(ctx, task)?;
    let mut b = TrajectoryBuilder::new(id, task.id.clone(), &prompt_ids, ctx.tokenizer.clone());
    let mut status = turns(ctx, task, &mut b, &mut protocol, sampling, max_tokens).await?;
    let mut reward = protocol.reward(ctx, task, b.trajectory_mut())?;
    if !ctx.rewards.is_rule_only() && status != Status::Aborted {
        let scoring = scoring(ctx, task, b.trajectory_mut())?;
        match ctx.rewards.combine(reward, &scoring).await {
            Ok((total, parts)) => {
                reward = total;
                b.trajectory_mut().stats.reward_scores = parts;
            }
            Err(e) => {
                tracing::warn!(error = %e, task = %task.id, "reward service failed; trajectory aborted");
                status = Status::Aborted;
            }
        }
    }
    let t = b.trajectory_mut();
    t.reward = reward;
    t.status = status;
    t.stats.latency_ms = started.elapsed().as_millis() as u64;
    Ok(b.finish())
}

/// A finished trajectory as reward services read it.
fn scoring(ctx: &Context, task: &Task, t: &Trajectory) -> Result<Scoring, RolloutError> {
    let ids = t.token_ids();
    let response = ctx.tokenizer.decode(&ids[t.prompt_len()..], true)?;
    Ok(Scoring {
        id: t.id.clone(),
        prompt_id: t.prompt_id.clone(),
        data_source: task.data_source.clone(),
        ground_truth: task.ground_truth.clone(),
        question: task.question(),
        prompt: ctx.tokenizer.decode(&ids[..t.prompt_len()], false)?,
        answer: Scoring::answer_of(&response, &ctx.tokenizer.decode(t.last_turn(), true)?),
        response,
    })
}

/// The turns of an episode; returns how it ended.
async fn turns<P: Protocol>(
    ctx: &Context,
    task: &Task,
    b: &mut TrajectoryBuilder,
    protocol: &mut P,
    sampling: &SamplingParams,
    max_tokens: usize,
) -> Result<Status, RolloutError> {
    let room = |b: &TrajectoryBuilder| max_tokens.saturating_sub(b.len());
    while let Some(turn) = protocol.next_turn() {
        if let Some(text) = &turn.context
            && b.push_env(text, Some(room(b)))? != *text
        {
            return Ok(Status::Truncated);
        }
        let room_left = room(b);
        if room_left == 0 {
            return Ok(Status::Truncated);
        }
        let budget = turn.max_new_tokens.unwrap_or(room_left);
        let request = GenerationRequest {
            input_ids: b.token_ids().to_vec(),
            sampling: sampling.clone(),
            max_new_tokens: budget.min(room_left),
            stop: turn.stop,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        };
        let (output, text) = match retry::generate(ctx.engine.as_ref(), request, &ctx.retry).await {
            Ok(output) => {
                let text = ctx.tokenizer.decode(&output.generation.token_ids, false)?;
                protocol.cut(ctx, output, text)?
            }
            Err(e) => {
                tracing::warn!(error = %e, task = %task.id, "engine failed; trajectory aborted");
                return Ok(Status::Aborted);
            }
        };
        let cut_by_cap = output.generation.finish_reason == FinishReason::Length && budget > room_left;
        b.push_model(&output)?;
        let turn = Generated {
            text: &text,
            generation: &output.generation,
            cut_by_cap,
            trajectory: b.trajectory_mut(),
        };
        match protocol.respond(ctx, turn).await? {
            Next::Generate => {}
            Next::Done => return Ok(Status::Completed),
            Next::Truncated => return Ok(Status::Truncated),
            Next::Observe { text, max_tokens: limit } => {
                let room_left = room(b);
                let cut_by_room = limit.is_none_or(|l| l >= room_left);
                if b.push_env(&text, Some(limit.map_or(room_left, |l| l.min(room_left))))? != text
                    && cut_by_room
                {
                    return Ok(Status::Truncated);
                }
            }
        }
    }
    Ok(Status::Completed)
}
