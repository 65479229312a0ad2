//! Experiment tracking against the real tools: `kart train` with `tracking.mlflow` sends to a real
//! `mlflow server` (PyPI's, on loopback, its store in SQLite) and with `tracking.tensorboard`
//! writes event files; MLflow's own client and TensorBoard's own event reader read back every
//! metric of every step, equal to `metrics.jsonl` (tests/tracking/read_back.py). A run stopped by
//! SIGTERM is KILLED and its resumed run continues the same MLflow run to FINISHED; a tracking
//! server that is down when the run starts gets everything once it comes up; one that never does
//! costs the metrics, named in a warning, and never the training. The trainer serves its
//! trajectory viewer's API at `/ui` while it trains.

use kart_tests::{
    Child, binary, capitals_train_config, eventually, free_port, fresh_dir, http, python, repo_root,
    rollout_worker, step_records, steps_logged, wait_ready,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A real MLflow tracking server on `port`, its store in `dir`.
fn mlflow_server(dir: &Path, port: u16) -> Child {
    let store = dir.join(format!("mlflow-{port}"));
    std::fs::create_dir_all(&store).unwrap();
    let mut server = Child(
        Command::new(python())
            .args([
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--workers",
                "1",
            ])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", store.join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(store.join("artifacts"))
            .stdout(std::fs::File::create(store.join("server.log")).unwrap())
            .stderr(std::fs::File::create(store.join("server.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("http://127.0.0.1:{port}/health"), &mut server, Duration::from_secs(300));
    server
}

/// tests/tracking/read_back.py's JSON.
fn read_back(args: &[&str]) -> Value {
    let output = Command::new(python())
        .arg(repo_root().join("tests/tracking/read_back.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "read_back.py {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The MLflow run of `out` (its id from the run file) as MLflow's client reads it.
fn mlflow_run(uri: &str, out: &Path) -> (String, Value) {
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("mlflow-run.json")).unwrap()).unwrap();
    let run_id = file["run_id"].as_str().unwrap().to_string();
    let run = read_back(&["mlflow", uri, &run_id]);
    (run_id, run)
}

/// `metrics.jsonl` of `out` as `{key: [[step, value]]}`, nulls (non-finite values) left out.
fn logged(out: &Path) -> BTreeMap<String, Vec<(u64, f64)>> {
    let mut by_key: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for record in step_records(out) {
        let step = record["step"].as_f64().unwrap() as u64;
        for (key, value) in record.as_object().unwrap() {
            if let (true, Some(v)) = (key != "step", value.as_f64()) {
                by_key.entry(key.clone()).or_default().push((step, v));
            }
        }
    }
    by_key
}

/// `{key: [[step, value]]}` of a read-back answer, each series by step.
fn series(answer: &Value) -> BTreeMap<String, Vec<(u64, f64)>> {
    answer
        .as_object()
        .unwrap()
        .iter()
        .map(|(key, points)| {
            let mut points: Vec<(u64, f64)> = points
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
                .collect();
            points.sort_by_key(|p| p.0);
            (key.clone(), points)
        })
        .collect()
}

/// The same keys at the same steps, each value within a few units in the last place of the other:
/// MLflow's store gives some doubles back one unit in the last place off (2.1617556356101628e-10
/// for 2.161755635610163e-10).
fn assert_equal_to_the_last_bit_or_two(
    read: &BTreeMap<String, Vec<(u64, f64)>>,
    expected: &BTreeMap<String, Vec<(u64, f64)>>,
) {
    assert_eq!(read.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    for (key, points) in expected {
        let steps = |p: &[(u64, f64)]| p.iter().map(|&(s, _)| s).collect::<Vec<_>>();
        assert_eq!(steps(&read[key]), steps(points), "{key}");
        for (&(step, got), &(_, want)) in read[key].iter().zip(points) {
            assert!(
                (got - want).abs() <= 4.0 * f64::EPSILON * want.abs(),
                "{key} at step {step}: {got} for {want}"
            );
        }
    }
}

struct Setup {
    dir: PathBuf,
    _retriever: Child,
    _worker: Child,
    worker_url: String,
}

fn setup(tag: &str) -> Setup {
    let dir = fresh_dir(tag);
    let (retriever, retriever_url) = kart_tests::capitals_retriever(&dir);
    let (worker, worker_url) =
        rollout_worker(&dir, json!({"kind": "embedded", "max_batch": 16}), &retriever_url);
    Setup { dir, _retriever: retriever, _worker: worker, worker_url }
}

impl Setup {
    /// A run of `steps` steps into `name`, evaluated every 2 steps, checkpointed every step, with
    /// `tracking`.
    fn config(&self, name: &str, steps: u64, tracking: Value) -> (PathBuf, PathBuf, u16) {
        let out = self.dir.join(name);
        let port = free_port();
        let mut config = capitals_train_config(&self.dir, &out, &[&self.worker_url], steps);
        config["data"]["test"] = json!(self.dir.join("test.jsonl"));
        config["eval"] = json!({"every": 2, "sampled_n": 2});
        config["checkpoint"] = json!({"every": 1, "keep": 2});
        config["dump_rollouts"] = json!(true);
        config["tracking"] = tracking;
        config["port"] = json!(port);
        let path = self.dir.join(format!("{name}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        (path, out, port)
    }
}

fn train(config: &Path, resume: bool, log: &Path) -> Command {
    let mut command = Command::new(binary("kart"));
    command.args(["train", "--config"]).arg(config).stdout(Stdio::null());
    command.stderr(std::fs::File::create(log).unwrap());
    if resume {
        command.arg("--resume");
    }
    command
}

#[test]
fn mlflow_and_tensorboard_hold_every_step_across_a_stop_and_its_resume() {
    let s = setup("kart-tracking");
    let mlflow_port = free_port();
    let _mlflow = mlflow_server(&s.dir, mlflow_port);
    let uri = format!("http://127.0.0.1:{mlflow_port}");
    let tracking = json!({"mlflow": {"tracking_uri": uri, "experiment": "capitals", "run_name": "grpo-a"},
                          "tensorboard": {}});
    let (config, out, trainer_port) = s.config("run", 4, tracking);

    // Stopped by SIGTERM after its second step: KILLED.
    let log = s.dir.join("run-1.log");
    let mut first = Child(train(&config, false, &log).spawn().unwrap());
    let ui = format!("http://127.0.0.1:{trainer_port}/ui/api/summary");
    let client = http();
    let summary = eventually(900, "the trainer's viewer showing its first step", String::new, || {
        assert!(
            first.0.try_wait().unwrap().is_none(),
            "the run ended early: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        let summary: Value = client.get(&ui).send().ok()?.json().ok()?;
        (summary["trajectories"].as_u64()? > 0).then_some(summary)
    });
    assert_eq!(summary["steps"][0]["step"], 1, "{summary}");
    assert_eq!(summary["steps"][0]["trajectories"], 4, "2 prompts x 2: {summary}");
    eventually(900, "step 2 logged", String::new, || steps_logged(&out).contains(&2).then_some(()));
    // SAFETY: signalling the child this handle owns and has not reaped.
    unsafe { libc::kill(first.0.id() as libc::pid_t, libc::SIGTERM) };
    let exit = first.0.wait().unwrap();
    assert_eq!(exit.code(), Some(143), "{}", std::fs::read_to_string(&log).unwrap());
    let stopped_at = *steps_logged(&out).last().unwrap();
    let (run_id, run) = mlflow_run(&uri, &out);
    assert_eq!(run["status"], "KILLED", "{run}");
    assert_eq!((run["run_name"].as_str(), run["experiment"].as_str()), (Some("grpo-a"), Some("capitals")));

    // Resumed: the same MLflow run, to FINISHED.
    let log = s.dir.join("run-2.log");
    let status = train(&config, true, &log).status().unwrap();
    assert!(status.success(), "{}", std::fs::read_to_string(&log).unwrap());
    assert_eq!(steps_logged(&out), vec![0, 1, 2, 3, 4], "stopped after step {stopped_at}");
    let (resumed_id, run) = mlflow_run(&uri, &out);
    assert_eq!(resumed_id, run_id, "a resumed run continues its MLflow run");
    assert_eq!(run["status"], "FINISHED", "{run}");
    // The resolved config as parameters, the newest checkpoint as a tag.
    let params = &run["params"];
    assert_eq!(params["total_steps"], "4", "{params}");
    assert_eq!(params["batch.n"], "2");
    assert_eq!(params["tracking.mlflow.experiment"], "capitals");
    assert_eq!(params["model"], json!(kart_tests::shared_dir().join("fixtures/models/tiny-qwen2")));
    assert_eq!(
        run["tags"]["kart.checkpoint"],
        json!(out.join("checkpoints/step-00000004")),
        "{}",
        run["tags"]
    );

    // Every metric of every step, as metrics.jsonl has it: in MLflow as the double, in TensorBoard
    // as the 32-bit float an event holds.
    let expected = logged(&out);
    assert!(
        expected.contains_key("reward/mean") && expected.contains_key("eval/exact_match"),
        "{expected:?}"
    );
    assert!(expected.len() >= 20, "{} metrics", expected.len());
    assert_equal_to_the_last_bit_or_two(&series(&run["metrics"]), &expected);
    // (Python's protocol buffers hand a float field over as the shortest decimal of the float, so
    // both sides are compared as 32-bit floats.)
    let events = series(&read_back(&["tensorboard", &out.join("tensorboard").display().to_string()]));
    let as_f32 = |m: &BTreeMap<String, Vec<(u64, f64)>>| -> BTreeMap<String, Vec<(u64, f32)>> {
        m.iter()
            .map(|(k, points)| (k.clone(), points.iter().map(|&(s, v)| (s, v as f32)).collect()))
            .collect()
    };
    assert_eq!(as_f32(&events), as_f32(&expected));
    std::fs::remove_dir_all(&s.dir).unwrap();
}

#[test]
fn a_tracking_server_that_is_down_never_stops_training() {
    let s = setup("kart-tracking-down");
    // Down when the run starts, up after its first step: it gets everything.
    let late_port = free_port();
    let uri = format!("http://127.0.0.1:{late_port}");
    let (config, out, _) = s.config("late", 3, json!({"mlflow": {"tracking_uri": uri}}));
    let log = s.dir.join("late.log");
    let mut late = Child(train(&config, false, &log).spawn().unwrap());
    eventually(900, "step 1 logged", String::new, || steps_logged(&out).contains(&1).then_some(()));
    let _mlflow = mlflow_server(&s.dir, late_port);
    let status = late.0.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("cannot be reached"), "the outage is warned of: {stderr}");
    assert!(!stderr.contains("did not reach the server"), "nothing was lost: {stderr}");
    let (_, run) = mlflow_run(&uri, &out);
    assert_eq!(run["status"], "FINISHED", "{run}");
    assert_eq!(run["experiment"], "kart");
    assert_eq!(run["run_name"], "late", "named after the output folder");
    assert_equal_to_the_last_bit_or_two(&series(&run["metrics"]), &logged(&out));

    // Never up: the run trains to its end, and says what MLflow lost.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (config, out, _) = s.config("lost", 2, json!({"mlflow": {"tracking_uri": dead, "flush_secs": 1}}));
    let log = s.dir.join("lost.log");
    let status = train(&config, false, &log).status().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{stderr}");
    assert_eq!(steps_logged(&out), vec![0, 1, 2]);
    assert!(stderr.contains("did not reach the server") && stderr.contains("0-2"), "{stderr}");

    // A bad tracking setting is refused before training, naming it.
    let (config, _, _) = s.config("bad", 1, json!({"mlflow": {"tracking_uri": "mlflow:5000"}}));
    let output = Command::new(binary("kart")).args(["train", "--config"]).arg(&config).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("tracking.mlflow.tracking_uri") && stderr.contains("mlflow:5000"), "{stderr}");
    std::fs::remove_dir_all(&s.dir).unwrap();
}
