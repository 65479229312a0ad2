//! `kart train` against a real rollout worker (`kart rollout serve`, embedded engine on a fixture
//! model) and a real retriever (`kart retriever serve`): a short run completes, pushes its weights
//! to the worker, a run killed with SIGKILL resumes from its checkpoint with the same data order,
//! and two ranks stopped by SIGTERM (a pod preempted or evicted) checkpoint the step they finished
//! and resume from it.

use kart_tests::{
    Child, binary, capitals_retriever, fresh_dir, rollout_worker, shared_dir, step_records, steps_logged,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 4;

struct Services {
    _retriever: Child,
    _worker: Child,
    worker_url: String,
}

fn start_services(dir: &Path) -> Services {
    let (retriever, retriever_url) = capitals_retriever(dir);
    let engine = json!({"kind": "embedded", "max_batch": 16});
    let (worker, worker_url) = rollout_worker(dir, engine, &retriever_url);
    Services { _retriever: retriever, _worker: worker, worker_url }
}

fn train_config(dir: &Path, services: &Services, out: &Path) -> PathBuf {
    let config = json!({
        "model": shared_dir().join("fixtures/models/tiny-qwen2"),
        "output_dir": out,
        "total_steps": STEPS,
        "seed": 3,
        "data": {"train": dir.join("train.jsonl"), "test": dir.join("test.jsonl")},
        "batch": {"prompts": 2, "n": 2, "mini_batch_prompts": 1, "micro_batch_size": 2},
        "optim": {"lr": 1e-4},
        "rollout": {
            "urls": [services.worker_url],
            "env": {"kind": "search-r1", "max_turns": 2, "max_response_length": 16, "max_obs_length": 48},
        },
        "checkpoint": {"every": 2, "keep": 3},
        "eval": {"every": 2, "sampled_n": 3},
        "dump_rollouts": true,
        "host": "127.0.0.1",
        "port": 0,
    });
    let path = out.with_extension("json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn train(config: &Path, resume: bool) -> Command {
    let mut command = Command::new(binary("kart"));
    command.args(["train", "--config"]).arg(config).stdout(Stdio::null()).stderr(Stdio::null());
    if resume {
        command.arg("--resume");
    }
    command
}

/// The prompt ids each step trained on, from `rollouts.jsonl`.
fn prompts_by_step(out: &Path) -> BTreeMap<u64, Vec<String>> {
    let mut by_step: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(out.join("rollouts.jsonl")).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        by_step.entry(v["step"].as_u64().unwrap()).or_default().push(v["id"].as_str().unwrap().to_string());
    }
    for ids in by_step.values_mut() {
        ids.sort();
    }
    by_step
}

#[test]
fn short_run_completes_and_resumes_after_sigkill() {
    let dir = fresh_dir("kart-train-e2e");
    let services = start_services(&dir);

    // An uninterrupted run.
    let out_a = dir.join("run-a");
    let status_file = dir.join("termination-log");
    let status = train(&train_config(&dir, &services, &out_a), false)
        .env("KART_STATUS_FILE", &status_file)
        .status()
        .unwrap();
    assert!(status.success(), "kart train failed: {status}");
    assert_eq!(
        steps_logged(&out_a),
        vec![0, 1, 2, 3, 4],
        "an evaluation at step 0, then one record per step"
    );
    // Every evaluation decodes the two held-out prompts greedily once and samples each three times.
    for record in step_records(&out_a) {
        let evaluated = (record["step"].as_f64().unwrap() as u64).is_multiple_of(2);
        assert_eq!(
            record.get("eval/trajectories").and_then(Value::as_f64),
            evaluated.then_some(2.0),
            "{record}"
        );
        assert_eq!(record.get("eval_sampled/trajectories").and_then(Value::as_f64), evaluated.then_some(6.0));
        if evaluated {
            let reward = record["eval_sampled/reward"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&reward), "eval_sampled/reward = {reward}");
        }
    }
    assert!(out_a.join("model/config.json").is_file() && out_a.join("model/tokenizer.json").is_file());
    assert!(out_a.join("checkpoints/step-00000004/optimizer.safetensors").is_file());
    let plan = prompts_by_step(&out_a);
    assert_eq!(plan.len() as u64, STEPS);
    assert!(plan.values().all(|ids| ids.len() == 4), "2 prompts x 2 trajectories per step: {plan:?}");
    // A new run is refused a folder holding this one, which it would otherwise mix with its own.
    let logged = std::fs::read_to_string(out_a.join("metrics.jsonl")).unwrap();
    let again = train(&train_config(&dir, &services, &out_a), false).stderr(Stdio::piped()).output().unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success());
    assert!(stderr.contains("a checkpoint of step 4") && stderr.contains("--resume"), "{stderr}");
    assert_eq!(std::fs::read_to_string(out_a.join("metrics.jsonl")).unwrap(), logged);
    // The worker pulled every published version from the trainer.
    let metrics =
        kart_tests::http().get(format!("{}/metrics", services.worker_url)).send().unwrap().text().unwrap();
    assert!(metrics.contains(&format!("kart_rollout_policy_version {STEPS}")), "{metrics}");

    // A run killed as soon as its first checkpoint exists, then resumed.
    let out_b = dir.join("run-b");
    let config_b = train_config(&dir, &services, &out_b);
    let mut first = Child(train(&config_b, false).spawn().unwrap());
    let checkpoint = out_b.join("checkpoints/step-00000002/trainer_state.json");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !checkpoint.is_file() {
        assert!(first.0.try_wait().unwrap().is_none(), "the run ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within 300 s");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    first.0.kill().unwrap(); // SIGKILL
    first.0.wait().unwrap();
    let status = train(&config_b, true).status().unwrap();
    assert!(status.success(), "the resumed run failed: {status}");
    assert_eq!(steps_logged(&out_b), vec![0, 1, 2, 3, 4], "steps after the checkpoint are not logged twice");
    let resumed = prompts_by_step(&out_b);
    assert_eq!(resumed, plan, "the resumed run trained the same prompts in the same steps");
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(out_b.join("checkpoints/step-00000004/trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["step"], 4);
    assert_eq!(state["policy_version"], 4);

    // Two ranks (a sharded optimiser: the checkpoint needs both) stopped by SIGTERM to their
    // launcher after the first step, with no periodic checkpoint due: the step they finished is
    // checkpointed, the run exits 143 reporting `stopped`, and a resumed run trains the rest.
    let out_c = dir.join("run-c");
    let config_c = train_config(&dir, &services, &out_c);
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_c).unwrap()).unwrap();
    config["checkpoint"]["every"] = json!(100);
    config["sharding"] = json!("optimizer");
    std::fs::write(&config_c, config.to_string()).unwrap();
    let status_c = dir.join("termination-log-c");
    let ranks = |resume: bool| {
        let mut command = train(&config_c, resume);
        command
            .args(["--nproc-per-node", "2"])
            .env("MASTER_PORT", kart_tests::free_port().to_string())
            .env("KART_STATUS_FILE", &status_c);
        command
    };
    let log_c = dir.join("run-c.log");
    let mut stopped = Child(ranks(false).stderr(std::fs::File::create(&log_c).unwrap()).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(600);
    while !steps_logged(&out_c).contains(&1) {
        assert!(stopped.0.try_wait().unwrap().is_none(), "the run ended before its first step");
        assert!(Instant::now() < deadline, "no step within 600 s");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    // SAFETY: signalling the child this handle owns and has not reaped.
    unsafe { libc::kill(stopped.0.id() as libc::pid_t, libc::SIGTERM) };
    let exit = stopped.0.wait().unwrap();
    let stderr = std::fs::read_to_string(&log_c).unwrap();
    let last = *steps_logged(&out_c).last().unwrap();
    assert!((1..STEPS).contains(&last), "stopped after step {last}");
    assert_eq!(exit.code(), Some(143), "{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&status_c).unwrap()).unwrap();
    assert_eq!(
        (report["phase"].as_str(), report["step"].as_u64()),
        (Some("stopped"), Some(last)),
        "{report}"
    );
    let written: Vec<String> = std::fs::read_dir(out_c.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(written, [format!("step-{last:08}")], "the step finished before the signal, only");
    assert!(out_c.join(format!("checkpoints/step-{last:08}/optimizer.safetensors")).is_file());
    let status = ranks(true).status().unwrap();
    assert!(status.success(), "the resumed run failed: {status}");
    assert_eq!(steps_logged(&out_c), vec![0, 1, 2, 3, 4], "each step logged once");
    assert_eq!(prompts_by_step(&out_c), plan, "the same prompts in the same steps as without a stop");
}

/// A two-role workflow (two solvers, a judge picking one of them) trains through `kart train`'s
/// in-process pool: each step's batch holds every role's trajectories of each prompt in the
/// prompt's group, the judge reads the solvers' outputs, and each role's reward is recorded.
#[test]
fn a_workflow_trains_every_role_of_a_prompt_in_its_group() {
    let dir = fresh_dir("kart-train-workflow");
    kart_tests::write_capitals(&dir);
    let out = dir.join("run");
    let agent = |max_response_length: u32| {
        json!({"kind": "tools", "functions": [], "max_response_length": max_response_length,
               "max_trajectory_tokens": 512, "answer": "content", "score": "sub_em"})
    };
    let mut config = kart_tests::capitals_train_config(&dir, &out, &[], 2);
    config["batch"] = json!({"prompts": 2, "n": 1, "mini_batch_prompts": 2, "micro_batch_size": 3});
    config["rollout"]["env"] = json!({"kind": "workflow", "roles": [
        {"name": "solver", "count": 2, "env": agent(12)},
        {"name": "judge", "input": "{question}\n{solver}\nEnd with Judgment: IDX.", "select": {"from": "solver"},
         "env": agent(6)},
    ], "reward_sharing": {"kind": "mix", "alpha": 0.5}});
    config["dump_rollouts"] = json!(true);
    let path = dir.join("train.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let status = train(&path, false).status().unwrap();
    assert!(status.success(), "kart train failed: {status}");

    let mut groups: BTreeMap<(u64, String), Vec<Value>> = BTreeMap::new();
    for line in std::fs::read_to_string(out.join("rollouts.jsonl")).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let key = (v["step"].as_u64().unwrap(), v["prompt_id"].as_str().unwrap().to_owned());
        groups.entry(key).or_default().push(v);
    }
    assert_eq!(groups.len(), 4, "2 steps x 2 prompts: {:?}", groups.keys());
    for ((_, prompt), group) in &groups {
        let mut ids: Vec<&str> = group.iter().map(|t| t["id"].as_str().unwrap()).collect();
        ids.sort();
        let expected =
            [format!("{prompt}#0/judge#0"), format!("{prompt}#0/solver#0"), format!("{prompt}#0/solver#1")];
        assert_eq!(ids, expected, "every role's trajectories in the prompt's group");
        let judge = group.iter().find(|t| t["stats"]["role"] == "judge").unwrap();
        let prompt_text = judge["segments"][0]["text"].as_str().unwrap();
        assert!(
            prompt_text.contains("#### Solution 1\n") && prompt_text.contains("#### Solution 2\n"),
            "{prompt_text}"
        );
    }
    let records = step_records(&out);
    let trained: Vec<&Value> = records.iter().filter(|r| r.get("role/solver/reward").is_some()).collect();
    assert_eq!(trained.len(), 2, "{records:?}");
    for r in trained {
        assert!(r["role/judge/reward"].is_f64() && r["actor/pg_loss"].is_f64(), "{r}");
        assert_eq!(
            r["trajectories/completed"].as_f64().unwrap() + r["trajectories/truncated"].as_f64().unwrap(),
            6.0
        );
    }
}

/// Dotted `key=value` overrides after the config file reach the config (a bad value is refused
/// naming its key), and one that breaks a rule is refused by the config's own check.
#[test]
fn overrides_on_the_command_line_change_the_config() {
    let dir = fresh_dir("kart-train-overrides");
    kart_tests::write_capitals(&dir);
    let out = dir.join("run");
    let path = dir.join("train.json");
    std::fs::write(&path, kart_tests::capitals_train_config(&dir, &out, &[], 1).to_string()).unwrap();
    let stderr = |overrides: &[&str]| {
        let output = Command::new(binary("kart"))
            .args(["train", "--config"])
            .arg(&path)
            .args(overrides)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (ok, err) = stderr(&["batch.mini_batch_prompts=3"]);
    assert!(!ok && err.contains("batch.mini_batch_prompts = 3"), "{err}");
    let (ok, err) = stderr(&["optim.lr=fast"]);
    assert!(!ok && err.contains("invalid type: string \"fast\", expected f64"), "{err}");
    let (ok, err) = stderr(&["optim.learning_rate=1e-6"]);
    assert!(!ok && err.contains("unknown field `learning_rate`"), "{err}");
    let (ok, err) = stderr(&["lr"]);
    assert!(!ok && err.contains("override = lr: expected key=value"), "{err}");
    assert!(!out.exists(), "nothing ran");
}

/// LoRA through `kart train`: checkpoints and `model/` hold the adapters as a PEFT folder (not a
/// copy of the model), the worker serves every version (pulling the adapters alone, which its
/// embedded engine applies over its base), and a run killed after its first checkpoint resumes
/// from the adapters it saved.
#[test]
fn a_lora_run_checkpoints_its_adapters_and_resumes_from_them() {
    let dir = fresh_dir("kart-train-lora");
    let services = start_services(&dir);
    let out = dir.join("run");
    let path = train_config(&dir, &services, &out);
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["lora"] = json!({"r": 4, "lora_alpha": 8, "target_modules": "all-linear"});
    std::fs::write(&path, config.to_string()).unwrap();

    let mut first = Child(train(&path, false).spawn().unwrap());
    let checkpoint = out.join("checkpoints/step-00000002");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !checkpoint.join("trainer_state.json").is_file() {
        assert!(first.0.try_wait().unwrap().is_none(), "the run ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within 300 s");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let adapter = |dir: &Path| std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let saved = checkpoint.join("policy");
    let peft: Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!((peft["peft_type"].as_str(), peft["r"].as_u64()), (Some("LORA"), Some(4)));
    assert!(!saved.join("model.safetensors").exists(), "a checkpoint holds the adapters, not the model");

    let status = train(&path, true).status().unwrap();
    assert!(status.success(), "the resumed run failed: {status}");
    assert_eq!(steps_logged(&out), vec![0, 1, 2, 3, 4]);
    let last = out.join("checkpoints/step-00000004/policy");
    assert_ne!(adapter(&last), adapter(&saved), "the resumed run trained the adapters on");
    assert_eq!(adapter(&out.join("model")), adapter(&last), "model/ is the last adapter");
    let metrics =
        kart_tests::http().get(format!("{}/metrics", services.worker_url)).send().unwrap().text().unwrap();
    assert!(metrics.contains(&format!("kart_rollout_policy_version {STEPS}")), "{metrics}");
    assert!(!metrics.contains(r#"outcome="error""#), "every load of the adapters succeeded: {metrics}");
    // What the worker pulled: the adapters alone, under PEFT's names.
    let kept = std::fs::read_dir(out.join("weights")).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let published = std::fs::read(&kept).unwrap();
    let names: Vec<String> = safetensors::SafeTensors::deserialize(&published)
        .unwrap()
        .names()
        .into_iter()
        .map(String::from)
        .collect();
    assert!(
        !names.is_empty() && names.iter().all(|n| n.contains(".lora_A.") || n.contains(".lora_B.")),
        "{names:?}"
    );
    let model = shared_dir().join("fixtures/models/tiny-qwen2/model.safetensors");
    let model = std::fs::metadata(model).unwrap().len();
    assert!((published.len() as u64) * 4 < model, "{} bytes published", published.len());
}
