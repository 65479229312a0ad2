//! A function served by an HTTP endpoint: each call `POST`s the arguments as a JSON object and
//! the response body is the result (a JSON string body is unquoted, other JSON is kept as text).
//! Calls are bounded by a timeout, retried on connection failures, timeouts and 5xx answers with
//! exponential backoff, and limited to a number in flight.

use super::schema;
use crate::post::client;
use crate::post::post_json;
use kart_core::config::functions::{CallLimits, HttpFunction as HttpFunctionConfig};
use kart_core::tool::{CallFailed, Called, Function};
use reqwest::header::HeaderMap;
use serde_json::Value;
use tokio::sync::Semaphore;

/// A function whose calls are HTTP requests.
pub struct HttpFunction {
    schema: Value,
    url: String,
    client: reqwest::Client,
    limits: CallLimits,
    slots: Semaphore,
}

impl HttpFunction {
    /// The function `config` describes (validated).
    pub fn new(config: &HttpFunctionConfig) -> Self {
        let client = client(config.limits.timeout_secs);
        HttpFunction {
            schema: schema(&config.name, &config.description, config.parameters.clone()),
            url: config.url.clone(),
            client,
            limits: config.limits.clone(),
            slots: Semaphore::new(config.limits.concurrency),
        }
    }
}

impl Function for HttpFunction {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a> {
        Box::pin(async move {
            let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
            let text = post_json(&self.client, &self.url, arguments, HeaderMap::new(), &self.limits.retry)
                .await
                .map_err(|e| CallFailed(format!("{}: {e}", self.name())))?;
            Ok(match serde_json::from_str::<Value>(&text) {
                Ok(Value::String(s)) => s,
                _ => text,
            })
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kart_core::config::retry::RetryPolicy;
    use serde_json::json;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    /// An HTTP server answering each request with the next of `replies` (status, body), recording
    /// the bodies it was sent.
    pub(crate) fn serve(replies: Vec<(u16, &'static str)>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/call", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for (stream, (status, body)) in listener.incoming().zip(replies) {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut request = vec![0; length];
                reader.read_exact(&mut request).unwrap();
                log.lock().unwrap().push(String::from_utf8(request).unwrap());
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(reply.as_bytes()).unwrap();
            }
        });
        (url, seen)
    }

    fn function(url: &str, retries: u32) -> HttpFunction {
        HttpFunction::new(&HttpFunctionConfig {
            name: "weather".into(),
            description: "Weather today.".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            url: url.into(),
            limits: CallLimits { retry: RetryPolicy { retries, backoff_ms: 1 }, ..CallLimits::default() },
        })
    }

    #[tokio::test]
    async fn arguments_are_posted_and_the_body_is_the_result() {
        let (url, seen) = serve(vec![(200, "\"sunny, 21 C\""), (200, "{\"temp\": 21}")]);
        let weather = function(&url, 0);
        assert_eq!(weather.schema()["function"]["name"], "weather");
        assert_eq!(weather.call(&json!({"city": "Paris"})).await.unwrap(), "sunny, 21 C");
        assert_eq!(weather.call(&json!({"city": "Oslo"})).await.unwrap(), "{\"temp\": 21}");
        assert_eq!(*seen.lock().unwrap(), ["{\"city\":\"Paris\"}", "{\"city\":\"Oslo\"}"]);
    }

    #[tokio::test]
    async fn server_errors_are_retried_and_client_errors_are_not() {
        let (url, seen) = serve(vec![(503, "busy"), (502, "busy"), (200, "\"ok\"")]);
        assert_eq!(function(&url, 2).call(&json!({})).await.unwrap(), "ok");
        assert_eq!(seen.lock().unwrap().len(), 3);
        let (url, seen) = serve(vec![(400, "no city"), (200, "\"ok\"")]);
        let err = function(&url, 2).call(&json!({})).await.unwrap_err();
        assert_eq!(err.0, format!("weather: {url} answered 400 Bad Request: no city"));
        assert_eq!(seen.lock().unwrap().len(), 1, "a 4xx is the caller's fault: not retried");
        let (url, _) = serve(vec![(500, "down"), (500, "still down")]);
        let err = function(&url, 1).call(&json!({})).await.unwrap_err();
        assert_eq!(err.0, format!("weather: {url} answered 500 Internal Server Error: still down"));
    }

    /// A server holding each request until `until` requests have been held at once, or for
    /// `hold`, reporting the most it held at once.
    async fn counting_server(
        until: usize,
        hold: std::time::Duration,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/call", listener.local_addr().unwrap());
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (reached, _) = tokio::sync::watch::channel(0usize);
        let seen = most.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let (now, most, reached) = (now.clone(), most.clone(), reached.clone());
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !String::from_utf8_lossy(&request).contains("\r\n\r\n{") {
                        let n = stream.read(&mut buf).await.unwrap();
                        request.extend_from_slice(&buf[..n]);
                    }
                    let mut waiting = reached.subscribe();
                    let held = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(held, Ordering::SeqCst);
                    reached.send_modify(|m| *m = (*m).max(held));
                    let _ = tokio::time::timeout(hold, waiting.wait_for(|m| *m >= until)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    let reply = "HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\n\"ok\"";
                    stream.write_all(reply.as_bytes()).await.unwrap();
                });
            }
        });
        (url, seen)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_in_flight_stay_within_the_concurrency() {
        use std::sync::atomic::Ordering;
        use std::time::Duration;
        // Each request is held until the three are in flight together: briefly when only one may
        // be, else as long as a loaded machine may take to send them all.
        for (concurrency, hold) in [(1, Duration::from_millis(100)), (3, Duration::from_secs(300))] {
            let (url, most) = counting_server(3, hold).await;
            let mut config = HttpFunctionConfig {
                name: "slow".into(),
                description: String::new(),
                parameters: json!({"type": "object"}),
                url,
                limits: CallLimits { timeout_secs: 600.0, ..CallLimits::default() },
            };
            config.limits.concurrency = concurrency;
            let slow = HttpFunction::new(&config);
            let arguments = json!({});
            let calls = futures::future::join_all((0..3).map(|_| slow.call(&arguments))).await;
            assert!(calls.iter().all(|c| c.as_deref() == Ok("ok")), "{calls:?}");
            assert_eq!(most.load(Ordering::SeqCst), concurrency, "concurrency {concurrency}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_fails_the_call() {
        // A reserved port nothing listens on.
        let port = kart_testing::free_port();
        let err = function(&format!("http://127.0.0.1:{port}/call"), 1).call(&json!({})).await.unwrap_err();
        assert!(
            err.0.starts_with("weather: http://127.0.0.1") && err.0.contains("could not be reached"),
            "{err}"
        );
    }
}
