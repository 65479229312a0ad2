//! The tools of an MCP server as functions, over MCP's streamable HTTP transport: JSON-RPC 2.0
//! requests `POST`ed to the server's endpoint, answered with one JSON body or an event stream.
//!
//! [`McpClient::connect`] initialises a session (`initialize`, then the `notifications/initialized`
//! notification; the `Mcp-Session-Id` and `MCP-Protocol-Version` the server gives are sent on
//! every later request), lists the tools (`tools/list`, following `nextCursor`), and returns one
//! [`McpTool`] per tool, its schema made from the tool's `inputSchema`. A call is `tools/call`;
//! its text contents are the result, and `isError` makes it a failed call. A session the server
//! forgot (404) is initialised again once.

use super::schema;
use crate::post::client;
use kart_core::config::functions::{CallLimits, McpServer};
use kart_core::tool::{CallFailed, Called, Function};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{RwLock, Semaphore};

/// The protocol version kart asks for; the server may answer with another it supports.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// Why talking to an MCP server failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("{url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url} answered {status} to `{method}`: {body}")]
    Status { url: String, method: String, status: reqwest::StatusCode, body: String },
    #[error("{url}: `{method}` failed: {message} (JSON-RPC error {code})")]
    Rpc { url: String, method: String, code: i64, message: String },
    #[error("{url}: the answer to `{method}` is not a JSON-RPC response: {reason}")]
    Protocol { url: String, method: String, reason: String },
    #[error("{url}: the server has no tool named `{name}` (it has: {have})")]
    NoSuchTool { url: String, name: String, have: String },
}

/// One session with an MCP server, shared by its tools.
pub struct McpClient {
    url: String,
    client: reqwest::Client,
    limits: CallLimits,
    slots: Semaphore,
    next_id: AtomicU64,
    /// The session id and protocol version of the current session.
    session: RwLock<Session>,
}

#[derive(Debug, Clone, Default)]
struct Session {
    id: Option<String>,
    version: Option<String>,
}

/// A tool of an MCP server.
pub struct McpTool {
    client: Arc<McpClient>,
    schema: Value,
}

impl McpClient {
    /// Connects to `server`, lists its tools and returns those `include` selects (all when
    /// empty; a name it does not have is an error).
    pub async fn connect(server: &McpServer) -> Result<Vec<McpTool>, McpError> {
        let client = client(server.limits.timeout_secs);
        let client = Arc::new(McpClient {
            url: server.url.clone(),
            client,
            limits: server.limits.clone(),
            slots: Semaphore::new(server.limits.concurrency),
            next_id: AtomicU64::new(1),
            session: RwLock::new(Session::default()),
        });
        client.initialize().await?;
        let listed = client.list_tools().await?;
        let have = || listed.iter().filter_map(|t| t["name"].as_str()).collect::<Vec<_>>().join(", ");
        for name in &server.include {
            if !listed.iter().any(|t| t["name"] == name.as_str()) {
                return Err(McpError::NoSuchTool {
                    url: server.url.clone(),
                    name: name.clone(),
                    have: have(),
                });
            }
        }
        Ok(listed
            .iter()
            .filter(|t| server.include.is_empty() || server.include.iter().any(|n| t["name"] == n.as_str()))
            .filter_map(|tool| {
                let name = tool["name"].as_str()?;
                let description = tool["description"].as_str().unwrap_or_default();
                let parameters = match &tool["inputSchema"] {
                    Value::Null => json!({"type": "object", "properties": {}}),
                    other => other.clone(),
                };
                Some(McpTool { client: client.clone(), schema: schema(name, description, parameters) })
            })
            .collect())
    }

    /// Starts a session: `initialize`, then `notifications/initialized`.
    async fn initialize(&self) -> Result<(), McpError> {
        *self.session.write().await = Session::default();
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "kart", "version": env!("CARGO_PKG_VERSION")},
        });
        let (result, session) = self.post("initialize", Some(params)).await?;
        let version = result["protocolVersion"].as_str().map(str::to_owned);
        *self.session.write().await = Session { id: session, version };
        self.post("notifications/initialized", None).await?;
        Ok(())
    }

    async fn list_tools(&self) -> Result<Vec<Value>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let params = cursor.as_ref().map(|c| json!({"cursor": c}));
            let (result, _) = self.request("tools/list", params).await?;
            tools.extend(result["tools"].as_array().cloned().unwrap_or_default());
            match result["nextCursor"].as_str() {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => return Ok(tools),
            }
        }
    }

    /// A request in the current session, initialising a new one once if the server forgot it.
    async fn request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<(Value, Option<String>), McpError> {
        match self.post(method, params.clone()).await {
            Err(McpError::Status { status, .. })
                if status == reqwest::StatusCode::NOT_FOUND && self.session.read().await.id.is_some() =>
            {
                tracing::info!(url = %self.url, "MCP session expired; initialising a new one");
                self.initialize().await?;
                self.post(method, params).await
            }
            other => other,
        }
    }

    /// Posts one JSON-RPC message (a notification when `method` starts with `notifications/`)
    /// and returns the result with the session id the server set, if any.
    async fn post(&self, method: &str, params: Option<Value>) -> Result<(Value, Option<String>), McpError> {
        let notification = method.starts_with("notifications/");
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({"jsonrpc": "2.0", "method": method});
        if let Some(params) = params {
            message["params"] = params;
        }
        if !notification {
            message["id"] = json!(id);
        }
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        let session = self.session.read().await.clone();
        for (name, value) in [(SESSION_HEADER, session.id), (VERSION_HEADER, session.version)] {
            if let Some(value) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
                headers.insert(name, value);
            }
        }
        let http = |source| McpError::Http { url: self.url.clone(), source };
        let response =
            self.client.post(&self.url).headers(headers).json(&message).send().await.map_err(http)?;
        let status = response.status();
        let session_id =
            response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let streamed = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let body = response.text().await.map_err(http)?;
        if !status.is_success() {
            let body = body.trim().chars().take(500).collect();
            return Err(McpError::Status { url: self.url.clone(), method: method.into(), status, body });
        }
        if notification {
            return Ok((Value::Null, session_id));
        }
        let protocol =
            |reason: String| McpError::Protocol { url: self.url.clone(), method: method.into(), reason };
        let messages: Vec<Value> = if streamed {
            events(&body).iter().filter_map(|data| serde_json::from_str(data).ok()).collect()
        } else {
            vec![serde_json::from_str(&body).map_err(|e| protocol(format!("{e}")))?]
        };
        let Some(answer) = messages.into_iter().find(|m| m["id"] == json!(id)) else {
            return Err(protocol(format!(
                "no response with id {id} in {:?}",
                body.chars().take(200).collect::<String>()
            )));
        };
        if let Some(error) = answer.get("error") {
            return Err(McpError::Rpc {
                url: self.url.clone(),
                method: method.into(),
                code: error["code"].as_i64().unwrap_or_default(),
                message: error["message"].as_str().unwrap_or_default().to_owned(),
            });
        }
        match answer.get("result") {
            Some(result) => Ok((result.clone(), session_id)),
            None => Err(protocol("neither `result` nor `error`".into())),
        }
    }
}

/// The `data` of each event of a server-sent event stream (multi-line data joined by `\n`).
fn events(stream: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Vec<&str> = Vec::new();
    for line in stream.lines().chain([""]) {
        if line.is_empty() {
            if !data.is_empty() {
                events.push(data.join("\n"));
                data.clear();
            }
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    events
}

/// The text of a `tools/call` result: its text contents joined by newlines (an embedded text
/// resource counts as text; other contents are named by their type).
fn result_text(result: &Value) -> String {
    let parts: Vec<String> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| match item["type"].as_str() {
            Some("text") => item["text"].as_str().unwrap_or_default().to_owned(),
            Some("resource") if item["resource"]["text"].is_string() => {
                item["resource"]["text"].as_str().unwrap_or_default().to_owned()
            }
            Some(other) => format!("[{other}]"),
            None => String::new(),
        })
        .collect();
    if parts.is_empty() && !result["structuredContent"].is_null() {
        return result["structuredContent"].to_string();
    }
    parts.join("\n")
}

impl Function for McpTool {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a> {
        Box::pin(async move {
            let client = &self.client;
            let _slot = client.slots.acquire().await.expect("the semaphore is never closed");
            let params = json!({"name": self.name(), "arguments": arguments});
            let mut delays = client.limits.retry.backoff().take(client.limits.retry.retries as usize);
            let result = loop {
                match client.request("tools/call", Some(params.clone())).await {
                    Ok((result, _)) => break result,
                    Err(e) => {
                        let retry = match &e {
                            McpError::Http { source, .. } => source.is_connect() || source.is_timeout(),
                            McpError::Status { status, .. } => status.is_server_error(),
                            _ => false,
                        };
                        match delays.next().filter(|_| retry) {
                            Some(delay) => tokio::time::sleep(delay).await,
                            None => return Err(CallFailed(e.to_string())),
                        }
                    }
                }
            };
            let text = result_text(&result);
            match result["isError"].as_bool() {
                Some(true) => Err(CallFailed(text)),
                _ => Ok(text),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_streams_are_split_into_their_data() {
        let stream = "event: message\ndata: {\"a\": 1}\n\n: comment\ndata: {\"b\":\ndata: 2}\n\n";
        assert_eq!(events(stream), ["{\"a\": 1}", "{\"b\":\n2}"]);
    }

    #[test]
    fn call_results_read_as_text() {
        let result = json!({"content": [{"type": "text", "text": "5"}, {"type": "image", "data": "..."},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "A"}}]});
        assert_eq!(result_text(&result), "5\n[image]\nA");
        assert_eq!(
            result_text(&json!({"content": [], "structuredContent": {"result": 5}})),
            "{\"result\":5}"
        );
    }
}
