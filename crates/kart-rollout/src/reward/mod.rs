//! Reward services applied to finished trajectories in every environment ([`Rewards`]): an
//! HTTP scorer taking batches ([`http`]) and an LLM judge ([`judge`]), their scores added to the
//! environment's own reward, each times its weight (`reward` of the context config).
//!
//! Each trajectory's scores are kept in its statistics (`reward_scores`: `rule`, each service's
//! name, and `{name}/{metric}` for the metrics a scorer returns). A service that fails for good
//! aborts the trajectory; its reward is never a silent zero.

pub mod http;
pub mod judge;

use kart_core::config::reward::{RewardConfig, RewardService};
use serde::Serialize;
use std::collections::BTreeMap;

/// What a reward service scores: a finished trajectory as text.
#[derive(Debug, Clone, Serialize)]
pub struct Scoring {
    pub id: String,
    pub prompt_id: String,
    pub data_source: String,
    pub ground_truth: Vec<String>,
    /// The question: the task's `prompt`, or its last user message.
    pub question: String,
    /// The prompt's text.
    pub prompt: String,
    /// Everything after the prompt (model turns and observations), special tokens left out.
    pub response: String,
    /// The final answer: the last `<answer>…</answer>` of the response, else its last model turn.
    pub answer: String,
}

/// One service's verdict: its score and the metrics it reported.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Score {
    pub score: f64,
    pub metrics: BTreeMap<String, f64>,
}

/// A reward service that failed for good.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reward service `{service}`: {reason}")]
pub struct RewardError {
    pub service: String,
    pub reason: String,
}

/// The reward services of a context, with the weight of the rule-based reward.
pub struct Rewards {
    rule_weight: f64,
    services: Vec<(String, f64, Service)>,
}

enum Service {
    Http(http::HttpScorer),
    Judge(judge::JudgeClient),
}

/// The environment's reward alone.
impl Default for Rewards {
    fn default() -> Self {
        Rewards::new(&RewardConfig::default())
    }
}

impl Rewards {
    /// The services `config` names (validated).
    pub fn new(config: &RewardConfig) -> Self {
        let services = config
            .services
            .iter()
            .map(|s| {
                let service = match s {
                    RewardService::Http(h) => Service::Http(http::HttpScorer::new(h)),
                    RewardService::Judge(j) => Service::Judge(judge::JudgeClient::new(j)),
                };
                (s.name().to_owned(), s.weight(), service)
            })
            .collect();
        Rewards { rule_weight: config.rule_weight, services }
    }

    /// Whether the reward is the environment's alone (rule weight 1, no services).
    pub fn is_rule_only(&self) -> bool {
        self.services.is_empty() && self.rule_weight == 1.0
    }

    /// The reward of a trajectory whose environment scored it `rule`: the weighted sum, with
    /// each part by name (`rule`, each service, `{service}/{metric}`).
    pub async fn combine(
        &self,
        rule: f64,
        scoring: &Scoring,
    ) -> Result<(f64, BTreeMap<String, f64>), RewardError> {
        let mut parts = BTreeMap::from([("rule".to_owned(), rule)]);
        let mut total = self.rule_weight * rule;
        let scores = futures::future::join_all(self.services.iter().map(|(name, _, service)| async move {
            let scored = match service {
                Service::Http(s) => s.score(scoring).await,
                Service::Judge(j) => j.score(scoring).await,
            };
            scored.map_err(|reason| RewardError { service: name.clone(), reason })
        }))
        .await;
        for ((name, weight, _), score) in self.services.iter().zip(scores) {
            let score = score?;
            total += weight * score.score;
            parts.insert(name.clone(), score.score);
            parts.extend(score.metrics.into_iter().map(|(metric, v)| (format!("{name}/{metric}"), v)));
        }
        Ok((total, parts))
    }
}

impl Scoring {
    /// The answer of `response`: its last `<answer>…</answer>`, else `last_turn`.
    pub fn answer_of(response: &str, last_turn: &str) -> String {
        kart_core::reward::asearcher::extract_solution(response).unwrap_or(last_turn.trim()).to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Json;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use kart_core::config::functions::CallLimits;
    use kart_core::config::retry::RetryPolicy;
    use kart_core::config::reward::{HttpReward, JUDGE_PROMPT, Judge};
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};

    /// What the stand-in services saw: each request's body and authorization header.
    type Seen = Arc<Mutex<Vec<(Value, Option<String>)>>>;

    /// A reward service scoring each trajectory by its answer's length (and reporting it as a
    /// metric), and an OpenAI-compatible judge saying yes when the answer is among the golden
    /// ones; `/broken` answers 503.
    async fn services() -> (String, Seen) {
        async fn score(State(seen): State<Seen>, Json(body): Json<Value>) -> Json<Value> {
            let scores: Vec<Value> = body["trajectories"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let len = t["answer"].as_str().unwrap().len() as f64;
                    json!({"score": len / 10.0, "metrics": {"length": len}})
                })
                .collect();
            seen.lock().unwrap().push((body, None));
            Json(json!({"scores": scores}))
        }
        async fn judge(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Json<Value> {
            let prompt = body["messages"][0]["content"].as_str().unwrap().to_owned();
            let auth = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
            seen.lock().unwrap().push((body, auth));
            let answer = prompt.split("Answer to grade: ").nth(1).unwrap().lines().next().unwrap();
            let golden = prompt.split("Golden answers: ").nth(1).unwrap().lines().next().unwrap();
            let verdict = if golden.split(" | ").any(|g| g == answer) { "Yes." } else { "No" };
            Json(json!({"choices": [{"message": {"role": "assistant", "content": verdict}}]}))
        }
        let seen = Seen::default();
        let app = axum::Router::new()
            .route("/score", post(score))
            .route("/v1/chat/completions", post(judge))
            .route("/broken", post(|| async { StatusCode::SERVICE_UNAVAILABLE }))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, seen)
    }

    fn scoring(id: usize, answer: &str) -> Scoring {
        Scoring {
            id: format!("t{id}"),
            prompt_id: "q".into(),
            data_source: "nq".into(),
            ground_truth: vec!["Paris".into(), "City of Paris".into()],
            question: "What is the capital of France?".into(),
            prompt: "…".into(),
            response: format!("<answer>{answer}</answer>"),
            answer: answer.into(),
        }
    }

    fn limits() -> CallLimits {
        CallLimits { retry: RetryPolicy { retries: 1, backoff_ms: 1 }, ..CallLimits::default() }
    }

    fn http(url: &str, batch_size: usize) -> RewardService {
        let config = HttpReward {
            name: "rm".into(),
            url: url.into(),
            weight: 0.5,
            batch_size,
            batch_wait_ms: 200,
            limits: limits(),
        };
        RewardService::Http(config)
    }

    fn judge(url: &str) -> RewardService {
        RewardService::Judge(Judge {
            name: "judge".into(),
            url: format!("{url}/v1"),
            model: "judge-model".into(),
            api_key_env: Some("KART_TEST_JUDGE_KEY".into()),
            prompt: JUDGE_PROMPT.into(),
            weight: 2.0,
            max_tokens: 8,
            limits: limits(),
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scores_are_weighted_batched_and_kept_by_name() {
        let (url, seen) = services().await;
        // SAFETY: the only test reading this variable sets it first.
        unsafe { std::env::set_var("KART_TEST_JUDGE_KEY", "sk-test") };
        let config =
            RewardConfig { rule_weight: 0.25, services: vec![http(&format!("{url}/score"), 4), judge(&url)] };
        let rewards = Arc::new(Rewards::new(&config));
        let answers = ["Paris", "Lyon", "City of Paris", "Nice", "Marseille"];
        let results = futures::future::join_all(answers.iter().enumerate().map(|(i, a)| {
            let rewards = rewards.clone();
            async move { rewards.combine(1.0, &scoring(i, a)).await.unwrap() }
        }))
        .await;
        let (total, parts) = &results[2];
        assert_eq!(parts["rule"], 1.0);
        assert_eq!((parts["rm"], parts["rm/length"], parts["judge"]), (1.3, 13.0, 1.0));
        assert!((total - (0.25 + 0.5 * 1.3 + 2.0)).abs() < 1e-12, "{total}");
        assert_eq!(results[1].1["judge"], 0.0, "Lyon is not Paris");
        let seen = seen.lock().unwrap();
        let batches: Vec<usize> =
            seen.iter().filter_map(|(b, _)| b["trajectories"].as_array().map(Vec::len)).collect();
        assert_eq!(batches.iter().sum::<usize>(), 5);
        assert!(batches.iter().all(|&n| n <= 4) && batches.len() == 2, "batches of at most 4: {batches:?}");
        let (request, auth) = seen.iter().find(|(b, _)| b.get("model").is_some()).unwrap();
        assert_eq!(
            (request["model"].as_str(), request["temperature"].as_f64()),
            (Some("judge-model"), Some(0.0))
        );
        assert_eq!(request["max_tokens"], 8);
        assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
        let prompt = request["messages"][0]["content"].as_str().unwrap();
        assert!(
            prompt
                .contains("Question: What is the capital of France?\nGolden answers: Paris | City of Paris")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_service_is_an_error_naming_it() {
        let (url, _) = services().await;
        let config = RewardConfig { rule_weight: 1.0, services: vec![http(&format!("{url}/broken"), 1)] };
        let err = Rewards::new(&config).combine(1.0, &scoring(0, "Paris")).await.unwrap_err();
        assert_eq!(err.service, "rm");
        assert!(err.reason.contains("answered 503 Service Unavailable"), "{err}");
        let mut no_key = judge(&url);
        if let RewardService::Judge(j) = &mut no_key {
            j.api_key_env = Some("KART_TEST_UNSET_KEY".into());
        }
        let config = RewardConfig { rule_weight: 1.0, services: vec![no_key] };
        let err = Rewards::new(&config).combine(1.0, &scoring(0, "Paris")).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "reward service `judge`: the API key variable KART_TEST_UNSET_KEY is not set"
        );
    }
}
