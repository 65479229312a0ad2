//! `kart train` keeping SGLang servers on its weights, against two stand-in SGLang servers
//! (`scripts/standins/sglang.py`, SGLang's HTTP endpoints) behind a real rollout worker and a real
//! retriever.
//!
//! - `sglang_disk`: every replica loads every version as its `weight_version`, a failed update is
//!   retried, the tokens carry the version that sampled them (so staleness is true), and a
//!   replica that keeps failing fails the run, naming it, rather than letting it train on
//!   replicas left on different weights; with LoRA the versions are the adapters alone, each
//!   loaded under its own name, which the worker's requests give;
//! - `sglang_broadcast`: the servers' workers (one, and two tensor-parallel ones) join the
//!   trainer's group with `torch.distributed` over Gloo and receive every version in buckets, bit
//!   for bit the trainer's weights; a server restarted mid-run joins a new group and catches up;
//!   a server that keeps failing fails the run;
//! - `http_pull` through SGLang workers, which would leave the servers on their first weights,
//!   fails at the first publish;
//! - `vllm_broadcast`, against two stand-in vLLM servers (`scripts/standins/vllm.py`, vLLM's RL
//!   routes): every version is sent between a pause and a resume, each tensor broadcast to the
//!   workers over Gloo, bit for bit the trainer's weights, the version finishing the update and
//!   read back by the worker for its tokens; a server that keeps failing fails the run.

use kart_tests::{Child, binary, capitals_retriever, capitals_train_config, free_port, fresh_dir, python};
use kart_tests::{eventually, http, repo_root, rollout_worker, shared_dir, step_records, wait_ready};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const STEPS: u64 = 3;

/// Which stand-in serves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    Sglang,
    Vllm,
}

/// How a stand-in server behaves.
#[derive(Clone, Copy, Default)]
struct Replica {
    /// Updates answered with a failure first.
    fail_updates: u32,
    /// Seconds per generated token (SGLang).
    token_seconds: f64,
    /// Tensor-parallel workers (0: one).
    tp: usize,
}

/// A stand-in SGLang server `name` in `dir` on `port`: the process, its URL and the file it
/// records accepted updates in; its workers write the weights they receive under
/// `dir/received-{name}`.
fn sglang_on(dir: &Path, name: &str, port: u16, replica: Replica) -> (Child, String, PathBuf) {
    server_on(Server::Sglang, dir, name, port, replica)
}

/// A stand-in `server` as [`sglang_on`] starts one.
fn server_on(
    server: Server,
    dir: &Path,
    name: &str,
    port: u16,
    replica: Replica,
) -> (Child, String, PathBuf) {
    let record = dir.join(format!("{name}.jsonl"));
    let received = dir.join(format!("received-{name}"));
    std::fs::create_dir_all(&received).unwrap();
    let mut command = Command::new(python());
    match server {
        Server::Sglang => command
            .arg(repo_root().join("scripts/standins/sglang.py"))
            .args(["--token-seconds", &replica.token_seconds.to_string()]),
        Server::Vllm => command.arg(repo_root().join("scripts/standins/vllm.py")),
    };
    let mut child = Child(
        command
            .arg(shared_dir().join("fixtures/models/tiny-qwen2"))
            .arg(port.to_string())
            .arg("--record")
            .arg(&record)
            .args(["--fail-updates", &replica.fail_updates.to_string()])
            .args(["--tp", &replica.tp.max(1).to_string()])
            .arg("--save")
            .arg(&received)
            .args(["--group-timeout", "30"])
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/health"), &mut child, Duration::from_secs(300));
    (child, url, record)
}

/// A retriever, two stand-in SGLang servers `a` and `b` and a rollout worker generating with
/// both, in a fresh `dir`.
struct Setup {
    dir: PathBuf,
    a: (Child, String, PathBuf),
    b: (Child, String, PathBuf),
    _retriever: Child,
    _worker: Child,
    worker: String,
}

impl Setup {
    /// Servers `b` failing its first `b_failures` updates.
    fn start(tag: &str, b_failures: u32) -> Setup {
        Setup::with(tag, Replica::default(), Replica { fail_updates: b_failures, ..Replica::default() })
    }

    /// Servers that generate a token every `token_seconds`.
    fn start_slow(tag: &str, token_seconds: f64) -> Setup {
        let replica = Replica { token_seconds, ..Replica::default() };
        Setup::with(tag, replica, replica)
    }

    fn with(tag: &str, a: Replica, b: Replica) -> Setup {
        Setup::serving(Server::Sglang, tag, a, b)
    }

    /// Servers `a` and `b` of the `server` kind.
    fn serving(server: Server, tag: &str, a: Replica, b: Replica) -> Setup {
        let dir = fresh_dir(tag);
        let (retriever, retriever_url) = capitals_retriever(&dir);
        let a = server_on(server, &dir, "a", free_port(), a);
        let b = server_on(server, &dir, "b", free_port(), b);
        let engine = match server {
            Server::Sglang => json!({"kind": "sglang", "urls": [a.1, b.1]}),
            Server::Vllm => json!({"kind": "vllm", "urls": [a.1, b.1], "model": "tiny-qwen2"}),
        };
        let (worker, url) = rollout_worker(&dir, engine, &retriever_url);
        Setup { dir, a, b, _retriever: retriever, _worker: worker, worker: url }
    }

    /// Runs `kart train` for [`STEPS`] steps through the worker, publishing into `dir/weights`
    /// for both servers, its config changed by `adjust`; whether it succeeded, and its log.
    fn train(&self, adjust: impl FnOnce(&mut Value)) -> (bool, String) {
        let status = self.trainer(adjust).wait().unwrap();
        (status.success(), self.log())
    }

    /// `kart train` as in [`Setup::train`], running, its output in `dir/train.log`.
    fn trainer(&self, adjust: impl FnOnce(&mut Value)) -> std::process::Child {
        let dir = &self.dir;
        let mut config = capitals_train_config(dir, &dir.join("out"), &[&self.worker], STEPS);
        let replicas = [&self.a.1, &self.b.1];
        config["weight_sync"] = json!({"kind": "sglang_disk", "path": dir.join("weights"), "urls": replicas});
        adjust(&mut config);
        let path = dir.join("train.json");
        std::fs::write(&path, config.to_string()).unwrap();
        let log = std::fs::File::create(dir.join("train.log")).unwrap();
        Command::new(binary("kart"))
            .args(["train", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// What the trainer logged.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("train.log")).unwrap()
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
    let (succeeded, log) = setup.train(|_| {});
    assert!(succeeded, "{log}");
    let expected: Vec<(String, String)> = (0..=STEPS)
        .map(|v| (v.to_string(), dir.join("weights").join(format!("v{v}")).display().to_string()))
        .collect();
    assert_eq!(updates(a_record), expected, "replica a got every version, in order");
    assert_eq!(updates(b_record), expected, "replica b too, its failed first update retried");
    let flags: Vec<Value> = entries(a_record).into_iter().map(|e| e["abort_all_requests"].clone()).collect();
    assert!(flags.iter().all(|f| *f == false), "updates wait for running requests by default: {flags:?}");
    assert!(log.contains("updating a replica failed; retrying"), "{log}");
    let records = step_records(&dir.join("out"));
    assert_eq!(records.len() as u64, STEPS, "{records:?}");
    for record in &records {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the version the servers report: {record}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// With LoRA every version reaches every replica as the adapters alone, loaded under a name of
/// its own (SGLang loads a name once), made the server's version, the one before it kept and
/// older ones unloaded; the worker's requests name the adapter of the server's version, and
/// their tokens carry it.
#[test]
fn a_lora_run_publishes_its_adapters_alone_and_requests_name_them() {
    let setup = Setup::start("kart-sglang-lora", 0);
    let dir = &setup.dir;
    let (succeeded, log) = setup.train(|config| config["lora"] = json!({"r": 2}));
    assert!(succeeded, "{log}");
    let name = |v: u64| format!("kart-policy-v{v}");
    for record in [&setup.a.2, &setup.b.2] {
        let entries = entries(record);
        let updates: Vec<&Value> = entries.iter().filter(|e| e.get("generated_by").is_none()).collect();
        let mut expected = Vec::new();
        for v in 0..=STEPS {
            let folder = dir.join("weights").join(format!("v{v}"));
            expected.push(json!({"lora_load": name(v), "lora_path": folder}));
            expected.push(json!({"version_update": v.to_string(), "abort_all_requests": false}));
            if v >= 2 {
                expected.push(json!({"lora_unload": name(v - 2)}));
            }
        }
        assert_eq!(updates, expected.iter().collect::<Vec<_>>(), "{}", record.display());
        assert!(updates.iter().all(|u| u.get("model_path").is_none()), "no full model: {updates:?}");
        let named: Vec<&Value> = entries.iter().filter_map(|e| e.get("generated_by")).collect();
        assert!(!named.is_empty(), "the worker's requests name the adapters");
        let versions: Vec<String> = (0..STEPS).map(name).collect();
        assert!(named.iter().all(|n| versions.iter().any(|v| n == &v.as_str())), "{named:?}");
    }
    for v in 0..=STEPS {
        let folder = dir.join("weights").join(format!("v{v}"));
        assert!(!folder.exists() || folder.join("adapter_config.json").is_file(), "{}", folder.display());
    }
    let records = step_records(&dir.join("out"));
    assert_eq!(records.len() as u64, STEPS, "{records:?}");
    for record in &records {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the adapter's version: {record}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_replica_that_keeps_failing_fails_the_run_naming_it() {
    let setup = Setup::start("kart-sglang-sync-failing", 100);
    let (dir, a_record, b) = (&setup.dir, &setup.a.2, &setup.b.1);
    let (succeeded, log) = setup.train(|_| {});
    assert!(!succeeded, "the run went on with a replica on other weights: {log}");
    assert!(log.contains("weights v0 reached 1 of 2 SGLang replicas"), "{log}");
    assert!(
        log.contains(b.as_str()) && log.contains("injected failure"),
        "the failing replica and its reason: {log}"
    );
    assert_eq!(updates(a_record).len(), 1, "the healthy replica loaded v0");
    assert!(step_records(&dir.join("out")).is_empty(), "no step trained");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Replaces server `a` of `setup` by a fresh one (`a-restarted`, on the same address) once `a`
/// took `version`, the trainer held still meanwhile.
fn restart_a_after(setup: &mut Setup, trainer: &std::process::Child, version: &str, replica: Replica) {
    let a_port: u16 = setup.a.1.rsplit(':').next().unwrap().parse().unwrap();
    let took = |record: &Path| entries(record).iter().any(|e| e["weight_version"].as_str() == Some(version));
    eventually(
        600,
        &format!("replica a at version {version}"),
        || setup.log(),
        || took(&setup.a.2).then_some(()),
    );
    let pid = trainer.id() as libc::pid_t;
    // SAFETY: signals to the trainer this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // The old server goes first: while it holds the port, the readiness poll would reach it and
    // not the new one, which may still be loading when the trainer resumes.
    let _ = setup.a.0.0.kill();
    let _ = setup.a.0.0.wait();
    setup.a = sglang_on(&setup.dir, "a-restarted", a_port, replica);
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
}

#[test]
fn a_restarted_replica_is_brought_to_the_published_version_before_the_next_publish() {
    // Steps of many seconds (a token every 0.4 s: a generation that the restart cut short takes
    // at least 6 s again), several times the watch's interval, so the watch sees the restarted
    // replica before the step ends and the next publish, even on a loaded machine.
    let slow = Replica { token_seconds: 0.4, ..Replica::default() };
    let mut setup = Setup::with("kart-sglang-sync-catch-up", slow, slow);
    let trainer = setup.trainer(|_| {});
    restart_a_after(&mut setup, &trainer, "1", slow);
    let status = { trainer }.wait().unwrap();
    let log = setup.log();
    assert!(status.success(), "{log}");
    let versions: Vec<String> = updates(&setup.a.2).into_iter().map(|(v, _)| v).collect();
    let expected: Vec<String> = (1..=STEPS).map(|v| v.to_string()).collect();
    assert_eq!(versions, expected, "version 1 again, from the watch, before versions 2 and 3: {log}");
    assert!(log.contains("inference replicas caught up"), "{log}");
    std::fs::remove_dir_all(&setup.dir).unwrap();
}

#[test]
fn http_pull_through_sglang_workers_fails_instead_of_training_on_stale_servers() {
    let setup = Setup::start("kart-sglang-sync-pull", 0);
    let (succeeded, log) = setup.train(|config| config["weight_sync"] = json!({"kind": "http_pull"}));
    assert!(!succeeded, "SGLang servers would have kept the base weights: {log}");
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
    let (succeeded, log) = setup.train(|config| config["rollout"]["interruptible"] = json!(true));
    assert!(succeeded, "{log}");
    for record in [&setup.a.2, &setup.b.2] {
        let updates = entries(record);
        assert_eq!(updates.len() as u64, STEPS + 1, "{updates:?}");
        assert!(updates.iter().all(|u| u["abort_all_requests"] == true), "{updates:?}");
    }
    std::fs::remove_dir_all(&setup.dir).unwrap();
}

/// `max_staleness: k` keeps k batches in flight beyond the one trained: against slowed servers,
/// no step trains a token more than k versions behind, and with k = 3 the run is asynchronous
/// (a batch generated on version 0 is trained on a later one).
#[test]
fn no_trajectory_is_trained_more_than_max_staleness_versions_behind() {
    const LONGER: u64 = 5;
    let setup = Setup::start_slow("kart-sglang-staleness", 0.01);
    for k in [0u64, 1, 3] {
        let out = setup.dir.join(format!("out-{k}"));
        let (succeeded, log) = setup.train(|config| {
            config["output_dir"] = json!(out);
            config["total_steps"] = json!(LONGER);
            config["rollout"]["max_staleness"] = json!(k);
            config["weight_sync"]["path"] = json!(setup.dir.join(format!("weights-{k}")));
        });
        assert!(succeeded, "max_staleness {k}: {log}");
        let records = step_records(&out);
        assert_eq!(records.len() as u64, LONGER);
        let worst = records.iter().map(|r| r["staleness/max"].as_f64().unwrap()).fold(0.0, f64::max);
        assert!(worst <= k as f64, "max_staleness {k}: a token {worst} versions behind");
        if k == 3 {
            assert!(worst >= 1.0, "four batches in flight from version 0, yet no stale token");
        }
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
    let rollout =
        std::thread::spawn(move || http().post(url).json(&body).send().and_then(|r| r.text()).unwrap());
    let http = http();
    let generating = |server: &str| -> Option<u64> {
        let answer: Value = http.get(format!("{server}/in_flight")).send().ok()?.json().ok()?;
        answer["tokens"].as_u64()
    };
    eventually(300, "a generation three tokens in", String::new, || {
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

/// `sglang_broadcast` to both servers of `setup`, the group's store on `port`, in buckets of
/// 100 KiB (the model's 390 KB take several).
fn broadcast(setup: &Setup, port: u16) -> Value {
    json!({"kind": "sglang_broadcast", "urls": [setup.a.1, setup.b.1], "master_port": port,
           "bucket_mb": 0.1, "timeout_secs": 120})
}

/// The tensors of a safetensors file: name, dtype, shape and bytes.
fn tensors(file: &Path) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, t)| (name, (format!("{:?}", t.dtype()), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

/// The broadcast updates a stand-in took: `(names, weight_version)` per bucket.
fn buckets(record: &Path) -> Vec<(Vec<String>, Option<String>)> {
    let names = |e: &Value| {
        e["names"].as_array().map(|n| n.iter().map(|n| n.as_str().unwrap().to_string()).collect())
    };
    entries(record)
        .iter()
        .filter_map(|e| Some((names(e)?, e["weight_version"].as_str().map(str::to_string))))
        .collect()
}

/// The versions a stand-in completed through buckets, in order, each checked to have brought
/// every one of `names` since the version before.
fn versions_received(record: &Path, names: &[String]) -> Vec<String> {
    let mut versions = Vec::new();
    let mut since: Vec<String> = Vec::new();
    for (bucket, version) in buckets(record) {
        since.extend(bucket);
        if let Some(version) = version {
            since.sort();
            assert_eq!(since, names, "version {version}: every tensor once, then the version");
            versions.push(version);
            since.clear();
        }
    }
    versions
}

#[test]
fn broadcast_brings_every_worker_the_trainers_weights_bit_for_bit() {
    let two_workers = Replica { tp: 2, ..Replica::default() };
    let setup = Setup::with("kart-sglang-broadcast", Replica::default(), two_workers);
    let port = free_port();
    let (succeeded, log) = setup.train(|config| {
        config["weight_sync"] = broadcast(&setup, port);
        config["weight_sync"]["master_address"] = json!("localhost");
        config["rollout"]["interruptible"] = json!(true);
    });
    assert!(succeeded, "{log}");
    let dir = &setup.dir;
    let trained = tensors(&dir.join("out/model/model.safetensors"));
    let names: Vec<String> = trained.keys().cloned().collect();
    // One group: the trainer rank 0, a's worker rank 1, b's two workers ranks 2 and 3.
    let joined = |record: &Path| -> Vec<Value> {
        entries(record).into_iter().filter(|e| e.get("joined").is_some()).collect()
    };
    let (a_joined, b_joined) = (joined(&setup.a.2), joined(&setup.b.2));
    assert_eq!(a_joined.len(), 1, "{a_joined:?}");
    assert_eq!(a_joined[0]["joined"], b_joined[0]["joined"], "one group");
    assert_eq!((&a_joined[0]["ranks"], &b_joined[0]["ranks"]), (&json!([1]), &json!([2, 3])));
    assert_eq!((&a_joined[0]["world_size"], &a_joined[0]["master_port"]), (&json!(4), &json!(port)));
    assert_eq!(a_joined[0]["master_address"], "localhost");
    let expected: Vec<String> = (0..=STEPS).map(|v| v.to_string()).collect();
    for record in [&setup.a.2, &setup.b.2] {
        assert!(buckets(record).len() as u64 > 2 * (STEPS + 1), "several buckets per version");
        assert_eq!(versions_received(record, &names), expected);
        // With `rollout.interruptible`, each version's first bucket aborts the requests in flight.
        let updates: Vec<Value> = entries(record).into_iter().filter(|e| e.get("names").is_some()).collect();
        let mut first = true;
        for update in &updates {
            assert_eq!(update["abort_all_requests"], first, "{update}");
            first = update["weight_version"].is_string();
        }
    }
    // What each worker holds after the last version is what the trainer saved, bit for bit.
    for (replica, worker) in [("a", 0), ("b", 0), ("b", 1)] {
        let file = dir.join(format!("received-{replica}/v{STEPS}-tp{worker}.safetensors"));
        assert!(tensors(&file) == trained, "{} differs from the trained weights", file.display());
    }
    for record in step_records(&dir.join("out")) {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the version the servers report: {record}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_replica_restarted_mid_run_joins_a_new_group_and_catches_up() {
    const LONGER: u64 = 6;
    let mut setup = Setup::start("kart-sglang-broadcast-restart", 0);
    let port = free_port();
    let sync = broadcast(&setup, port);
    let mut trainer = setup.trainer(|config| {
        config["weight_sync"] = sync;
        config["total_steps"] = json!(LONGER);
    });
    restart_a_after(&mut setup, &trainer, "1", Replica::default());
    let status = trainer.wait().unwrap();
    let log = setup.log();
    assert!(status.success(), "{log}");
    let trained = tensors(&setup.dir.join("out/model/model.safetensors"));
    let names: Vec<String> = trained.keys().cloned().collect();
    let caught_up = versions_received(&setup.a.2, &names);
    assert_eq!(caught_up.last().map(String::as_str), Some(LONGER.to_string().as_str()), "{caught_up:?}");
    assert!(
        !caught_up.contains(&"1".to_string()),
        "the restarted server started after version 1: {caught_up:?}"
    );
    let file = setup.dir.join(format!("received-a-restarted/v{LONGER}-tp0.safetensors"));
    assert!(tensors(&file) == trained, "the restarted server holds the trained weights");
    std::fs::remove_dir_all(&setup.dir).unwrap();
}

/// A run whose replica `b` fails every update under `sync`, retried with a new group each time
/// (after the broadcast's `timeout_secs`), fails naming `b`, before any step.
fn fails_on_b(setup: &Setup, mut sync: Value) {
    sync["timeout_secs"] = json!(3);
    let (succeeded, log) = setup.train(|config| config["weight_sync"] = sync);
    assert!(!succeeded, "the run went on with a replica on other weights: {log}");
    assert!(log.contains("broadcasting weights failed; forming the group again"), "{log}");
    assert!(log.contains(setup.b.1.as_str()) && log.contains("injected failure"), "{log}");
    // Each attempt ends its broadcast (at `timeout_secs`) before the next serves the same port.
    assert!(!log.contains("address already in use"), "{log}");
    assert!(step_records(&setup.dir.join("out")).is_empty(), "no step trained");
    std::fs::remove_dir_all(&setup.dir).unwrap();
}

#[test]
fn a_replica_that_keeps_failing_its_broadcasts_fails_the_run() {
    let setup = Setup::start("kart-sglang-broadcast-failing", 100);
    fails_on_b(&setup, broadcast(&setup, free_port()));
}

/// `vllm_broadcast` to both servers of `setup`, as [`broadcast`].
fn vllm_broadcast(setup: &Setup, port: u16) -> Value {
    json!({"kind": "vllm_broadcast", "urls": [setup.a.1, setup.b.1], "master_port": port,
           "bucket_mb": 0.1, "timeout_secs": 120})
}

#[test]
fn vllm_broadcast_brings_every_worker_the_trainers_weights_bit_for_bit() {
    let two_workers = Replica { tp: 2, ..Replica::default() };
    let setup = Setup::serving(Server::Vllm, "kart-vllm-broadcast", Replica::default(), two_workers);
    let port = free_port();
    let (succeeded, log) = setup.train(|config| config["weight_sync"] = vllm_broadcast(&setup, port));
    assert!(succeeded, "{log}");
    let dir = &setup.dir;
    let trained = tensors(&dir.join("out/model/model.safetensors"));
    let names: Vec<String> = trained.keys().cloned().collect();
    let calls = |record: &Path| entries(record);
    let (a, b) = (calls(&setup.a.2), calls(&setup.b.2));
    // One communicator: the trainer rank 0, a's worker rank 1, b's two workers ranks 2 and 3.
    let init = |calls: &[Value]| calls.iter().find(|c| c["call"] == "init").cloned().unwrap();
    let (a_init, b_init) = (init(&a), init(&b));
    assert_eq!((&a_init["rank_offset"], &b_init["rank_offset"]), (&json!(1), &json!(2)));
    assert_eq!((&a_init["world_size"], &a_init["master_port"]), (&json!(4), &json!(port)));
    for calls in [&a, &b] {
        assert_eq!(calls.iter().filter(|c| c["call"] == "init").count(), 1, "{calls:?}");
        // Each version: paused once the requests finished, opened, every tensor once in several
        // buckets, finished with the version, resumed.
        let mut versions = Vec::new();
        let mut rest = calls.iter().skip_while(|c| c["call"] != "pause");
        while let Some(pause) = rest.next() {
            assert_eq!(pause["mode"], "wait");
            assert_eq!(rest.next().unwrap()["call"], "start");
            let mut sent: Vec<String> = Vec::new();
            let mut buckets = 0;
            let finish = loop {
                let call = rest.next().unwrap();
                if call["call"] != "update" {
                    break call;
                }
                buckets += 1;
                sent.extend(
                    call["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()),
                );
            };
            sent.sort();
            assert_eq!(sent, names, "every tensor once");
            assert!(buckets > 2, "several buckets per version");
            assert_eq!(finish["call"], "finish");
            versions.push(finish["weight_version"].as_str().unwrap().to_string());
            assert_eq!(rest.next().unwrap()["call"], "resume");
        }
        assert_eq!(versions, (0..=STEPS).map(|v| v.to_string()).collect::<Vec<_>>());
    }
    for (replica, worker) in [("a", 0), ("b", 0), ("b", 1)] {
        let file = dir.join(format!("received-{replica}/v{STEPS}-tp{worker}.safetensors"));
        assert!(tensors(&file) == trained, "{} differs from the trained weights", file.display());
    }
    for record in step_records(&dir.join("out")) {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the version /weight_info reports: {record}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_vllm_replica_that_keeps_failing_its_updates_fails_the_run() {
    let failing = Replica { fail_updates: 100, ..Replica::default() };
    let setup = Setup::serving(Server::Vllm, "kart-vllm-broadcast-failing", Replica::default(), failing);
    fails_on_b(&setup, vllm_broadcast(&setup, free_port()));
}
