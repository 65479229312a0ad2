//! `kart eval` and `kart infer` on SGLang's HTTP API (the stand-in of `scripts/standins/`, which
//! plays a search agent: a search first, then "William Shakespeare" once passages are in the
//! context), searching a real retriever. vLLM's are tested against a real vLLM (tests/vllm.rs).

use kart_tests::{Child, binary, corpus_retriever, free_port, fresh_dir, python};
use kart_tests::{repo_root, shared_dir, wait_ready};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

/// The stand-in SGLang server on the fixture model: the process and its URL.
fn stand_in() -> (Child, String) {
    let port = free_port();
    let mut child = Child(
        Command::new(python())
            .arg(repo_root().join("scripts/standins/sglang.py"))
            .arg(shared_dir().join("fixtures/models/tiny-qwen2"))
            .arg(port.to_string())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/health"), &mut child, Duration::from_secs(300));
    (child, url)
}

/// `kart` with `args` and the set-up flags of SGLang at `url`: its stdout, or its stderr when it
/// fails.
fn kart(args: &[&str], url: &str, retriever: &str) -> Result<String, String> {
    let model = shared_dir().join("fixtures/models/tiny-qwen2");
    let mut command = Command::new(binary("kart"));
    command
        .args(args)
        .arg("--model")
        .arg(&model)
        .args(["--engine", "sglang", "--engine-url", url, "--retriever", retriever])
        .args(["--env", r#"{"kind": "search-r1", "max_turns": 2}"#]);
    let done = command.output().unwrap();
    match done.status.success() {
        true => Ok(String::from_utf8_lossy(&done.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&done.stderr).into_owned()),
    }
}

#[test]
fn eval_and_infer_generate_on_an_sglang_server() {
    let dir = fresh_dir("kart-eval-engines");
    let corpus = [
        json!({"id": "0", "contents": "\"Hamlet\"\nHamlet is a tragedy written by William Shakespeare."}),
        json!({"id": "1", "contents": "\"Lima\"\nLima is the capital of Peru."}),
        json!({"id": "2", "contents": "\"Paris\"\nParis is the capital of France."}),
    ];
    std::fs::write(dir.join("corpus.jsonl"), corpus.iter().map(|r| format!("{r}\n")).collect::<String>())
        .unwrap();
    let (_retriever, retriever) = corpus_retriever(&dir);
    let questions = dir.join("questions.jsonl");
    let rows = [
        json!({"id": "h", "question": "Who wrote Hamlet?", "answer": "William Shakespeare", "data_source": "nq"}),
        json!({"id": "p", "question": "What is the capital of Peru?", "answer": "Lima", "data_source": "nq"}),
        json!({"id": "f", "question": "What is the capital of France?", "answer": "Paris", "data_source": "hotpotqa"}),
    ];
    std::fs::write(&questions, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let (_server, url) = stand_in();
    let out = dir.join("sglang.json");
    let trajectories = dir.join("sglang.jsonl");
    let args = ["eval", "--data", questions.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let args = [&args[..], &["--trajectories", trajectories.to_str().unwrap()]].concat();
    kart(&args, &url, &retriever).unwrap_or_else(|e| panic!("{e}"));
    let figures: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // Each question searched once, then answered "William Shakespeare": right for Hamlet only.
    let nq = &figures["sources"]["nq"];
    assert_eq!((nq["trajectories"].as_u64(), nq["exact_match"].as_f64()), (Some(2), Some(0.5)));
    assert_eq!(figures["sources"]["hotpotqa"]["exact_match"].as_f64(), Some(0.0));
    assert_eq!(
        (figures["all"]["searches"].as_f64(), figures["all"]["valid_format"].as_f64()),
        (Some(1.0), Some(1.0))
    );
    let written: Vec<Value> = std::fs::read_to_string(&trajectories)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(written.len(), 3);

    // `kart infer`: the turns as they happened, the passages the retriever returned included.
    let shown = kart(&["infer", "Who wrote Hamlet?"], &url, &retriever).unwrap_or_else(|e| panic!("{e}"));
    let search = shown.find("<search>who wrote hamlet</search>").expect(&shown);
    let passages = shown.find("Doc 1(Title:").expect(&shown);
    let answer = shown.find("<answer>William Shakespeare</answer>").expect(&shown);
    assert!(search < passages && passages < answer, "{shown}");
}
