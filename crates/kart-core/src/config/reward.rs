//! Rewards beyond an environment's own rule: services that score finished trajectories, combined
//! with the rule-based reward by weights, in every environment.
//!
//! ```yaml
//! reward:
//!   rule_weight: 0.5
//!   services:
//!     - http: {url: http://rm.scoring.svc:8080/score, weight: 0.5}
//!     - judge: {url: http://judge.llm.svc:8000/v1, model: Qwen2.5-72B-Instruct, weight: 0.5}
//! ```
//!
//! A service that fails for good (after its retries) aborts the trajectory: it is never trained
//! on as if it had scored 0.

use super::ConfigError;
use super::functions::CallLimits;
use serde::{Deserialize, Serialize};

/// The rule-based reward's weight and the reward services.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// Weight of the environment's own reward in the sum.
    pub rule_weight: f64,
    /// Services whose scores are added, each times its weight.
    pub services: Vec<RewardService>,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig { rule_weight: 1.0, services: Vec::new() }
    }
}

/// A reward service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RewardService {
    /// An HTTP endpoint scoring batches of trajectories.
    Http(HttpReward),
    /// An LLM judging the answer through an OpenAI-compatible chat endpoint.
    Judge(Judge),
}

/// An HTTP reward service: `POST {"trajectories": [{id, prompt_id, data_source, ground_truth,
/// prompt, response, answer}]}` answered by `{"scores": [{"score": 0.7, "metrics": {...}}]}`,
/// one score per trajectory in order (a bare number is a score without metrics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpReward {
    /// A name for metrics (`reward/{name}`); default `http`.
    #[serde(default = "http_name")]
    pub name: String,
    pub url: String,
    /// Weight of its score in the sum.
    #[serde(default = "one")]
    pub weight: f64,
    /// Most trajectories per request.
    #[serde(default = "batch_size")]
    pub batch_size: usize,
    /// How long a trajectory waits for others to fill its batch, in milliseconds.
    #[serde(default = "batch_wait_ms")]
    pub batch_wait_ms: u64,
    #[serde(flatten)]
    pub limits: CallLimits,
}

/// An LLM judge, as ASearcher scores open-ended answers: the prompt template filled with the
/// question, the golden answers and the trajectory's answer, sent to `{url}/chat/completions`;
/// the reply's first word decides (`yes` scores 1, `no` 0; anything else fails the call).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Judge {
    /// A name for metrics (`reward/{name}`); default `judge`.
    #[serde(default = "judge_name")]
    pub name: String,
    /// The OpenAI-compatible API's base URL, e.g. `http://vllm:8000/v1`.
    pub url: String,
    /// The model the endpoint serves.
    pub model: String,
    /// The environment variable holding the API key, sent as a bearer token (none: no header).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The prompt, with `{question}`, `{ground_truth}` and `{answer}` filled in.
    #[serde(default = "judge_prompt")]
    pub prompt: String,
    /// Weight of its score in the sum.
    #[serde(default = "one")]
    pub weight: f64,
    /// Most tokens of the verdict.
    #[serde(default = "judge_max_tokens")]
    pub max_tokens: u32,
    #[serde(flatten)]
    pub limits: CallLimits,
}

/// The judge's default prompt.
pub const JUDGE_PROMPT: &str = "You are grading the answer to a question against its golden \
    answers.\n\nQuestion: {question}\nGolden answers: {ground_truth}\nAnswer to grade: {answer}\n\n\
    Does the answer to grade mean the same as one of the golden answers? Reply with one word: yes \
    or no.";

fn http_name() -> String {
    "http".into()
}

fn judge_name() -> String {
    "judge".into()
}

fn one() -> f64 {
    1.0
}

fn batch_size() -> usize {
    32
}

fn batch_wait_ms() -> u64 {
    20
}

fn judge_prompt() -> String {
    JUDGE_PROMPT.into()
}

fn judge_max_tokens() -> u32 {
    8
}

impl RewardService {
    /// The name its score is reported under.
    pub fn name(&self) -> &str {
        match self {
            RewardService::Http(h) => &h.name,
            RewardService::Judge(j) => &j.name,
        }
    }

    /// Its weight in the sum.
    pub fn weight(&self) -> f64 {
        match self {
            RewardService::Http(h) => h.weight,
            RewardService::Judge(j) => j.weight,
        }
    }
}

impl RewardConfig {
    /// Checks the settings, naming the bad field (`services[i].…`) and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.rule_weight.is_finite() {
            return Err(ConfigError::new("rule_weight", self.rule_weight, "must be a finite number"));
        }
        for (i, service) in self.services.iter().enumerate() {
            let at = |field: &str| format!("services[{i}].{field}");
            let (kind, url, limits) = match service {
                RewardService::Http(h) => ("http", &h.url, &h.limits),
                RewardService::Judge(j) => ("judge", &j.url, &j.limits),
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::new(
                    at(&format!("{kind}.url")),
                    url,
                    "must be an http:// or https:// URL",
                ));
            }
            if !service.weight().is_finite() {
                return Err(ConfigError::new(
                    at(&format!("{kind}.weight")),
                    service.weight(),
                    "must be finite",
                ));
            }
            if !(limits.timeout_secs.is_finite() && limits.timeout_secs > 0.0) {
                let field = at(&format!("{kind}.timeout_secs"));
                return Err(ConfigError::new(field, limits.timeout_secs, "must be positive"));
            }
            if limits.concurrency == 0 {
                return Err(ConfigError::new(at(&format!("{kind}.concurrency")), 0, "must be at least 1"));
            }
            match service {
                RewardService::Http(h) if h.batch_size == 0 => {
                    return Err(ConfigError::new(at("http.batch_size"), 0, "must be at least 1"));
                }
                RewardService::Judge(j) if !j.prompt.contains("{answer}") => {
                    return Err(ConfigError::new(at("judge.prompt"), &j.prompt, "must contain {answer}"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_read_with_defaults_and_bad_ones_name_their_field() {
        let config: RewardConfig = serde_json::from_value(serde_json::json!({
            "rule_weight": 0.5,
            "services": [{"http": {"url": "http://rm:8080/score"}},
                         {"judge": {"url": "http://judge:8000/v1", "model": "m", "weight": 0.5}}]
        }))
        .unwrap();
        let RewardService::Http(http) = &config.services[0] else { panic!("{config:?}") };
        assert_eq!((http.name.as_str(), http.weight, http.batch_size), ("http", 1.0, 32));
        let RewardService::Judge(judge) = &config.services[1] else { panic!("{config:?}") };
        assert_eq!(
            (judge.name.as_str(), judge.prompt.as_str(), judge.max_tokens),
            ("judge", JUDGE_PROMPT, 8)
        );
        assert_eq!(config.validate(), Ok(()));
        let mut bad = config.clone();
        bad.services[1] = RewardService::Judge(Judge { prompt: "Grade it.".into(), ..judge.clone() });
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.starts_with("services[1].judge.prompt = Grade it."), "{e}");
        let mut bad = config.clone();
        bad.services[0] = RewardService::Http(HttpReward { url: "rm:8080".into(), ..http.clone() });
        assert!(bad.validate().unwrap_err().to_string().starts_with("services[0].http.url = rm:8080"));
    }
}
