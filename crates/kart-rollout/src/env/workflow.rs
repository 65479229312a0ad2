//! A multi-agent workflow ([`kart_core::config::workflow`]): its roles run in order on one policy,
//! each role's `count` episodes concurrently in the role's own environment and context (its own
//! functions), on a question built from the task's and earlier roles' outputs. A selecting role's
//! reward is that of the output it picks; the outcome (the last role's mean reward) is then
//! shared back to every trajectory, and all of them join the task's group.
//!
//! A role's outputs are its episodes that were not aborted (a truncated one's text as far as it
//! got, as slime passes on a solution cut at the length limit). A role whose input names a role
//! without outputs does not run, nor do the roles after it: the outcome is then 0 (slime's early
//! exits). When the last role ran but every episode of it
//! was aborted, the outcome is unknown, and a sharing that needs it aborts the whole episode
//! rather than train on a made-up reward.

use super::{Context, Environment, RolloutError, build};
use futures::future::BoxFuture;
use kart_core::agent::trajectory::{Status, Trajectory};
use kart_core::config::workflow::{Role, WorkflowConfig, fill};
use kart_core::generation::SamplingParams;
use kart_core::wire::Task;
use regex::Regex;
use std::collections::HashMap;
use std::sync::Arc;

/// A workflow of roles.
pub struct WorkflowEnv {
    config: WorkflowConfig,
    roles: Vec<RoleEnv>,
}

/// A role's environment and its selection pattern.
struct RoleEnv {
    env: Arc<dyn Environment>,
    select: Option<Regex>,
}

/// A role's output, as later roles read it.
struct Output {
    text: String,
    reward: f64,
}

impl WorkflowEnv {
    /// The workflow of `config`, whose settings were checked (a selection pattern that does not
    /// compile never matches).
    pub fn new(config: &WorkflowConfig) -> Self {
        let roles = config
            .roles
            .iter()
            .map(|role| RoleEnv {
                env: build(&role.env),
                select: role.select.as_ref().and_then(|s| Regex::new(&s.pattern).ok()),
            })
            .collect();
        WorkflowEnv { config: config.clone(), roles }
    }

    async fn run(
        &self,
        ctx: &Context,
        task: &Task,
        id: String,
        sampling: &SamplingParams,
    ) -> Result<Vec<Trajectory>, RolloutError> {
        if ctx.roles.len() != self.roles.len() {
            return Err(RolloutError::Workflow(format!(
                "the context was built for {} roles; this workflow has {}",
                ctx.roles.len(),
                self.roles.len()
            )));
        }
        let question = task.question();
        let mut outputs: HashMap<&str, Vec<Output>> = HashMap::new();
        let mut trajectories = Vec::new();
        let mut last_ran = false;
        let mut episode = 0u64;
        for (r, (role, env)) in self.config.roles.iter().zip(&self.roles).enumerate() {
            let Some(input) = input(role, &question, &outputs) else { break };
            let role_task = Task { prompt: Some(input), messages: None, ..task.clone() };
            let first = episode;
            let runs = (0..role.count).map(|k| {
                // Distinct from every other episode's seeds in the group (episode `i` has `s + i`).
                let seed = sampling.seed.map(|s| s.wrapping_add((first + k as u64 + 1) << 32));
                let sampling = SamplingParams { seed, ..sampling.clone() };
                let (ctx, role_task, id) = (&ctx.roles[r], &role_task, format!("{id}/{}#{k}", role.name));
                async move { env.env.episode(ctx, role_task, id, &sampling).await }
            });
            episode += role.count as u64;
            let mut ran: Vec<Trajectory> =
                futures::future::join_all(runs).await.into_iter().collect::<Result<Vec<_>, _>>()?.concat();
            for t in &mut ran {
                t.stats.role = Some(role.name.clone());
                if let Some(select) = &role.select {
                    let text = last_turn(ctx, t)?;
                    let candidates = outputs.get(select.from.as_str()).map_or(&[][..], Vec::as_slice);
                    let picked = env.select.as_ref().and_then(|re| pick(re, &text, candidates));
                    t.reward = picked.map_or(0.0, |o| o.reward);
                }
            }
            let own = ran
                .iter()
                .filter(|t| t.status != Status::Aborted)
                .map(|t| Ok(Output { text: last_turn(ctx, t)?, reward: t.reward }))
                .collect::<Result<Vec<_>, RolloutError>>()?;
            outputs.insert(&role.name, own);
            last_ran = r + 1 == self.roles.len();
            trajectories.push(ran);
        }
        let last = trajectories.last().filter(|_| last_ran);
        let rewards: Vec<f64> =
            last.into_iter().flatten().filter(|t| t.status != Status::Aborted).map(|t| t.reward).collect();
        let outcome = match (last_ran, rewards.is_empty()) {
            (false, _) => Some(0.0),
            (true, true) => None,
            (true, false) => Some(rewards.iter().sum::<f64>() / rewards.len() as f64),
        };
        let sharing = self.config.reward_sharing;
        let mut trajectories: Vec<Trajectory> = trajectories.into_iter().flatten().collect();
        match outcome {
            Some(outcome) => {
                trajectories.iter_mut().for_each(|t| t.reward = sharing.share(t.reward, outcome))
            }
            None if sharing.uses_outcome() => {
                tracing::warn!(task = %task.id, "every episode of the last role aborted; the workflow's episode aborted");
                trajectories.iter_mut().for_each(|t| t.status = Status::Aborted);
            }
            None => {}
        }
        Ok(trajectories)
    }
}

impl Environment for WorkflowEnv {
    fn name(&self) -> &'static str {
        "workflow"
    }

    fn episode<'a>(
        &'a self,
        ctx: &'a Context,
        task: &'a Task,
        episode_id: String,
        sampling: &'a SamplingParams,
    ) -> BoxFuture<'a, Result<Vec<Trajectory>, RolloutError>> {
        Box::pin(self.run(ctx, task, episode_id, sampling))
    }
}

/// The question of `role`: its input with `{question}` and the earlier roles' outputs filled in
/// (in one pass, so filled text is never read again); `None` when it names a role without
/// outputs.
fn input(role: &Role, question: &str, outputs: &HashMap<&str, Vec<Output>>) -> Option<String> {
    let value = |name: &str| -> Result<Option<String>, ()> {
        if name == "question" {
            return Ok(Some(question.to_owned()));
        }
        let (role, count) = match outputs.get(name) {
            Some(o) => (o, false),
            None => match name.strip_suffix("_count").and_then(|n| outputs.get(n)) {
                Some(o) => (o, true),
                None => return Ok(None),
            },
        };
        if role.is_empty() {
            return Err(());
        }
        Ok(Some(if count {
            role.len().to_string()
        } else {
            let sections: Vec<String> = role
                .iter()
                .enumerate()
                .map(|(i, o)| format!("#### Solution {}\n{}\n\n---", i + 1, o.text))
                .collect();
            sections.join("\n")
        }))
    };
    fill(&role.input, value).ok()
}

/// The text of `t`'s last model turn, after any `</think>`.
fn last_turn(ctx: &Context, t: &Trajectory) -> Result<String, RolloutError> {
    let text = ctx.tokenizer.decode(t.last_turn(), true)?;
    Ok(text.rsplit_once("</think>").map_or(text.as_str(), |(_, after)| after).trim().to_owned())
}

/// The output `text` picks: the first match of `pattern`, its first group the output's number
/// from 1.
fn pick<'a>(pattern: &Regex, text: &str, outputs: &'a [Output]) -> Option<&'a Output> {
    let number: usize = pattern.captures(text)?.get(1)?.as_str().trim().parse().ok()?;
    outputs.get(number.checked_sub(1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Reply, ScriptedEngine};
    use kart_core::config::env::EnvConfig;
    use kart_core::config::rollout::ContextConfig;
    use kart_core::engine::EngineError;
    use kart_tokenizer::Tokenizer;
    use serde_json::json;

    /// Solvers (offered the calculator) answer 42, 41, 42 by call; rewriters answer 42 and 7;
    /// the selector answers `selector(prompt)`.
    fn workflow(sharing: serde_json::Value) -> WorkflowConfig {
        let agent = |functions: serde_json::Value, answer: &str| json!({"kind": "tools", "functions": functions, "answer": answer, "score": "math"});
        serde_json::from_value(json!({
            "roles": [
                {"name": "solver", "count": 3, "input": "SOLVE {question}", "env": agent(json!([{"builtin": "calculator"}]), "boxed")},
                {"name": "rewriter", "count": 2, "env": agent(json!([]), "boxed"),
                 "input": "REWRITE {question} from {solver_count} solutions:\n{solver}"},
                {"name": "selector", "input": "SELECT {question}\n{rewriter}", "select": {"from": "rewriter"},
                 "env": agent(json!([]), "content")}
            ],
            "reward_sharing": sharing
        }))
        .unwrap()
    }

    struct Run {
        trajectories: Vec<Trajectory>,
        prompts: Arc<std::sync::Mutex<Vec<String>>>,
    }

    async fn run(config: &WorkflowConfig, selector: fn(&str) -> Reply, solvers_fail: bool) -> Run {
        let dir = tempfile::tempdir().unwrap();
        kart_testing::tool_calling_model(dir.path());
        let prompts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = prompts.clone();
        let counts = Arc::new(std::sync::Mutex::new(HashMap::<&'static str, usize>::new()));
        let engine = ScriptedEngine::new(Tokenizer::load(dir.path()).unwrap(), move |context, _| {
            seen.lock().unwrap().push(context.to_owned());
            let role = ["SOLVE", "REWRITE", "SELECT"].into_iter().find(|r| context.contains(r)).unwrap();
            let k = {
                let mut counts = counts.lock().unwrap();
                let k = counts.entry(role).or_default();
                *k += 1;
                *k - 1
            };
            let text = match role {
                "SOLVE" if solvers_fail => return Reply::Fail(EngineError::Invalid("down".into())),
                "SOLVE" => ["\\boxed{42}", "\\boxed{41}", "\\boxed{42}"][k],
                "REWRITE" => ["<think>so</think>\\boxed{42}", "\\boxed{7}"][k],
                _ => return selector(context),
            };
            Reply::Text(format!("{text}<|im_end|>"))
        });
        let env = EnvConfig::Workflow(config.clone());
        let ctx = Context::build(&ContextConfig::default(), &env, Arc::new(engine), dir.path(), None)
            .await
            .unwrap();
        let task = Task {
            id: "q".into(),
            messages: None,
            prompt: Some("What is 6 times 7?".into()),
            ground_truth: vec!["42".into()],
            data_source: "math".into(),
            tools: None,
        };
        let trajectories = WorkflowEnv::new(config)
            .episode(
                &ctx,
                &task,
                "q#0".into(),
                &SamplingParams { seed: Some(5), ..SamplingParams::default() },
            )
            .await
            .unwrap();
        Run { trajectories, prompts }
    }

    /// Picks the rewritten solution that answers 42.
    fn picks_42(context: &str) -> Reply {
        let i = if context.contains("#### Solution 1\n\\boxed{42}") { 1 } else { 2 };
        Reply::Text(format!("Both answer; Judgment: {i}<|im_end|>"))
    }

    fn roles(run: &Run) -> Vec<(&str, &str, f64)> {
        let mut roles: Vec<_> = run
            .trajectories
            .iter()
            .map(|t| (t.stats.role.as_deref().unwrap(), t.id.as_str(), t.reward))
            .collect();
        roles.sort_by(|a, b| a.1.cmp(b.1));
        roles
    }

    #[tokio::test]
    async fn roles_run_in_order_on_earlier_outputs_and_share_the_outcome() {
        let run =
            run(&workflow(json!({"kind": "scale", "success": 1.5, "failure": 0.5})), picks_42, false).await;
        let mut rewards: Vec<(&str, f64)> = roles(&run).iter().map(|&(role, _, r)| (role, r)).collect();
        rewards.sort_by(|a, b| a.0.cmp(b.0).then(a.1.total_cmp(&b.1)));
        // Every reward scaled by 1.5: the selector picked the right rewrite.
        let expected = [
            ("rewriter", 0.0),
            ("rewriter", 1.5),
            ("selector", 1.5),
            ("solver", 0.0),
            ("solver", 1.5),
            ("solver", 1.5),
        ];
        assert_eq!(rewards, expected);
        let ids: Vec<&str> = roles(&run).iter().map(|r| r.1).collect();
        assert_eq!(
            ids,
            [
                "q#0/rewriter#0",
                "q#0/rewriter#1",
                "q#0/selector#0",
                "q#0/solver#0",
                "q#0/solver#1",
                "q#0/solver#2"
            ]
        );
        assert!(run.trajectories.iter().all(|t| t.prompt_id == "q" && t.status == Status::Completed));

        let prompts = run.prompts.lock().unwrap();
        let of = |role: &str| prompts.iter().filter(|p| p.contains(role)).cloned().collect::<Vec<_>>();
        assert_eq!((of("SOLVE").len(), of("REWRITE").len(), of("SELECT").len()), (3, 2, 1));
        assert!(of("SOLVE")[0].contains("\"name\": \"calculator\""), "solvers are offered their function");
        let rewrite = &of("REWRITE")[0];
        assert!(!rewrite.contains("calculator"), "the rewriter has no functions: {rewrite}");
        assert!(
            rewrite.contains("REWRITE What is 6 times 7? from 3 solutions:\n#### Solution 1\n\\boxed{4"),
            "{rewrite}"
        );
        assert_eq!(rewrite.matches("\\boxed{42}\n\n---").count(), 2, "{rewrite}");
        let select = &of("SELECT")[0];
        assert!(
            select.contains("\\boxed{42}\n\n---") && !select.contains("<think>"),
            "after </think>: {select}"
        );
    }

    #[tokio::test]
    async fn a_wrong_or_unreadable_pick_scores_zero_and_fails_the_outcome() {
        fn picks_7(context: &str) -> Reply {
            picks_42(&context.replace("{42}", "{x}").replace("{7}", "{42}"))
        }
        fn rambles(_: &str) -> Reply {
            Reply::Text("The second one.<|im_end|>".into())
        }
        for selector in [picks_7 as fn(&str) -> Reply, rambles] {
            let run =
                run(&workflow(json!({"kind": "scale", "success": 1.5, "failure": 0.5})), selector, false)
                    .await;
            let selected =
                run.trajectories.iter().find(|t| t.stats.role.as_deref() == Some("selector")).unwrap();
            assert_eq!(selected.reward, 0.0);
            let mut solvers: Vec<f64> =
                run.trajectories.iter().filter(|t| t.id.contains("solver")).map(|t| t.reward).collect();
            solvers.sort_by(f64::total_cmp);
            assert_eq!(solvers, [0.0, 0.5, 0.5], "a failed outcome scales by 0.5");
        }
        let own = run(&workflow(json!({"kind": "own"})), rambles, false).await;
        let mut solvers: Vec<f64> =
            own.trajectories.iter().filter(|t| t.id.contains("solver")).map(|t| t.reward).collect();
        solvers.sort_by(f64::total_cmp);
        assert_eq!(solvers, [0.0, 1.0, 1.0], "`own` keeps each role's reward");
        let mix = run(&workflow(json!({"kind": "mix", "alpha": 0.5})), picks_42, false).await;
        assert!(
            mix.trajectories.iter().filter(|t| t.id.contains("rewriter")).any(|t| t.reward == 0.5),
            "(0 + 1) / 2"
        );
    }

    #[tokio::test]
    async fn later_roles_skip_without_outputs_and_an_aborted_outcome_aborts_the_episode() {
        // No solver completes: the rewriter and selector do not run, and the outcome is 0.
        let run_ = run(&workflow(json!({"kind": "final"})), picks_42, true).await;
        assert_eq!(run_.trajectories.len(), 3);
        assert!(run_.trajectories.iter().all(|t| t.status == Status::Aborted && t.reward == 0.0));
        assert!(!run_.prompts.lock().unwrap().iter().any(|p| p.contains("REWRITE")));

        // The selector aborts: the outcome is unknown.
        fn down(_: &str) -> Reply {
            Reply::Fail(EngineError::Invalid("down".into()))
        }
        let aborted = run(&workflow(json!({"kind": "final"})), down, false).await;
        assert_eq!(aborted.trajectories.len(), 6);
        assert!(
            aborted.trajectories.iter().all(|t| t.status == Status::Aborted),
            "nothing trains on a made-up outcome"
        );
        let own = run(&workflow(json!({"kind": "own"})), down, false).await;
        let completed = own.trajectories.iter().filter(|t| t.status == Status::Completed).count();
        assert_eq!(completed, 5, "`own` needs no outcome: only the selector aborted");
    }

    #[tokio::test]
    async fn a_context_of_another_workflow_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        kart_testing::tool_calling_model(dir.path());
        let engine =
            ScriptedEngine::new(Tokenizer::load(dir.path()).unwrap(), |_, _| Reply::Text(String::new()));
        let tools = serde_json::from_value(json!({"kind": "tools", "functions": []})).unwrap();
        let ctx = Context::build(&ContextConfig::default(), &tools, Arc::new(engine), dir.path(), None)
            .await
            .unwrap();
        let task = Task {
            id: "q".into(),
            prompt: Some("q".into()),
            ..serde_json::from_value(json!({"id": "q", "ground_truth": []})).unwrap()
        };
        let err = WorkflowEnv::new(&workflow(json!({"kind": "own"})))
            .episode(&ctx, &task, "q#0".into(), &SamplingParams::default())
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "workflow: the context was built for 0 roles; this workflow has 3");
    }
}
