//! The functions a tool-calling model is offered and where each runs: a built-in tool under its
//! function name, any HTTP endpoint, or the tools of an MCP server.
//!
//! ```yaml
//! functions:
//!   - builtin: search
//!   - http:
//!       name: weather
//!       description: The weather in a city today.
//!       parameters: {type: object, properties: {city: {type: string}}, required: [city]}
//!       url: http://weather.tools.svc:8080/call
//!   - mcp: {url: http://mcp.tools.svc:8000/mcp}
//! ```

use super::ConfigError;
use super::retry::RetryPolicy;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One function back end (or, for an MCP server, several).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FunctionConfig {
    /// A tool kart runs, under its function name.
    Builtin(Builtin),
    /// An HTTP endpoint: the arguments are `POST`ed as a JSON object; the response body is the
    /// result (a JSON string body is unquoted).
    Http(HttpFunction),
    /// The tools of an MCP server over streamable HTTP, listed when the worker starts.
    Mcp(McpServer),
}

/// The tools kart runs itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Builtin {
    /// `search(query)`: passages from the retriever, as Search-R1 shows them.
    Search,
    /// `access(url)`: a web page's text through the retriever's reader.
    Access,
    /// `python(code)`: the sandboxed Python executor's output.
    Python,
    /// `calculator(expression)`: an arithmetic expression's value.
    Calculator,
}

impl Builtin {
    /// The function name the model calls.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Search => "search",
            Builtin::Access => "access",
            Builtin::Python => "python",
            Builtin::Calculator => "calculator",
        }
    }
}

/// A function served by an HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpFunction {
    /// The function name the model calls.
    pub name: String,
    /// What the function does, as the model reads it.
    #[serde(default)]
    pub description: String,
    /// The JSON schema of its arguments (an `object` schema).
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
    /// Where the arguments are posted.
    pub url: String,
    #[serde(flatten)]
    pub limits: CallLimits,
}

/// An MCP server reached over streamable HTTP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The server's MCP endpoint, e.g. `http://mcp:8000/mcp`.
    pub url: String,
    /// Only these of its tools (all when empty).
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(flatten)]
    pub limits: CallLimits,
}

/// How calls to a remote function are bounded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct CallLimits {
    /// Seconds a call may take, retries excluded.
    pub timeout_secs: f64,
    /// Retries of a call that failed to connect, timed out or got a 5xx answer.
    pub retry: RetryPolicy,
    /// Calls in flight at once per worker.
    pub concurrency: usize,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits { timeout_secs: 30.0, retry: RetryPolicy { retries: 2, backoff_ms: 200 }, concurrency: 64 }
    }
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

impl FunctionConfig {
    /// Checks the settings, naming the bad field (`functions[i].…`) and its value.
    pub fn validate(&self, at: usize) -> Result<(), ConfigError> {
        let field = |part: &str| format!("functions[{at}].{part}");
        let check_url =
            |kind: &str, url: &str| match url.starts_with("http://") || url.starts_with("https://") {
                true => Ok(()),
                false => Err(ConfigError::new(
                    field(&format!("{kind}.url")),
                    url,
                    "must be an http:// or https:// URL",
                )),
            };
        let check_limits = |kind: &str, limits: &CallLimits| {
            if !(limits.timeout_secs.is_finite() && limits.timeout_secs > 0.0) {
                let at = field(&format!("{kind}.timeout_secs"));
                return Err(ConfigError::new(at, limits.timeout_secs, "must be positive"));
            }
            if limits.concurrency == 0 {
                return Err(ConfigError::new(field(&format!("{kind}.concurrency")), 0, "must be at least 1"));
            }
            Ok(())
        };
        match self {
            FunctionConfig::Builtin(_) => Ok(()),
            FunctionConfig::Http(f) => {
                if f.name.is_empty() || !f.name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
                    return Err(ConfigError::new(
                        field("http.name"),
                        &f.name,
                        "must be letters, digits, `_` or `-`",
                    ));
                }
                if f.parameters.get("type").and_then(Value::as_str) != Some("object") {
                    let reason = "must be a JSON schema of type object";
                    return Err(ConfigError::new(field("http.parameters"), &f.parameters, reason));
                }
                check_url("http", &f.url)?;
                check_limits("http", &f.limits)
            }
            FunctionConfig::Mcp(m) => {
                check_url("mcp", &m.url)?;
                check_limits("mcp", &m.limits)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_read_from_yaml_like_json() {
        let config: Vec<FunctionConfig> = serde_json::from_value(serde_json::json!([
            {"builtin": "search"},
            {"http": {"name": "weather", "url": "http://w:8080/call", "timeout_secs": 5.0,
                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"mcp": {"url": "http://mcp:8000/mcp", "include": ["add"]}}
        ]))
        .unwrap();
        assert_eq!(config[0], FunctionConfig::Builtin(Builtin::Search));
        let FunctionConfig::Http(http) = &config[1] else { panic!("{config:?}") };
        assert_eq!((http.limits.timeout_secs, http.limits.concurrency), (5.0, 64));
        assert!(config.iter().enumerate().all(|(i, f)| f.validate(i).is_ok()));
    }

    #[test]
    fn bad_settings_name_their_field() {
        let err = |value: Value| -> String {
            let f: FunctionConfig = serde_json::from_value(value).unwrap();
            f.validate(2).unwrap_err().to_string()
        };
        let e = err(serde_json::json!({"http": {"name": "w", "url": "w:8080"}}));
        assert!(e.contains("functions[2].http.url") && e.contains("w:8080"), "{e}");
        let e = err(serde_json::json!({"http": {"name": "a b", "url": "http://w"}}));
        assert!(e.contains("functions[2].http.name") && e.contains("a b"), "{e}");
        let e = err(serde_json::json!({"mcp": {"url": "http://m", "concurrency": 0}}));
        assert!(e.contains("functions[2].mcp.concurrency"), "{e}");
        let unknown = serde_json::from_value::<FunctionConfig>(serde_json::json!({"builtin": "browser"}));
        assert!(unknown.unwrap_err().to_string().contains("browser"));
    }
}
