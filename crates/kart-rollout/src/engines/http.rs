//! What the HTTP engines ([`super::sglang`], [`super::vllm`]) share: a JSON client with a per-request
//! timeout that sorts failures into [`EngineError`]s, and the policy version an engine was last told.
//!
//! - unreachable server, timeout, 5xx, 408, 429, unreadable or malformed body: `Unavailable`
//!   (retryable), naming the engine and the URL;
//! - any other 4xx: `Invalid`, with the server's own message.

use kart_core::engine::EngineError;
use serde_json::Value;
use std::error::Error as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A JSON-over-HTTP client for one inference server.
#[derive(Debug)]
pub(super) struct HttpEngine {
    client: reqwest::Client,
    engine: &'static str,
    base: String,
    version: AtomicI64,
}

impl HttpEngine {
    /// A client for the `engine` server at `base_url` (trailing slashes ignored), at policy version 0.
    pub fn new(engine: &'static str, base_url: &str, timeout: Duration) -> Self {
        let client =
            reqwest::Client::builder().timeout(timeout).build().expect("a default HTTP client builds");
        HttpEngine {
            client,
            engine,
            base: base_url.trim_end_matches('/').to_string(),
            version: AtomicI64::new(0),
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The policy version last recorded.
    pub fn version(&self) -> i64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Records the policy version the server's weights now have.
    pub fn set_version(&self, version: i64) {
        self.version.store(version, Ordering::SeqCst);
    }

    /// POSTs `payload` to `{base}{path}` and returns the JSON body of a successful answer.
    pub async fn post(&self, path: &str, payload: &Value) -> Result<Value, EngineError> {
        self.send(self.client.post(format!("{}{path}", self.base)).json(payload)).await
    }

    /// POSTs `payload` to `{base}{path}`, a route whose successful answer is plain text (vLLM's
    /// LoRA routes): only its status counts.
    pub async fn post_for_status(&self, path: &str, payload: &Value) -> Result<(), EngineError> {
        self.answer(self.client.post(format!("{}{path}", self.base)).json(payload)).await.map(drop)
    }

    /// GETs `{base}{path}` and returns the JSON body of a successful answer.
    pub async fn get(&self, path: &str) -> Result<Value, EngineError> {
        self.send(self.client.get(format!("{}{path}", self.base))).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, EngineError> {
        let (url, body) = self.answer(request).await?;
        serde_json::from_slice(&body)
            .map_err(|e| self.unavailable(&url, format!("malformed JSON response: {e}")))
    }

    /// The request's method and URL, and the body of its successful answer.
    async fn answer(&self, request: reqwest::RequestBuilder) -> Result<(String, Vec<u8>), EngineError> {
        let (client, request) = request.build_split();
        let request = request.map_err(|e| self.unavailable(&self.base, describe(e)))?;
        let url = format!("{} {}", request.method(), request.url());
        let response = client.execute(request).await.map_err(|e| self.unavailable(&url, describe(e)))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| self.unavailable(&url, describe(e)))?;
        if status.is_success() {
            return Ok((url, body.to_vec()));
        }
        let reason = format!("answered {status}: {}", error_message(&body));
        let transient = status.is_server_error()
            || status == reqwest::StatusCode::REQUEST_TIMEOUT
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
        Err(if transient {
            self.unavailable(&url, reason)
        } else {
            EngineError::Invalid(format!("{} at {url} {reason}", self.engine))
        })
    }

    /// The `id`s of `GET /v1/models` (the OpenAI-compatible list both servers have).
    pub async fn models(&self) -> Result<Vec<String>, EngineError> {
        let answer = self.get("/v1/models").await?;
        let url = format!("GET {}/v1/models", self.base);
        let data = answer["data"]
            .as_array()
            .ok_or_else(|| self.unavailable(&url, "malformed response: no `data` list"))?;
        Ok(data.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
    }

    /// A retryable failure of the request `what` (method and URL).
    pub fn unavailable(&self, what: &str, reason: impl std::fmt::Display) -> EngineError {
        EngineError::Unavailable { engine: self.engine.into(), reason: format!("{what}: {reason}") }
    }

    /// A successful answer to the POST to `url` that lacks what kart needs (`what` names the
    /// field).
    pub fn malformed(&self, url: &str, what: impl std::fmt::Display) -> EngineError {
        self.unavailable(&format!("POST {url}"), format!("malformed response: {what}"))
    }

    /// The engine's name (`sglang`, `vllm`).
    pub fn name(&self) -> &'static str {
        self.engine
    }
}

/// A transport error with its causes (`connection refused`, `operation timed out`, …).
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The message of an error body: FastAPI/OpenAI style (`error.message`, `message`, `detail`) or, failing
/// that, the body's text (shortened).
fn error_message(body: &[u8]) -> String {
    const MAX_CHARS: usize = 500;
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        let found = [&json["error"]["message"], &json["message"], &json["detail"], &json["error"]]
            .into_iter()
            .find(|v| !v.is_null());
        if let Some(value) = found {
            return value.as_str().map_or_else(|| value.to_string(), str::to_string);
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None if text.is_empty() => "(empty body)".into(),
        None => text.to_string(),
    }
}

/// An `axum` server on a free local port, for the engines' fake servers in tests.
#[cfg(test)]
pub(super) async fn serve(router: axum::Router) -> String {
    // Bound before the server task starts: connections queue in the backlog until it accepts them,
    // so the server is ready as soon as this returns (no waiting, no polling).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a local port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("fake server runs") });
    format!("http://{addr}")
}

/// A local URL where nothing listens: a port reserved for this test process that nobody binds.
#[cfg(test)]
pub(super) fn dead_url() -> String {
    format!("http://127.0.0.1:{}", kart_testing::free_port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_found_in_every_style() {
        let openai =
            br#"{"error": {"message": "model `m` does not exist", "type": "NotFoundError", "code": 404}}"#;
        assert_eq!(error_message(openai), "model `m` does not exist");
        let vllm_old = br#"{"object": "error", "message": "too long", "type": "BadRequestError", "param": null, "code": 400}"#;
        assert_eq!(error_message(vllm_old), "too long");
        assert_eq!(error_message(br#"{"detail": "Not Found"}"#), "Not Found");
        assert_eq!(error_message(b"  Internal Server Error\n"), "Internal Server Error");
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(error_message(&vec![b'x'; 600]).chars().count(), 501);
    }

    #[tokio::test]
    async fn unreachable_servers_are_unavailable_naming_the_url() {
        let url = dead_url();
        let http = HttpEngine::new("sglang", &format!("{url}/"), Duration::from_secs(5));
        match http.post("/generate", &Value::Null).await {
            Err(EngineError::Unavailable { engine, reason }) => {
                assert_eq!(engine, "sglang");
                assert!(reason.contains(&format!("{url}/generate")), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
