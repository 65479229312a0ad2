//! `kart eval` and `kart infer` on remote engines: SGLang's and vLLM's HTTP APIs (the stand-ins
//! of `scripts/standins/`, which play a search agent: a search first, then "William Shakespeare"
//! once passages are in the context), searching a real retriever.

use kart_tests::{Child, binary, corpus_retriever, free_port, fresh_dir, python};
use kart_tests::{repo_root, shared_dir, wait_ready};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

/// A stand-in server (`sglang.py` or `vllm.py`) on the fixture model: the process and its URL.
fn stand_in(script: &str) -> (Child, String) {
    let port = free_port();
    let mut child = Child(
        Command::new(python())
            .arg(repo_root().join("scripts/standins").join(script))
            .arg(shared_dir().join("fixtures/models/tiny-qwen2"))
            .arg(port.to_string())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/health"), &mut child, Duration::from_secs(300));
    (child, url)
}

/// `kart` with `args` and the set-up flags of `engine` at `url`: its stdout, or its stderr when
/// it fails.
fn kart(args: &[&str], engine: &str, url: &str, retriever: &str) -> Result<String, String> {
    let model = shared_dir().join("fixtures/models/tiny-qwen2");
    let mut command = Command::new(binary("kart"));
    command
        .args(args)
        .arg("--model")
        .arg(&model)
        .args(["--engine", engine, "--engine-url", url, "--retriever", retriever])
        .args(["--env", r#"{"kind": "search-r1", "max_turns": 2}"#]);
    if engine == "vllm" && !args.contains(&"--served-model") {
        command.args(["--served-model", "tiny-qwen2"]);
    }
    let done = command.output().unwrap();
    match done.status.success() {
        true => Ok(String::from_utf8_lossy(&done.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&done.stderr).into_owned()),
    }
}

#[test]
fn eval_and_infer_generate_on_sglang_and_vllm_servers() {
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
    for (engine, script) in [("sglang", "sglang.py"), ("vllm", "vllm.py")] {
        let (_server, url) = stand_in(script);
        let out = dir.join(format!("{engine}.json"));
        let trajectories = dir.join(format!("{engine}.jsonl"));
        let args = ["eval", "--data", questions.to_str().unwrap(), "--out", out.to_str().unwrap()];
        let args = [&args[..], &["--trajectories", trajectories.to_str().unwrap()]].concat();
        kart(&args, engine, &url, &retriever).unwrap_or_else(|e| panic!("{engine}: {e}"));
        let figures: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        // Each question searched once, then answered "William Shakespeare": right for Hamlet only.
        let nq = &figures["sources"]["nq"];
        assert_eq!(
            (nq["trajectories"].as_u64(), nq["exact_match"].as_f64()),
            (Some(2), Some(0.5)),
            "{engine}"
        );
        assert_eq!(figures["sources"]["hotpotqa"]["exact_match"].as_f64(), Some(0.0), "{engine}");
        assert_eq!(
            (figures["all"]["searches"].as_f64(), figures["all"]["valid_format"].as_f64()),
            (Some(1.0), Some(1.0))
        );
        let written: Vec<Value> = std::fs::read_to_string(&trajectories)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(written.len(), 3, "{engine}");

        // `kart infer`: the turns as they happened, the passages the retriever returned included.
        let shown = kart(&["infer", "Who wrote Hamlet?"], engine, &url, &retriever)
            .unwrap_or_else(|e| panic!("{engine}: {e}"));
        let search = shown.find("<search>who wrote hamlet</search>").expect(&shown);
        let passages = shown.find("Doc 1(Title:").expect(&shown);
        let answer = shown.find("<answer>William Shakespeare</answer>").expect(&shown);
        assert!(search < passages && passages < answer, "{shown}");
    }

    // vLLM serves its model under a name: another `--served-model` reaches nothing.
    let (_server, url) = stand_in("vllm.py");
    let shown = kart(&["infer", "--served-model", "other", "Who wrote Hamlet?"], "vllm", &url, &retriever);
    let shown = shown.unwrap();
    assert!(shown.contains("── answer: (none) · 0 turns, 0 tool calls, aborted ──"), "{shown}");
}
