//! Helpers for kart's process-level tests: locating the built binaries and the shared test
//! material, a small synthetic world to train on, [`control_plane`], a real Kubernetes control
//! plane with a real node (or none), [`operator`], the operator's binary run against it out of
//! the cluster, [`workloads`], the fixture-model resources the cluster tests apply, and
//! [`vllm`] and [`vllm_sync`], real vLLM servers and a training run kept on them.

pub mod control_plane;
pub mod operator;
pub mod reference;
pub mod vllm;
pub mod vllm_sync;
pub mod workloads;

use std::path::{Path, PathBuf};

pub use kart_testing::{free_port, repo_root, shared as shared_dir};

/// A binary of the workspace, built in the same profile as the running test.
///
/// Test executables live in `<target>/<profile>/deps/`; binaries in `<target>/<profile>/`. The
/// binaries must be built first (`cargo build --release --workspace --bins`, as `make test` does).
/// `KART_BIN_DIR` points the tests at binaries built elsewhere.
pub fn binary(name: &str) -> PathBuf {
    let profile_dir = match std::env::var_os("KART_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let exe = std::env::current_exe().expect("test executable path");
            exe.parent().and_then(Path::parent).expect("test executable in <profile>/deps").to_path_buf()
        }
    };
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} not found: build the binaries first (cargo build --release --workspace --bins)",
        path.display()
    );
    path
}

/// The project venv's Python (`KART_VENV`, as `scripts/env.sh` sets it, else `.venv`), which has the
/// packages of `scripts/requirements.txt`.
pub fn python() -> PathBuf {
    kart_testing::venv().join("bin/python")
}

/// Runs `command` (a `kart` command writing its JSON report to `json`), which must succeed: its
/// standard output and the report.
pub fn report_of(command: &mut std::process::Command, json: &Path) -> (String, serde_json::Value) {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (stdout, report)
}

/// A child process killed when dropped, so a failing test never leaves servers behind.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A blocking HTTP client for requests a test expects answered: straight to the address (no
/// proxy), and patient, since a loaded machine may take long to answer; a server that never does
/// fails the test after ten minutes rather than hanging it.
pub fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(600))
        .build()
        .expect("a plain HTTP client builds")
}

/// Writes `message` to the test log past the test harness's capture (which keeps a passing test's
/// output back), so the log of a run that passes slowly still shows where its time went.
pub fn log(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "kart-tests: {message}");
}

/// Logs ([`log`]) that waiting for `what` took a minute or more since `started`.
pub fn log_if_slow(what: &str, started: std::time::Instant) {
    let elapsed = started.elapsed();
    if elapsed >= std::time::Duration::from_secs(60) {
        log(&format!("{what} took {} s", elapsed.as_secs()));
    }
}

/// Polls `url` until it answers 200, the child exits, or `deadline` passes.
pub fn wait_ready(url: &str, child: &mut Child, deadline: std::time::Duration) {
    let client = http();
    let start = std::time::Instant::now();
    loop {
        // A request waits up to 30 s: a loaded machine may answer slowly, and a server that is
        // not listening yet refuses at once.
        let wait = deadline
            .saturating_sub(start.elapsed())
            .clamp(std::time::Duration::from_secs(1), std::time::Duration::from_secs(30));
        if let Ok(r) = client.get(url).timeout(wait).send()
            && r.status().is_success()
        {
            log_if_slow(&format!("{url} becoming ready"), start);
            return;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("{url}: the process exited with {status} before becoming ready");
        }
        assert!(start.elapsed() < deadline, "{url} not ready within {deadline:?}");
        std::thread::yield_now();
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}

/// Polls `check` every 200 ms until it returns `Some`; after `seconds`, panics naming `what` and
/// with `context()` (the state that explains the wait).
pub fn eventually<T>(
    seconds: u64,
    what: &str,
    context: impl Fn() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let started = std::time::Instant::now();
    let deadline = started + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(value) = check() {
            log_if_slow(what, started);
            return value;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: not within {seconds}s\n{}", context());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A fresh, empty folder `<temp>/<tag>-<pid>`.
pub fn fresh_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary folder");
    dir
}

/// A synthetic Search-R1 world of five capitals in `dir`: `corpus.jsonl` (a passage each),
/// `train.jsonl` (a question each) and `test.jsonl` (the first two questions).
pub fn write_capitals(dir: &Path) {
    use serde_json::{Value, json};
    let facts = [
        ("France", "Paris"),
        ("Germany", "Berlin"),
        ("Italy", "Rome"),
        ("Spain", "Madrid"),
        ("Peru", "Lima"),
    ];
    let write = |name: &str, rows: Vec<Value>| {
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(dir.join(name), text).expect("write the synthetic data");
    };
    let passage = |(i, (country, city)): (usize, &(&str, &str))| {
        let contents = format!("\"{city}\"\n{city} is the capital of {country}.");
        json!({"id": i.to_string(), "contents": contents})
    };
    write("corpus.jsonl", facts.iter().enumerate().map(passage).collect());
    let questions = |take: usize, tag: &str| -> Vec<Value> {
        let question = |(i, (country, city)): (usize, &(&str, &str))| {
            let content = format!("Capital of {country}? Search, then answer.");
            let messages = [json!({"role": "user", "content": content})];
            json!({"id": format!("{tag}{i}"), "messages": messages, "answer": city})
        };
        facts.iter().take(take).enumerate().map(question).collect()
    };
    write("train.jsonl", questions(5, "q"));
    write("test.jsonl", questions(2, "t"));
}

/// The capitals world ([`write_capitals`]) in `dir`, indexed with BM25 in `dir/index` and served
/// by `kart retriever serve` on a free loopback port: the server, once ready, and its URL.
pub fn capitals_retriever(dir: &Path) -> (Child, String) {
    write_capitals(dir);
    corpus_retriever(dir)
}

/// `dir/corpus.jsonl` indexed with BM25 in `dir/index` and served by `kart retriever serve` on a
/// free loopback port: the server, once ready, and its URL.
pub fn corpus_retriever(dir: &Path) -> (Child, String) {
    let index = dir.join("index");
    let status = std::process::Command::new(binary("kart"))
        .args(["retriever", "index", "--method", "bm25", "--corpus"])
        .arg(dir.join("corpus.jsonl"))
        .arg("--out")
        .arg(&index)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let port = free_port();
    let mut child = Child(
        std::process::Command::new(binary("kart"))
            .args(["retriever", "serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--index"])
            .arg(&index)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/readyz"), &mut child, std::time::Duration::from_secs(300));
    (child, url)
}

/// The records of a training run's `metrics.jsonl` in `output_dir`, in order: the complete lines
/// (a running trainer may be writing the last one).
pub fn step_records(output_dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(output_dir.join("metrics.jsonl")).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete.lines().map(|l| serde_json::from_str(l).expect("a JSON record")).collect()
}

/// A `kart train` config of `steps` steps on the fixture model and the capitals world in `dir`
/// ([`write_capitals`]), through the rollout workers at `workers`, writing into `out`; callers
/// add the keys their test is about.
pub fn capitals_train_config(dir: &Path, out: &Path, workers: &[&str], steps: u64) -> serde_json::Value {
    serde_json::json!({
        "model": shared_dir().join("fixtures/models/tiny-qwen2"),
        "output_dir": out,
        "total_steps": steps,
        "seed": 3,
        "data": {"train": dir.join("train.jsonl")},
        "batch": {"prompts": 2, "n": 2, "mini_batch_prompts": 1, "micro_batch_size": 2},
        "optim": {"lr": 1e-4},
        "rollout": {
            "urls": workers,
            "env": {"kind": "search-r1", "max_turns": 2, "max_response_length": 16, "max_obs_length": 48},
        },
        "host": "127.0.0.1",
        "port": 0,
    })
}

/// `kart rollout serve` on the fixture model with `engine` (a config's `engine` value) and the
/// retriever at `retriever_url`, its config written to `dir/rollout.json`, on a free loopback
/// port: the process, once ready, and its URL.
pub fn rollout_worker(dir: &Path, engine: serde_json::Value, retriever_url: &str) -> (Child, String) {
    rollout_worker_on(dir, &shared_dir().join("fixtures/models/tiny-qwen2"), engine, retriever_url)
}

/// [`rollout_worker`] on the model folder `model`.
pub fn rollout_worker_on(
    dir: &Path,
    model: &Path,
    engine: serde_json::Value,
    retriever_url: &str,
) -> (Child, String) {
    let port = free_port();
    let config = dir.join("rollout.json");
    let body = serde_json::json!({
        "host": "127.0.0.1", "port": port, "model": model, "engine": engine, "retriever_url": retriever_url,
    });
    std::fs::write(&config, body.to_string()).expect("write the worker's config");
    let mut child = Child(
        std::process::Command::new(binary("kart"))
            .args(["rollout", "serve", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start kart rollout serve"),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/readyz"), &mut child, std::time::Duration::from_secs(300));
    (child, url)
}

/// The steps of the records of a training run's `metrics.jsonl` in `output_dir`, in order.
pub fn steps_logged(output_dir: &Path) -> Vec<u64> {
    step_records(output_dir).iter().map(|r| r["step"].as_f64().unwrap_or(-1.0) as u64).collect()
}

/// The value of the sample `series` (a name with its labels as the text format writes them, e.g.
/// `kart_x_total{kind="a"}`) in a Prometheus text exposition.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Every file under `dir`, depth first (none when it does not exist).
pub fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk_files(&path)) } else { files.push(path) }
    }
    files.sort();
    files
}
