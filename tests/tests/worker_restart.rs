//! `kart train` rides out a rollout worker restart: with its only worker killed in the middle of
//! the run and started again on the same port a few seconds later, the trainer sends the groups
//! it lost again once the worker is ready, and the run completes without `--resume`.

use kart_tests::{
    Child, binary, capitals_retriever, capitals_train_config, free_port, fresh_dir, shared_dir, step_records,
    wait_ready,
};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 4;

/// How long the worker stays down: the 3 to 6 s of the restart that used to fail the run.
const OUTAGE: Duration = Duration::from_secs(3);

/// A rollout worker on the config at `config`, once its `/readyz` at `url` answers.
fn worker(config: &Path, url: &str) -> Child {
    let mut child = Child(
        Command::new(binary("kart"))
            .args(["rollout", "serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("{url}/readyz"), &mut child, Duration::from_secs(300));
    child
}

/// Polls `done` every 20 ms until it holds, failing when `trainer` exits first or after `limit`.
fn until(what: &str, trainer: &mut Child, log: &Path, limit: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        if let Some(status) = trainer.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("the trainer exited with {status} before {what}:\n{log}");
        }
        assert!(Instant::now() < deadline, "no {what} within {limit:?}");
        std::thread::park_timeout(Duration::from_millis(20));
    }
}

#[test]
fn a_run_completes_through_a_worker_restart() {
    let dir = fresh_dir("kart-worker-restart");
    let (_retriever, retriever_url) = capitals_retriever(&dir);
    let port = free_port();
    let worker_url = format!("http://127.0.0.1:{port}");
    let worker_config = dir.join("rollout.json");
    let config = json!({
        "host": "127.0.0.1",
        "port": port,
        "model": shared_dir().join("fixtures/models/tiny-qwen2"),
        "engine": {"kind": "embedded", "max_batch": 16},
        "retriever_url": retriever_url,
    });
    std::fs::write(&worker_config, config.to_string()).unwrap();
    let mut first_worker = worker(&worker_config, &worker_url);

    let out = dir.join("run");
    let train_config = dir.join("train.json");
    let mut config = capitals_train_config(&dir, &out, &[&worker_url], STEPS);
    config["rollout"]["retry_deadline_secs"] = json!(60);
    config["checkpoint"] = json!({"every": 0});
    std::fs::write(&train_config, config.to_string()).unwrap();
    let log = dir.join("train.log");
    let mut trainer = Child(
        Command::new(binary("kart"))
            .args(["train", "--config"])
            .arg(&train_config)
            .env("KART_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let logged = |step: u64| step_records(&out).iter().any(|r| r["step"].as_f64() == Some(step as f64));
    let minute = Duration::from_secs(60);
    until("step 1", &mut trainer, &log, 5 * minute, || logged(1));

    // The worker dies while the trainer needs it for the next step.
    first_worker.0.kill().unwrap(); // SIGKILL
    first_worker.0.wait().unwrap();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    until("a failed rollout request", &mut trainer, &log, 2 * minute, || {
        log_text().contains("rollout request failed")
    });
    std::thread::sleep(OUTAGE);
    let _second_worker = worker(&worker_config, &worker_url);

    let deadline = Instant::now() + 10 * minute;
    let status = loop {
        if let Some(status) = trainer.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the run did not finish within 10 minutes");
        std::thread::park_timeout(Duration::from_millis(50));
    };
    assert!(status.success(), "the run failed: {status}\n{}", log_text());
    let records = step_records(&out);
    let steps: Vec<u64> = records.iter().map(|r| r["step"].as_f64().unwrap() as u64).collect();
    assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>(), "one record per step");
    for record in &records {
        assert_eq!(record["groups/failed"], json!(0.0), "the lost groups were rolled out again: {record}");
    }
    assert!(out.join("model/config.json").is_file());
    // The restarted worker, started on the fixture's weights, rolled out the last step with the
    // weights of version STEPS - 1, pulled from the trainer.
    let metrics = kart_tests::http().get(format!("{worker_url}/metrics")).send().unwrap().text().unwrap();
    assert!(metrics.contains(&format!("\nkart_rollout_policy_version {}\n", STEPS - 1)), "{metrics}");
}
