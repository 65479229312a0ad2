//! The `tools` environment against real function back ends: an MCP server from the Python SDK
//! (`mcp`, streamable HTTP) whose tools a scripted model calls in the Hermes format, rendered by
//! the fixtures' tool-calling chat template.

use kart_core::agent::trajectory::{Status, Trajectory};
use kart_core::config::env::{AnswerFormat, EnvConfig, ToolsConfig};
use kart_core::config::functions::{CallLimits, FunctionConfig, McpServer};
use kart_core::config::retry::RetryPolicy;
use kart_core::config::rollout::ContextConfig;
use kart_core::generation::SamplingParams;
use kart_core::tool::Function;
use kart_core::wire::Task;
use kart_rollout::env::Context;
use kart_rollout::env::tools::ToolsEnv;
use kart_rollout::env::turns::Agent;
use kart_rollout::fake::{Reply, ScriptedEngine};
use kart_tests::{Child, free_port, repo_root};
use kart_tokenizer::Tokenizer;
use kart_tools::functions::mcp::{McpClient, McpTool};
use serde_json::json;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `tests/mcp/server.py` on a free port, and its config once it lists its tools.
async fn mcp_server() -> Option<(Child, McpServer, Vec<McpTool>)> {
    mcp_server_on(free_port()).await
}

/// `tests/mcp/server.py` on `port`, and its config once it lists its tools.
async fn mcp_server_on(port: u16) -> Option<(Child, McpServer, Vec<McpTool>)> {
    let python = kart_testing::python()?;
    let child = Command::new(python)
        .arg(repo_root().join("tests/mcp/server.py"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the MCP server");
    let mut child = Child(child);
    let server = McpServer {
        url: format!("http://127.0.0.1:{port}/mcp"),
        include: Vec::new(),
        limits: CallLimits { timeout_secs: 120.0, ..CallLimits::default() },
    };
    let start = Instant::now();
    loop {
        match McpClient::connect(&server).await {
            Ok(tools) => return Some((child, server, tools)),
            Err(e) => {
                if let Ok(Some(status)) = child.0.try_wait() {
                    panic!("the MCP server exited with {status} (is `mcp` installed in the venv?)");
                }
                assert!(start.elapsed() < Duration::from_secs(300), "the MCP server is not ready: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A tool-calling model folder (the fixtures' template on tiny-qwen2's tokenizer).
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    kart_testing::tool_calling_model(dir.path());
    dir
}

async fn episode(
    config: &ToolsConfig,
    replies: Vec<String>,
    question: &str,
    gold: &str,
) -> (Trajectory, String) {
    let dir = model_dir();
    let engine = ScriptedEngine::new(Tokenizer::load(dir.path()).unwrap(), move |_, call| {
        Reply::Text(replies.get(call).cloned().unwrap_or_else(|| "<|im_end|>".into()))
    });
    let env = EnvConfig::Tools(config.clone());
    let ctx =
        Context::build(&ContextConfig::default(), &env, Arc::new(engine), dir.path(), None).await.unwrap();
    let task = Task {
        id: "q".into(),
        messages: None,
        prompt: Some(question.into()),
        ground_truth: vec![gold.into()],
        data_source: "mcp".into(),
        tools: None,
    };
    let t =
        ToolsEnv::new(config.clone()).run(&ctx, &task, "t".into(), &SamplingParams::default()).await.unwrap();
    let text = ctx.tokenizer.decode(t.token_ids(), false).unwrap();
    (t, text)
}

fn call(name: &str, arguments: serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": arguments}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_s_tools_are_listed_and_called() {
    let Some((_server, config, tools)) = mcp_server().await else {
        eprintln!("skipped: no venv Python");
        return;
    };
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["add", "capital", "wait", "peak"]);
    let add = &tools[0].schema()["function"];
    assert_eq!(add["description"], "Add two integers.");
    assert_eq!(add["parameters"]["required"], json!(["a", "b"]), "{add}");
    assert_eq!(tools[0].call(&json!({"a": 2, "b": 40})).await.unwrap(), "42");
    let err = tools[1].call(&json!({"country": "Atlantis"})).await.unwrap_err();
    assert!(err.0.contains("no capital known for Atlantis"), "{err}");

    let only = McpServer { include: vec!["capital".into(), "divide".into()], ..config.clone() };
    let err = McpClient::connect(&only).await.err().expect("a tool the server lacks is refused").to_string();
    assert!(err.contains("no tool named `divide` (it has: add, capital, wait, peak)"), "{err}");

    // An agent calling them through the tools environment.
    let env = ToolsConfig {
        functions: vec![FunctionConfig::Mcp(config)],
        answer: AnswerFormat::Tagged,
        ..ToolsConfig::default()
    };
    let turns = vec![
        format!(
            "{}\n{}<|im_end|>",
            call("capital", json!({"country": "Japan"})),
            call("capital", json!({"country": "Atlantis"}))
        ),
        "<answer>Tokyo</answer><|im_end|>".to_string(),
    ];
    let (t, text) = episode(&env, turns, "What is the capital of Japan?", "Tokyo").await;
    assert_eq!((t.status, t.reward), (Status::Completed, 1.0), "{text}");
    let capital = t.stats.tool_calls["capital"];
    assert_eq!((capital.ok, capital.failed), (1, 1));
    assert!(
        text.contains("\"name\": \"capital\", \"description\": \"The capital city of a country.\""),
        "{text}"
    );
    assert!(
        text.contains("<|im_start|>user\n<tool_response>\nTokyo\n</tool_response>\n<tool_response>\nError: "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_s_calls_keep_its_timeout_and_concurrency() {
    let Some((_server, config, _)) = mcp_server().await else {
        eprintln!("skipped: no venv Python");
        return;
    };
    let tools = |limits: CallLimits| {
        let config = McpServer { limits, ..config.clone() };
        async move { McpClient::connect(&config).await.unwrap() }
    };
    let named = |tools: &[McpTool], name: &str| tools.iter().position(|t| t.name() == name).unwrap();

    let no_retry = RetryPolicy { retries: 0, backoff_ms: 1 };
    // Three calls at once reach the server `concurrency` at a time. Each is held until the three
    // are in flight together: briefly when only one may be, else as long as a loaded machine
    // may take to send them all.
    for (concurrency, seconds) in [(1, 0.3), (3, 300.0)] {
        let limited = tools(CallLimits { concurrency, timeout_secs: 600.0, retry: no_retry.clone() }).await;
        let (wait, peak) = (&limited[named(&limited, "wait")], &limited[named(&limited, "peak")]);
        peak.call(&json!({})).await.unwrap();
        let arguments = json!({"seconds": seconds, "until_in_flight": 3});
        let calls = (0..3).map(|_| wait.call(&arguments));
        for result in futures::future::join_all(calls).await {
            assert!(result.unwrap().starts_with("waited "));
        }
        assert_eq!(
            peak.call(&json!({})).await.unwrap(),
            concurrency.to_string(),
            "concurrency {concurrency}"
        );
    }

    // A call longer than `timeout_secs` fails after about that long (no retries here); last, as
    // the server goes on sleeping.
    let quick =
        tools(CallLimits { timeout_secs: 10.0, retry: no_retry.clone(), ..CallLimits::default() }).await;
    let started = Instant::now();
    let err = quick[named(&quick, "wait")].call(&json!({"seconds": 600})).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(300), "{:?}: {err}", started.elapsed());
    assert_eq!(quick[named(&quick, "wait")].call(&json!({"seconds": 0.05})).await.unwrap(), "waited 0.05");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_server_forgot_is_initialised_again() {
    let Some((mut server, config, tools)) = mcp_server().await else {
        eprintln!("skipped: no venv Python");
        return;
    };
    assert_eq!(tools[0].call(&json!({"a": 1, "b": 2})).await.unwrap(), "3");
    // A restarted server knows no session: it answers the old session id with 404.
    let port: u16 = config.url.rsplit(':').next().unwrap().trim_end_matches("/mcp").parse().unwrap();
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let (_restarted, _, _) = mcp_server_on(port).await.unwrap();
    assert_eq!(tools[0].call(&json!({"a": 20, "b": 22})).await.unwrap(), "42", "the tool object from before");
}
