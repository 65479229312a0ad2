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
mod tests {
    use super::*;
    use kart_core::config::retry::RetryPolicy;
    use serde_json::json;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    /// An HTTP server answering each request with the next of `replies` (status, body), recording
    /// the bodies it was sent.
    fn serve(replies: Vec<(u16, &'static str)>) -> (String, Arc<Mutex<Vec<String>>>) {
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

    #[tokio::test]
    async fn an_unreachable_endpoint_fails_the_call() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let err = function(&format!("http://127.0.0.1:{port}/call"), 1).call(&json!({})).await.unwrap_err();
        assert!(
            err.0.starts_with("weather: http://127.0.0.1") && err.0.contains("could not be reached"),
            "{err}"
        );
    }
}
