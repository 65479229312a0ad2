//! Data-parallel `kart train` over Gloo on CPU processes: with a run's recorded rollouts replayed,
//! 2 and 3 ranks started by `--nproc-per-node` end with the same policy as 1 rank, and rank 0
//! alone writes the run's outputs.

use kart_tests::{binary, free_port, fresh_dir, shared_dir, step_records, write_capitals};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tch::Tensor;

const STEPS: u64 = 3;

/// A run's config: 4 prompts of 2 trajectories a step, 2 mini-batches of 2 prompts, micro-batches
/// of 1 to 2 trajectories, 2 PPO epochs, the KL loss and an entropy bonus; f32 on the CPU.
fn config(dir: &Path, out: &Path, extra: Value) -> PathBuf {
    let mut config = json!({
        "model": shared_dir().join("fixtures/models/tiny-qwen2"),
        "output_dir": out,
        "total_steps": STEPS,
        "seed": 5,
        "device": "cpu",
        "data": {"train": dir.join("train.jsonl")},
        "batch": {"prompts": 4, "n": 2, "mini_batch_prompts": 2, "micro_batch_size": 3},
        "algorithm": {"ppo_epochs": 2, "kl_loss": "low_var_kl", "kl_coef": 0.01, "entropy_coef": 0.01},
        "optim": {"lr": 1e-3},
        "rollout": {
            "index": dir.join("index"),
            "env": {"kind": "search-r1", "max_turns": 2, "max_response_length": 12, "max_obs_length": 32},
        },
        "distributed": {"timeout_secs": 120},
        "checkpoint": {"every": 0},
        "host": "127.0.0.1",
        "port": 0,
    });
    merge(&mut config, extra);
    let path = out.with_extension("json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn train(config: &Path, nproc: Option<usize>) {
    let mut command = Command::new(binary("kart"));
    command.args(["train", "--config"]).arg(config).stdout(Stdio::null()).stderr(Stdio::piped());
    if let Some(n) = nproc {
        command.args(["--nproc-per-node", &n.to_string()]).env("MASTER_PORT", free_port().to_string());
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

fn parameters(out: &Path) -> Vec<(String, Tensor)> {
    let mut named = Tensor::read_safetensors(out.join("model/model.safetensors")).unwrap();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

fn max_abs_difference(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

/// A folder with the capitals world, its BM25 index, and `recorded/rollouts.jsonl`: a run that
/// generated its own rollouts (in-process engine) and dumped them.
fn recording(tag: &str) -> (PathBuf, PathBuf) {
    let dir = fresh_dir(tag);
    write_capitals(&dir);
    let indexed = Command::new(binary("kart"))
        .args(["retriever", "index", "--method", "bm25", "--corpus"])
        .arg(dir.join("corpus.jsonl"))
        .arg("--out")
        .arg(dir.join("index"))
        .output()
        .unwrap();
    assert!(indexed.status.success(), "{}", String::from_utf8_lossy(&indexed.stderr));
    let recorded = dir.join("recorded");
    train(&config(&dir, &recorded, json!({"dump_rollouts": true, "total_steps": STEPS})), None);
    let recording = recorded.join("rollouts.jsonl");
    (dir, recording)
}

#[test]
fn ranks_replaying_a_recording_end_with_the_policy_of_one() {
    let (dir, recording) = recording("kart-data-parallel");
    let replay = json!({"rollout": {"replay": recording}});

    let one = dir.join("one");
    train(&config(&dir, &one, replay.clone()), None);
    let reference = parameters(&one);
    let start =
        Tensor::read_safetensors(shared_dir().join("fixtures/models/tiny-qwen2/model.safetensors")).unwrap();
    let moved = start.iter().any(|(n, t)| {
        let (_, trained) = reference.iter().find(|(m, _)| m == n).unwrap();
        (t - trained).abs().max().double_value(&[]) > 1e-4
    });
    assert!(moved, "the replayed run trained the policy");

    for ranks in [2, 3] {
        let out = dir.join(format!("ranks-{ranks}"));
        train(&config(&dir, &out, replay.clone()), Some(ranks));
        let difference = max_abs_difference(&reference, &parameters(&out));
        println!("{ranks} ranks vs 1: max abs parameter difference {difference:e}");
        assert!(difference <= 1e-5, "{ranks} ranks: {difference}");
        let records = step_records(&out);
        assert_eq!(records.len() as u64, STEPS, "rank 0 alone writes metrics.jsonl");
        let one_records = step_records(&one);
        for (a, b) in records.iter().zip(&one_records) {
            let (la, lb) = (a["actor/pg_loss"].as_f64().unwrap(), b["actor/pg_loss"].as_f64().unwrap());
            assert!((la - lb).abs() <= 1e-5 * (1.0 + lb.abs()), "pg_loss {la} vs {lb}");
        }
    }

    // ZeRO-2 and full sharding (FSDP, with activation checkpointing) over 2 ranks as separate
    // processes: the same policy, saved whole by rank 0, and the last step's checkpoint (written
    // by rank 0 while every rank gathers its slices) holds AdamW's whole state.
    let unsharded =
        Tensor::read_safetensors(one.join(format!("checkpoints/step-{STEPS:08}/optimizer.safetensors")))
            .unwrap();
    for (sharding, extra) in [
        ("gradients", json!({"sharding": "gradients"})),
        ("full", json!({"sharding": "full", "activation_checkpointing": true})),
    ] {
        let out = dir.join(format!("ranks-2-{sharding}"));
        let mut sharded = replay.clone();
        merge(&mut sharded, extra);
        train(&config(&dir, &out, sharded), Some(2));
        let difference = max_abs_difference(&reference, &parameters(&out));
        assert!(difference <= 1e-5, "{sharding} on 2 ranks: {difference}");
        let checkpoint = out.join(format!("checkpoints/step-{STEPS:08}"));
        let state = Tensor::read_safetensors(checkpoint.join("optimizer.safetensors")).unwrap();
        assert_eq!(state.len(), unsharded.len(), "{sharding}: a moment of every parameter");
        for (name, tensor) in &unsharded {
            let (_, sharded) =
                state.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{sharding}: {name} missing"));
            let difference = (tensor - sharded).abs().max().double_value(&[]);
            assert!(difference <= 1e-5, "{sharding}: {name}: {difference}");
        }
    }
}

/// The pid of the child of `parent` whose environment has `RANK=rank`.
fn rank_pid(parent: u32, rank: usize) -> Option<i32> {
    let wanted = format!("RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let ppid: u32 = stat.rsplit(") ").next()?.split_whitespace().nth(1)?.parse().ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        let has = environ.split(|&b| b == 0).any(|v| v == wanted.as_bytes());
        (ppid == parent && has).then_some(pid)
    })
}

/// A rank killed with SIGKILL fails the whole attempt within the c10d timeout, and the next
/// attempt resumes every rank from the last checkpoint.
#[test]
fn a_killed_rank_fails_the_attempt_and_the_next_resumes() {
    let (dir, recording) = recording("kart-data-parallel-fault");
    let out = dir.join("run");
    let extra = json!({
        "rollout": {"replay": recording},
        "checkpoint": {"every": 1, "keep": 3},
        "algorithm": {"ppo_epochs": 12},
        "batch": {"micro_batch_size": 1},
        "distributed": {"timeout_secs": 20},
    });
    let config = config(&dir, &out, extra);
    let mut launcher = Command::new(binary("kart"))
        .args(["train", "--nproc-per-node", "2", "--config"])
        .arg(&config)
        .env("MASTER_PORT", free_port().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !out.join("checkpoints/step-00000001").exists() {
        assert!(launcher.try_wait().unwrap().is_none(), "the run ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within {deadline:?}");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    let pid = rank_pid(launcher.id(), 1).expect("rank 1 runs");
    // SAFETY: a signal to a process this test started (through the launcher).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed = Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        // Well past the 20 s configured, yet far short of the default 1800 s: a loaded machine
        // may notice late, but the configured timeout is what ends the attempt.
        assert!(killed.elapsed() < Duration::from_secs(300), "the attempt did not fail within the timeout");
        std::thread::park_timeout(Duration::from_millis(50));
    };
    assert!(!status.success(), "an attempt with a killed rank fails");
    println!("the attempt failed {:?} after rank 1 was killed, exit {status}", killed.elapsed());
    let steps_before = step_records(&out).len();
    assert!(steps_before < STEPS as usize, "the attempt stopped before the end");

    let output = Command::new(binary("kart"))
        .args(["train", "--nproc-per-node", "2", "--resume", "--config"])
        .arg(&config)
        .env("MASTER_PORT", free_port().to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stderr.matches("resuming").count(), 2, "every rank resumes from the checkpoint: {stderr}");
    let steps: Vec<u64> = step_records(&out).iter().map(|r| r["step"].as_f64().unwrap() as u64).collect();
    assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>());
}

/// A rank whose peers never come fails at the rendezvous after `distributed.timeout_secs`, naming
/// it.
#[test]
fn a_rank_alone_fails_at_the_rendezvous_after_the_configured_timeout() {
    let dir = fresh_dir("kart-data-parallel-alone");
    write_capitals(&dir);
    let out = dir.join("run");
    let config = config(
        &dir,
        &out,
        json!({"rollout": {"urls": ["http://127.0.0.1:9"]}, "distributed": {"timeout_secs": 1.5}}),
    );
    let output = Command::new(binary("kart"))
        .args(["train", "--config"])
        .arg(&config)
        .env("WORLD_SIZE", "2")
        .env("RANK", "1")
        .env("MASTER_PORT", free_port().to_string())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("(rank 1 of 2, timeout 1.5s)"), "{stderr}");
}
