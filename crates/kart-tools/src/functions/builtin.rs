//! kart's own tools as functions: `search(query)`, `access(url)`, `python(code)` and
//! `calculator(expression)`, answering as the other environments show these tools' results.

use super::schema;
use crate::calculator::calculate;
use crate::python::PythonSandbox;
use kart_core::agent::search_r1::passages_to_string;
use kart_core::agent::tir::ToolOutcome;
use kart_core::tool::{Access, CallFailed, Called, Function, Search};
use serde_json::{Value, json};
use std::sync::Arc;

/// The string argument `key` of a call (checked against the schema before the call).
fn text_argument<'a>(arguments: &'a Value, key: &str) -> Result<&'a str, CallFailed> {
    arguments
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| CallFailed(format!("missing the argument `{key}`")))
}

fn one_string_parameter(key: &str, description: &str) -> Value {
    json!({"type": "object", "properties": {key: {"type": "string", "description": description}}, "required": [key]})
}

/// `search(query)`: the `topk` best passages, as Search-R1 lists them (`Doc 1(Title: …) …`).
pub struct SearchFunction {
    search: Arc<dyn Search>,
    topk: usize,
    schema: Value,
}

/// The schema of the built-in `search` function.
pub fn search_schema() -> Value {
    let parameters = one_string_parameter("query", "What to search for.");
    schema("search", "Search the knowledge base and return the most relevant passages.", parameters)
}

impl SearchFunction {
    pub fn new(search: Arc<dyn Search>, topk: usize) -> Self {
        SearchFunction { search, topk, schema: search_schema() }
    }
}

impl Function for SearchFunction {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a> {
        Box::pin(async move {
            let query = text_argument(arguments, "query")?.to_owned();
            let mut results = self.search.search(std::slice::from_ref(&query), self.topk).await?;
            Ok(passages_to_string(&results.pop().unwrap_or_default()))
        })
    }
}

/// `access(url)`: a web page's text.
pub struct AccessFunction {
    access: Arc<dyn Access>,
    schema: Value,
}

impl AccessFunction {
    pub fn new(access: Arc<dyn Access>) -> Self {
        let schema = schema(
            "access",
            "Read a web page and return its text.",
            one_string_parameter("url", "The page's URL."),
        );
        AccessFunction { access, schema }
    }
}

impl Function for AccessFunction {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a> {
        Box::pin(async move { Ok(self.access.access(text_argument(arguments, "url")?).await?) })
    }
}

/// The text of a TIR tool outcome, failing when the tool reported an error.
fn outcome(outcome: ToolOutcome) -> Result<String, CallFailed> {
    match outcome.result() {
        (text, true) => Ok(text),
        (text, false) => Err(CallFailed(text.strip_prefix("Error: ").unwrap_or(&text).to_owned())),
    }
}

/// `python(code)`: the sandboxed executor's standard output (or the error it reports).
pub struct PythonFunction {
    sandbox: Arc<PythonSandbox>,
    schema: Value,
}

impl PythonFunction {
    pub fn new(sandbox: Arc<PythonSandbox>) -> Self {
        let parameters = one_string_parameter("code", "A Python program; what it prints is returned.");
        PythonFunction {
            sandbox,
            schema: schema("python", "Run Python code and return its output.", parameters),
        }
    }
}

impl Function for PythonFunction {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a> {
        Box::pin(async move {
            let code = text_argument(arguments, "code")?;
            let run = self.sandbox.run(code).await.map_err(|e| CallFailed(e.to_string()))?;
            outcome(run)
        })
    }
}

/// `calculator(expression)`: an arithmetic expression's value.
pub struct CalculatorFunction {
    schema: Value,
}

impl Default for CalculatorFunction {
    fn default() -> Self {
        let parameters =
            one_string_parameter("expression", "An arithmetic expression, e.g. 3 * (4 + 5) / 2.");
        CalculatorFunction { schema: schema("calculator", "Evaluate an arithmetic expression.", parameters) }
    }
}

impl Function for CalculatorFunction {
    fn schema(&self) -> &Value {
        &self.schema
    }

    fn call<'a>(&'a self, arguments: &'a Value) -> Called<'a> {
        Box::pin(async move { outcome(calculate(text_argument(arguments, "expression")?)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::SandboxConfig;
    use futures::future::BoxFuture;
    use kart_core::agent::search_r1::{RetrievalResult, document};
    use kart_core::tool::{Searched, ToolError};

    struct OnePassage;

    impl Search for OnePassage {
        fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
            let hit = RetrievalResult {
                document: document("7".into(), format!("\"{}\"\nA passage.", queries[0])),
                score: 1.0,
            };
            Box::pin(std::future::ready(Ok(vec![vec![hit; topk]])))
        }
    }

    #[tokio::test]
    async fn built_ins_answer_as_the_other_environments_show_them() {
        let search = SearchFunction::new(Arc::new(OnePassage), 2);
        assert_eq!(search.name(), "search");
        let text = search.call(&json!({"query": "Paris"})).await.unwrap();
        assert_eq!(text, "Doc 1(Title: \"Paris\") A passage.\nDoc 2(Title: \"Paris\") A passage.\n");
        let calculator = CalculatorFunction::default();
        assert_eq!(calculator.call(&json!({"expression": "6 * 7"})).await.unwrap(), "42");
        let err = calculator.call(&json!({"expression": "6 *"})).await.unwrap_err();
        assert!(!err.0.is_empty() && !err.0.starts_with("Error"), "{err}");
        assert_eq!(calculator.call(&json!({})).await.unwrap_err().0, "missing the argument `expression`");
    }

    /// Pages by URL; any other URL fails as a reader would.
    struct Pages;

    impl Access for Pages {
        fn access<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<String, ToolError>> {
            let page = match url {
                "https://example.org/a" => Ok("# A\n\nSome text.".to_owned()),
                _ => Err(ToolError { tool: "access", reason: format!("{url}: 404 Not Found") }),
            };
            Box::pin(std::future::ready(page))
        }
    }

    #[tokio::test]
    async fn access_and_python_run_on_their_tools() {
        let access = AccessFunction::new(Arc::new(Pages));
        assert_eq!(access.call(&json!({"url": "https://example.org/a"})).await.unwrap(), "# A\n\nSome text.");
        let err = access.call(&json!({"url": "https://example.org/b"})).await.unwrap_err();
        assert_eq!(err.0, "https://example.org/b: 404 Not Found");
        let config = SandboxConfig { timeout_secs: 60, cpu_secs: 60, ..SandboxConfig::default() };
        let python = PythonFunction::new(Arc::new(PythonSandbox::new(config).unwrap()));
        assert_eq!(python.name(), "python");
        assert_eq!(python.call(&json!({"code": "print(6 * 7)"})).await.unwrap(), "42");
        let err = python.call(&json!({"code": "1 / 0"})).await.unwrap_err();
        assert!(err.0.contains("ZeroDivisionError"), "{err}");
    }
}
