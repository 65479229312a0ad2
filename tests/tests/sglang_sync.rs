//! `kart train` keeping SGLang servers on its weights (`weight_sync: sglang_disk`), against two
//! stand-in SGLang servers (`tests/standins/sglang.py`, SGLang's HTTP endpoints) behind a real
//! rollout worker and a real retriever: every replica loads every version as its
//! `weight_version`, a failed update is retried, the tokens carry the version that sampled them
//! (so staleness is true), and a replica that keeps failing fails the run, naming it, rather than
//! letting it train on replicas left on different weights; `http_pull` through SGLang workers,
//! which would leave the servers on their first weights, fails at the first publish.

use kart_tests::{Child, binary, capitals_retriever, capitals_train_config, free_port, fresh_dir, python};
use kart_tests::{repo_root, rollout_worker, shared_dir, step_records, wait_ready};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const STEPS: u64 = 3;

/// A stand-in SGLang server failing its first `fail_updates` updates: the process, its URL and
/// the file it records accepted updates in.
fn sglang(dir: &Path, name: &str, fail_updates: u32) -> (Child, String, PathBuf) {
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
        let dir = fresh_dir(tag);
        let (retriever, retriever_url) = capitals_retriever(&dir);
        let (a, b) = (sglang(&dir, "a", 0), sglang(&dir, "b", b_failures));
        let engine = json!({"kind": "sglang", "urls": [a.1, b.1]});
        let (worker, url) = rollout_worker(&dir, engine, &retriever_url);
        Setup { dir, a, b, _retriever: retriever, _worker: worker, worker: url }
    }

    /// Runs `kart train` for [`STEPS`] steps, publishing into `dir/weights` for both servers; its
    /// exit status and output.
    fn train(&self) -> std::process::Output {
        train(&self.dir, &self.worker, &[&self.a.1, &self.b.1])
    }
}

/// Runs `kart train` for [`STEPS`] steps through `worker`, publishing into `dir/weights` for the
/// SGLang servers at `replicas`; its exit status and output.
fn train(dir: &Path, worker: &str, replicas: &[&str]) -> std::process::Output {
    let mut config = capitals_train_config(dir, &dir.join("out"), &[worker], STEPS);
    config["weight_sync"] = json!({"kind": "sglang_disk", "path": dir.join("weights"), "urls": replicas});
    let path = dir.join("train.json");
    std::fs::write(&path, config.to_string()).unwrap();
    Command::new(binary("kart")).args(["train", "--config"]).arg(&path).output().unwrap()
}

/// The updates a stand-in accepted: `(weight_version, model_path)`.
fn updates(record: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    let entry = |line: &str| {
        let v: Value = serde_json::from_str(line).unwrap();
        (v["weight_version"].as_str().unwrap().to_string(), v["model_path"].as_str().unwrap().to_string())
    };
    text.lines().map(entry).collect()
}

#[test]
fn every_replica_loads_every_version_and_tokens_carry_it() {
    let setup = Setup::start("kart-sglang-sync", 1);
    let (dir, a_record, b_record) = (&setup.dir, &setup.a.2, &setup.b.2);
    let output = setup.train();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    let expected: Vec<(String, String)> = (0..=STEPS)
        .map(|v| (v.to_string(), dir.join("weights").join(format!("v{v}")).display().to_string()))
        .collect();
    assert_eq!(updates(a_record), expected, "replica a got every version, in order");
    assert_eq!(updates(b_record), expected, "replica b too, its failed first update retried");
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
    let output = setup.train();
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
    let config = capitals_train_config(&setup.dir, &setup.dir.join("out"), &[&setup.worker], STEPS);
    let path = setup.dir.join("pull.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let output = Command::new(binary("kart")).args(["train", "--config"]).arg(&path).output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "SGLang servers would have kept the base weights: {log}");
    assert!(log.contains("weight_sync.kind = http_pull needs workers of the embedded engine"), "{log}");
    assert!(log.contains("engine loads weights itself"), "the worker's answer: {log}");
    assert!(step_records(&setup.dir.join("out")).is_empty(), "no step trained");
    std::fs::remove_dir_all(&setup.dir).unwrap();
}
