//! JSON `POST`s to the services agents and rewards rely on (function endpoints, reward services,
//! LLM judges): retried with exponential backoff when the service could not be reached, timed
//! out or answered 5xx; a 4xx answer is the caller's fault and is not retried.

use kart_core::config::retry::RetryPolicy;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// Longest response body kept.
const MAX_BODY_BYTES: usize = 1 << 20;

/// Why a `POST` failed for good.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("{url} could not be reached: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{url} answered {status}: {body}")]
    Status { url: String, status: reqwest::StatusCode, body: String },
}

impl PostError {
    fn retryable(&self) -> bool {
        match self {
            PostError::Unreachable { .. } => true,
            PostError::Status { status, .. } => status.is_server_error(),
        }
    }
}

/// An HTTP client whose requests time out after `timeout_secs` (a validated, positive number).
pub fn client(timeout_secs: f64) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs_f64(timeout_secs))
        .build()
        .expect("a default HTTP client builds")
}

/// `POST`s `body` to `url` (with `headers`), retrying per `retry`; the text of the 2xx answer's
/// body (cut at 1 MiB).
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: HeaderMap,
    retry: &RetryPolicy,
) -> Result<String, PostError> {
    let mut delays = retry.backoff().take(retry.retries as usize);
    loop {
        match attempt(client, url, body, headers.clone()).await {
            Err(e) if e.retryable() => match delays.next() {
                Some(delay) => {
                    tracing::debug!(url, error = %e, "request failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                None => return Err(e),
            },
            other => return other,
        }
    }
}

async fn attempt(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: HeaderMap,
) -> Result<String, PostError> {
    let unreachable = |source| PostError::Unreachable { url: url.to_owned(), source };
    let response = client.post(url).headers(headers).json(body).send().await.map_err(unreachable)?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(unreachable)?;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_BODY_BYTES)]).into_owned();
    if !status.is_success() {
        return Err(PostError::Status {
            url: url.to_owned(),
            status,
            body: text.trim().chars().take(500).collect(),
        });
    }
    Ok(text)
}
