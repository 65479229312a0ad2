//! `kart train` keeping SGLang servers on its weights (`weight_sync: sglang_disk`), against two
//! stand-in SGLang servers (`tests/standins/sglang.py`, SGLang's HTTP endpoints) behind a real
//! rollout worker and a real retriever: every replica loads every version as its
//! `weight_version`, a failed update is retried, the tokens carry the version that sampled them
//! (so staleness is true), and a replica that keeps failing fails the run, naming it, rather than
//! letting it train on replicas left on different weights; `http_pull` through SGLang workers,
//! which would leave the servers on their first weights, fails at the first publish.

use kart_tests::{Child, binary, capitals_retriever, capitals_train_config, free_port, fresh_dir, python};
use kart_tests::{eventually, repo_root, rollout_worker, shared_dir, step_records, wait_ready};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const STEPS: u64 = 3;

/// A stand-in SGLang server failing its first `fail_updates` updates and generating a token every
/// `token_seconds`: the process, its URL and the file it records accepted updates in.
fn sglang(dir: &Path, name: &str, fail_updates: u32, token_seconds: f64) -> (Child, String, PathBuf) {
    let port = free_port();
    let record = dir.join(format!("{name}.jsonl"));
    let mut child = Child(
        Command::new(python())
            .arg(repo_root().join("tests/standins/sglang.py"))
            .arg(shared_dir().join("fixtures/models/tiny-qwen2"))
            .arg(port.to_string())
            .arg("--record")
            .arg(&record)
            .args(["--fail-updates", &fail_updates.to_string()])
            .args(["--token-seconds", &token_seconds.to_string()])
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/health"), &mut child, Duration::from_secs(60));
    (child, url, record)
}

/// A retriever, two stand-in SGLang servers `a` and `b` (`b` failing its first `b_failures`
/// updates) and a rollout worker generating with both, in a fresh `dir`.
struct Setup {
    dir: PathBuf,
    a: (Child, String, PathBuf),
    b: (Child, String, PathBuf),
    _retriever: Child,
    _worker: Child,
    worker: String,
}

impl Setup {
    fn start(tag: &str, b_failures: u32) -> Setup {
        Setup::with(tag, b_failures, 0.0)
    }

    /// Servers that generate a token every `token_seconds`.
    fn start_slow(tag: &str, token_seconds: f64) -> Setup {
        Setup::with(tag, 0, token_seconds)
    }

    fn with(tag: &str, b_failures: u32, token_seconds: f64) -> Setup {
        let dir = fresh_dir(tag);
        let (retriever, retriever_url) = capitals_retriever(&dir);
        let (a, b) = (sglang(&dir, "a", 0, token_seconds), sglang(&dir, "b", b_failures, token_seconds));
        let engine = json!({"kind": "sglang", "urls": [a.1, b.1]});
        let (worker, url) = rollout_worker(&dir, engine, &retriever_url);
        Setup { dir, a, b, _retriever: retriever, _worker: worker, worker: url }
    }

    /// Runs `kart train` for [`STEPS`] steps through the worker, publishing into `dir/weights`
    /// for both servers, its config changed by `adjust`; its exit status and output.
    fn train(&self, adjust: impl FnOnce(&mut Value)) -> std::process::Output {
        let dir = &self.dir;
        let mut config = capitals_train_config(dir, &dir.join("out"), &[&self.worker], STEPS);
        let replicas = [&self.a.1, &self.b.1];
        config["weight_sync"] = json!({"kind": "sglang_disk", "path": dir.join("weights"), "urls": replicas});
        adjust(&mut config);
        let path = dir.join("train.json");
        std::fs::write(&path, config.to_string()).unwrap();
        Command::new(binary("kart")).args(["train", "--config"]).arg(&path).output().unwrap()
    }
}

/// What a stand-in recorded: its updates and the requests it aborted.
fn entries(record: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The updates a stand-in accepted: `(weight_version, model_path)`.
fn updates(record: &Path) -> Vec<(String, String)> {
    let entry =
        |v: Value| (v["weight_version"].as_str()?.to_string(), v["model_path"].as_str()?.to_string()).into();
    entries(record).into_iter().filter_map(entry).collect()
}

#[test]
fn every_replica_loads_every_version_and_tokens_carry_it() {
    let setup = Setup::start("kart-sglang-sync", 1);
    let (dir, a_record, b_record) = (&setup.dir, &setup.a.2, &setup.b.2);
    let output = setup.train(|_| {});
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    let expected: Vec<(String, String)> = (0..=STEPS)
        .map(|v| (v.to_string(), dir.join("weights").join(format!("v{v}")).display().to_string()))
        .collect();
    assert_eq!(updates(a_record), expected, "replica a got every version, in order");
    assert_eq!(updates(b_record), expected, "replica b too, its failed first update retried");
    let flags: Vec<Value> = entries(a_record).into_iter().map(|e| e["abort_all_requests"].clone()).collect();
    assert!(flags.iter().all(|f| *f == false), "updates wait for running requests by default: {flags:?}");
    assert!(log.contains("updating an SGLang replica failed; retrying"), "{log}");
    let records = step_records(&dir.join("out"));
    assert_eq!(records.len() as u64, STEPS, "{records:?}");
    for record in &records {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the version the servers report: {record}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_replica_that_keeps_failing_fails_the_run_naming_it() {
    let setup = Setup::start("kart-sglang-sync-failing", 100);
    let (dir, a_record, b) = (&setup.dir, &setup.a.2, &setup.b.1);
    let output = setup.train(|_| {});
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the run went on with a replica on other weights: {log}");
    assert!(log.contains("weights v0 reached 1 of 2 SGLang replicas"), "{log}");
    assert!(
        log.contains(b.as_str()) && log.contains("injected failure"),
        "the failing replica and its reason: {log}"
    );
    assert_eq!(updates(a_record).len(), 1, "the healthy replica loaded v0");
    assert!(step_records(&dir.join("out")).is_empty(), "no step trained");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn http_pull_through_sglang_workers_fails_instead_of_training_on_stale_servers() {
    let setup = Setup::start("kart-sglang-sync-pull", 0);
    let output = setup.train(|config| config["weight_sync"] = json!({"kind": "http_pull"}));
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "SGLang servers would have kept the base weights: {log}");
    assert!(log.contains("weight_sync.kind = http_pull needs workers of the embedded engine"), "{log}");
    assert!(log.contains("engine loads weights itself"), "the worker's answer: {log}");
    assert!(step_records(&setup.dir.join("out")).is_empty(), "no step trained");
    std::fs::remove_dir_all(&setup.dir).unwrap();
}

/// Whether `value` holds a trajectory with a model turn whose tokens two versions sampled: a
/// generation continued on new weights.
fn a_turn_spans_two_versions(value: &Value) -> bool {
    match value {
        Value::Object(fields) => {
            if let (Some(Value::Array(mask)), Some(Value::Array(versions))) =
                (fields.get("loss_mask"), fields.get("versions"))
                && mask
                    .windows(2)
                    .zip(versions.windows(2))
                    .any(|(m, v)| m[0] == 1 && m[1] == 1 && v[0] != v[1])
            {
                return true;
            }
            fields.values().any(a_turn_spans_two_versions)
        }
        Value::Array(items) => items.iter().any(a_turn_spans_two_versions),
        _ => false,
    }
}

#[test]
fn with_interruptible_rollouts_every_update_aborts_the_generations_in_flight() {
    let setup = Setup::start("kart-sglang-sync-interruptible", 0);
    let output = setup.train(|config| config["rollout"]["interruptible"] = json!(true));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for record in [&setup.a.2, &setup.b.2] {
        let updates = entries(record);
        assert_eq!(updates.len() as u64, STEPS + 1, "{updates:?}");
        assert!(updates.iter().all(|u| u["abort_all_requests"] == true), "{updates:?}");
    }
    std::fs::remove_dir_all(&setup.dir).unwrap();
}

#[test]
fn a_generation_an_update_interrupts_goes_on_from_its_prefix_on_the_new_weights() {
    // A token every 0.05 s, so the update lands in the middle of a generation.
    let setup = Setup::start_slow("kart-sglang-sync-interrupted", 0.05);
    let question = json!([{"role": "user", "content": "Capital of Peru? Search, then answer."}]);
    let task = json!({"id": "q", "messages": question, "ground_truth": ["Lima"]});
    let body = json!({"prompts": [task], "n": 1, "policy_version": 0,
                      "env": {"kind": "search-r1", "max_turns": 2, "max_response_length": 64}});
    let url = format!("{}/rollout", setup.worker);
    let rollout = std::thread::spawn(move || {
        let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
        client.post(url).json(&body).send().and_then(|r| r.text()).unwrap()
    });
    let http = reqwest::blocking::Client::new();
    let generating = |server: &str| -> Option<u64> {
        let answer: Value = http.get(format!("{server}/in_flight")).send().ok()?.json().ok()?;
        answer["tokens"].as_u64()
    };
    eventually(60, "a generation three tokens in", String::new, || {
        [&setup.a.1, &setup.b.1].iter().any(|s| generating(s).is_some_and(|t| t >= 3)).then_some(())
    });
    // What the trainer sends with `rollout.interruptible`, to every replica.
    let update = json!({"model_path": shared_dir().join("fixtures/models/tiny-qwen2"), "weight_version": "1",
                        "abort_all_requests": true});
    for server in [&setup.a.1, &setup.b.1] {
        let answer = http.post(format!("{server}/update_weights_from_disk")).json(&update).send().unwrap();
        assert!(answer.status().is_success());
    }
    let lines = rollout.join().unwrap();
    let groups: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(groups.len(), 1, "{lines}");
    let aborted: usize = [&setup.a.2, &setup.b.2]
        .iter()
        .flat_map(|r| entries(r))
        .filter_map(|e| e["aborted"].as_u64())
        .map(|n| n as usize)
        .sum();
    assert!(aborted >= 3, "the update interrupted a generation after its third token: {aborted}");
    assert!(
        a_turn_spans_two_versions(&groups[0]),
        "the interrupted turn goes on at version 1 after its version-0 tokens: {lines}"
    );
    assert_eq!(groups[0]["trajectories"][0]["status"], "completed", "{lines}");
    std::fs::remove_dir_all(&setup.dir).unwrap();
}
