//! The trainer's `/status` report (`{"phase", "step", "policy_version", "reward", "eval_em",
//! "checkpoint", "world_size"}`) and how the operator reads it.

use serde::Deserialize;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// What `kart train` reports at `/status`; missing fields are kept from the last report.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct TrainerReport {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub step: Option<u64>,
    #[serde(default)]
    pub policy_version: Option<u64>,
    #[serde(default)]
    pub reward: Option<f64>,
    #[serde(default)]
    pub eval_em: Option<f64>,
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// Trainer processes of the run (0 from a trainer that predates data parallelism).
    #[serde(default)]
    pub world_size: Option<i32>,
}

/// A failed status fetch.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {url}: {source}")]
    Http { url: String, source: reqwest::Error },
}

/// Fetches trainer reports; tests substitute a fake.
pub trait StatusSource: Send + Sync {
    /// The report at `url`.
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<TrainerReport, FetchError>> + Send + 'a>>;
}

/// Fetches over HTTP.
#[derive(Debug, Clone)]
pub struct HttpStatusSource {
    client: reqwest::Client,
}

impl HttpStatusSource {
    /// A client giving up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        HttpStatusSource {
            client: reqwest::Client::builder().timeout(timeout).build().expect("a plain HTTP client builds"),
        }
    }
}

impl StatusSource for HttpStatusSource {
    fn fetch<'a>(
        &'a self,
        url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<TrainerReport, FetchError>> + Send + 'a>> {
        Box::pin(async move {
            let http = |source| FetchError::Http { url: url.to_string(), source };
            let response =
                self.client.get(url).send().await.map_err(http)?.error_for_status().map_err(http)?;
            response.json().await.map_err(http)
        })
    }
}
