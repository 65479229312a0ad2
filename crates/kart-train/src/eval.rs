//! Evaluation figures: exact match, token F1, reward, searches and valid format of held-out
//! trajectories, per data source and over the whole held-out split: greedy, and optionally sampled
//! at the training temperature (the reward the policy earns as it is trained, on unseen prompts).
//!
//! The answer is the last `<answer>…</answer>` of the model's response (for math, the final
//! answer the math reward extracts: `<answer>`, `\boxed{}`, …). Exact match is Search-R1's
//! `em_check` (SQuAD normalisation against any golden answer); F1 is ASearcher's token F1, the best
//! over the golden answers.

use crate::pool::RolloutPool;
use futures::StreamExt;
use kart_core::agent::trajectory::Trajectory;
use kart_core::config::env::EnvConfig;
use kart_core::generation::SamplingParams;
use kart_core::reward::asearcher::{extract_solution, f1_score};
use kart_core::reward::math;
use kart_core::reward::search_r1::em_check;
use kart_core::wire::{RolloutRequest, Task};
use kart_tokenizer::{Tokenizer, TokenizerError};
use std::collections::{BTreeMap, HashMap};

/// One scored trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub data_source: String,
    pub exact_match: f64,
    pub f1: f64,
    pub reward: f64,
    /// Tool calls of the trajectory.
    pub tool_calls: f64,
    /// An answer was given and every turn held a valid action.
    pub valid_format: bool,
    /// Tokens the model generated.
    pub response_tokens: f64,
}

/// The final answer of a model response.
pub fn answer_of(response: &str) -> Option<String> {
    extract_solution(response).map(str::to_string).or_else(|| math::extract_answer(response))
}

/// Exact match and F1 of `response` against the golden answers.
pub fn score_answer(response: &str, ground_truth: &[String]) -> (f64, f64) {
    let Some(answer) = answer_of(response) else { return (0.0, 0.0) };
    let exact =
        em_check(&answer, ground_truth) || ground_truth.iter().any(|g| math::is_equivalent(&answer, g));
    let f1 = ground_truth.iter().map(|g| f1_score(&answer, g)).fold(0.0, f64::max);
    (if exact { 1.0 } else { 0.0 }, if exact { 1.0 } else { f1 })
}

/// Means of the scored trajectories of one source (or of all).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub exact_match: f64,
    pub f1: f64,
    pub reward: f64,
    pub tool_calls: f64,
    pub valid_format: f64,
    pub response_tokens: f64,
}

impl Summary {
    fn of<'a>(items: impl Iterator<Item = &'a Scored>) -> Self {
        let mut s = Summary::default();
        for x in items {
            s.count += 1;
            s.exact_match += x.exact_match;
            s.f1 += x.f1;
            s.reward += x.reward;
            s.tool_calls += x.tool_calls;
            s.valid_format += f64::from(u8::from(x.valid_format));
            s.response_tokens += x.response_tokens;
        }
        if s.count > 0 {
            let n = s.count as f64;
            let means = [
                &mut s.exact_match,
                &mut s.f1,
                &mut s.reward,
                &mut s.tool_calls,
                &mut s.valid_format,
                &mut s.response_tokens,
            ];
            for v in means {
                *v /= n;
            }
        }
        s
    }
}

/// An evaluation's summaries: over everything and per data source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub all: Summary,
    pub by_source: BTreeMap<String, Summary>,
}

impl Report {
    /// Summarises scored trajectories.
    pub fn new(scored: &[Scored]) -> Self {
        let sources: std::collections::BTreeSet<&str> =
            scored.iter().map(|s| s.data_source.as_str()).collect();
        Report {
            all: Summary::of(scored.iter()),
            by_source: sources
                .into_iter()
                .map(|src| (src.to_string(), Summary::of(scored.iter().filter(|s| s.data_source == src))))
                .collect(),
        }
    }

    /// `("all", whole split)`, then each data source with its summary.
    pub fn sources(&self) -> impl Iterator<Item = (&str, &Summary)> {
        std::iter::once(("all", &self.all)).chain(self.by_source.iter().map(|(k, v)| (k.as_str(), v)))
    }
}

/// How one evaluation pass decodes.
#[derive(Debug, Clone)]
pub struct Pass {
    /// Trajectories per prompt.
    pub n: usize,
    pub sampling: SamplingParams,
    /// The policy version asked of the pool, if any.
    pub policy_version: Option<i64>,
}

/// Rolls out `prompts` through `pool` in `env` as `pass` says, and scores every trajectory
/// against its prompt's golden answers; returns the report and the scored trajectories (a failed
/// group is left out). `progress` advances by one per group.
pub async fn score(
    pool: &dyn RolloutPool,
    tokenizer: &Tokenizer,
    env: &EnvConfig,
    prompts: &[Task],
    pass: &Pass,
    progress: Option<&indicatif::ProgressBar>,
) -> Result<(Report, Vec<Trajectory>), TokenizerError> {
    let request = RolloutRequest {
        prompts: prompts.to_vec(),
        n: pass.n,
        sampling: pass.sampling.clone(),
        policy_version: pass.policy_version,
        env: Some(env.clone()),
        weights: None,
    };
    let truth: HashMap<&str, &Task> = prompts.iter().map(|t| (t.id.as_str(), t)).collect();
    let mut stream = pool.rollout(request);
    let (mut scored, mut trajectories) = (Vec::new(), Vec::new());
    while let Some(item) = stream.next().await {
        if let Some(bar) = progress {
            bar.inc(1);
        }
        let Ok(group) = item else { continue };
        let Some(task) = truth.get(group.prompt_id.as_str()) else { continue };
        for t in group.trajectories {
            let response = tokenizer.decode(t.response_ids(), true)?;
            let (exact_match, f1) = score_answer(&response, &task.ground_truth);
            scored.push(Scored {
                data_source: task.data_source.clone(),
                exact_match,
                f1,
                reward: t.reward,
                tool_calls: f64::from(t.stats.total_tool_calls()),
                valid_format: answer_of(&response).is_some() && t.stats.valid_actions >= t.stats.turns,
                response_tokens: f64::from(t.stats.response_tokens),
            });
            trajectories.push(t);
        }
    }
    Ok((Report::new(&scored), trajectories))
}

/// One held-out evaluation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    /// Greedy decoding, one trajectory per prompt.
    pub greedy: Report,
    /// Sampling as in training (`eval.sampled_n` trajectories per prompt), when configured.
    pub sampled: Option<Report>,
    /// The greedy pass's trajectories, one per prompt (each naming its prompt in `prompt_id`), in
    /// the order they finished.
    pub greedy_trajectories: Vec<Trajectory>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_answer_counts_and_math_falls_back_to_boxed() {
        let gt = vec!["Paris".to_string()];
        assert_eq!(score_answer("<answer>Lyon</answer> then <answer> the Paris </answer>", &gt), (1.0, 1.0));
        let (em, f1) = score_answer("<answer>Paris France</answer>", &gt);
        assert_eq!(em, 0.0);
        assert!((f1 - 2.0 / 3.0).abs() < 1e-9, "{f1}");
        assert_eq!(score_answer("no answer", &gt), (0.0, 0.0));
        assert_eq!(score_answer("so \\boxed{\\frac{1}{2}}", &["0.5".to_string()]).0, 1.0);
    }

    #[test]
    fn report_groups_by_source() {
        let s = |src: &str, em: f64| Scored {
            data_source: src.into(),
            exact_match: em,
            f1: em,
            reward: em,
            tool_calls: 1.0,
            valid_format: em > 0.0,
            response_tokens: 10.0 + em * 20.0,
        };
        let report = Report::new(&[s("nq", 1.0), s("nq", 0.0), s("hotpotqa", 1.0)]);
        assert_eq!(report.all.count, 3);
        assert_eq!(report.by_source["nq"].response_tokens, 20.0);
        assert!((report.all.exact_match - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(report.by_source["nq"].exact_match, 0.5);
        assert_eq!(report.by_source["hotpotqa"].valid_format, 1.0);
    }
}
