//! An LLM judge behind an OpenAI-compatible chat endpoint (vLLM, SGLang, a hosted API): the
//! prompt template filled with the question, the golden answers and the trajectory's answer,
//! sent to `{url}/chat/completions` at temperature 0; the reply's first word is the verdict
//! (`yes` 1, `no` 0). Any other reply fails the score, naming what the judge said.

use super::{Score, Scoring};
use kart_core::config::reward::Judge;
use kart_tools::post::client;
use kart_tools::post::post_json;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// A client of one judge.
pub struct JudgeClient {
    config: Judge,
    client: reqwest::Client,
    slots: Semaphore,
}

impl JudgeClient {
    pub fn new(config: &Judge) -> Self {
        let client = client(config.limits.timeout_secs);
        JudgeClient { config: config.clone(), client, slots: Semaphore::new(config.limits.concurrency) }
    }

    /// The judge's verdict on `scoring`'s answer.
    pub async fn score(&self, scoring: &Scoring) -> Result<Score, String> {
        let c = &self.config;
        let prompt = c
            .prompt
            .replace("{question}", &scoring.question)
            .replace("{ground_truth}", &scoring.ground_truth.join(" | "))
            .replace("{answer}", &scoring.answer);
        let body = json!({
            "model": c.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_tokens": c.max_tokens,
        });
        let mut headers = HeaderMap::new();
        if let Some(var) = &c.api_key_env {
            let key = std::env::var(var).map_err(|_| format!("the API key variable {var} is not set"))?;
            let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|e| format!("{var}: {e}"))?;
            headers.insert(AUTHORIZATION, value);
        }
        let url = format!("{}/chat/completions", c.url.trim_end_matches('/'));
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let text = post_json(&self.client, &url, &body, headers, &c.limits.retry)
            .await
            .map_err(|e| e.to_string())?;
        let answer: Value =
            serde_json::from_str(&text).map_err(|e| format!("the answer is not JSON ({e})"))?;
        let reply = answer["choices"][0]["message"]["content"].as_str().ok_or_else(|| {
            format!("no choices[0].message.content in {}", text.chars().take(200).collect::<String>())
        })?;
        verdict(reply).map(|score| Score { score, metrics: Default::default() })
    }
}

/// `yes` 1, `no` 0: the reply's first word, case and punctuation aside.
fn verdict(reply: &str) -> Result<f64, String> {
    let word: String =
        reply.split_whitespace().next().unwrap_or_default().chars().filter(|c| c.is_alphanumeric()).collect();
    match word.to_lowercase().as_str() {
        "yes" => Ok(1.0),
        "no" => Ok(0.0),
        _ => Err(format!("the judge's verdict {reply:?} is neither yes nor no")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_the_first_word() {
        assert_eq!(verdict("Yes."), Ok(1.0));
        assert_eq!(verdict(" no, it differs"), Ok(0.0));
        assert_eq!(verdict("Maybe"), Err("the judge's verdict \"Maybe\" is neither yes nor no".into()));
    }
}
