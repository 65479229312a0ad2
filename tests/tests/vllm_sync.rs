//! `kart train` keeping real vLLM servers (vLLM's CPU build, `kart_tests::vllm`) on its weights
//! with `vllm_disk`, behind a real rollout worker and a real retriever: every replica reloads
//! every version in place and reports it, the tokens carry it (no step trains on stale tokens),
//! and after the last step each replica serves the trained model: its greedy tokens are those
//! of kart's embedded engine on the last published weights.
//!
//! The servers and the worker are a RolloutPool with `engine.kind: vllm` as the operator builds
//! it: each replica runs the container of the operator's inference Deployment (`vllm serve`, its
//! arguments and environment), the worker the engine of the operator's rendered config. The
//! Pods themselves wait for a node that runs images (the test cluster's node runs kart's only).

use kart_core::engine::Engine;
use kart_core::generation::{GenerationRequest, SamplingParams};
use kart_model::{CausalLm, EmbeddedEngine};
use kart_operator::build::{Settings, rollout_pool};
use kart_operator::crd::RolloutPool;
use kart_rollout::engines::vllm::VllmEngine;
use kart_tests::vllm::{Vllm, serving_copy, serving_model};
use kart_tests::{
    binary, capitals_retriever, capitals_train_config, fresh_dir, rollout_worker_on, step_records,
};
use kart_tokenizer::Tokenizer;
use serde_json::json;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const STEPS: u64 = 3;
/// The pool's `config.engine.model`: the name the replicas serve the model under.
const SERVED: &str = "qwen";

/// A RolloutPool of one worker and two vLLM replicas serving `model` (in float32, the oracle's
/// precision), as a user writes it.
fn pool(model: &Path) -> RolloutPool {
    let spec = json!({
        "replicas": 1,
        "retrieverRef": "wiki",
        "config": {"model": model, "engine": {"kind": "vllm", "model": SERVED}},
        "inference": {"replicas": 2, "args": ["--dtype", "float32", "--max-model-len", "4096", "--seed", "0"]}
    });
    let mut pool = RolloutPool::new("pool", serde_json::from_value(spec).unwrap());
    pool.metadata.namespace = Some("ml".into());
    pool
}

fn greedy(input_ids: &[u32]) -> GenerationRequest {
    GenerationRequest {
        input_ids: input_ids.to_vec(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        max_new_tokens: 24,
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

#[test]
fn every_vllm_replica_serves_the_trained_weights_after_each_step() {
    let dir = fresh_dir("kart-vllm-disk");
    let model = serving_model("serve-qwen2");
    let (_retriever, retriever_url) = capitals_retriever(&dir);
    let (_copy, copy) = serving_copy(&model);
    let pool = pool(&copy);
    let children = rollout_pool::children(&pool, &Settings::default()).unwrap();
    let deployment = children.inference.expect("the pool's inference servers").deployment;
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let container = &spec.template.spec.unwrap().containers[0];
    // Started side by side: most of a start is waiting.
    let replicas = std::thread::scope(|s| {
        let start = || Vllm::start_container(container, SERVED);
        let starting = [s.spawn(start), s.spawn(start)];
        starting.map(|t| t.join().expect("a vLLM replica starts"))
    });
    let urls: Vec<&str> = replicas.iter().map(|r| r.url.as_str()).collect();
    // The worker's engine as the operator renders it (the Service's URL), on these replicas.
    let mut engine = serde_json::to_value(rollout_pool::render_config(&pool).engine).unwrap();
    assert_eq!(engine["urls"], json!(["http://pool-vllm.ml.svc:8000"]), "{engine}");
    engine["urls"] = json!(urls);
    let (_worker, worker) = rollout_worker_on(&dir, &model, engine, &retriever_url);

    let mut config = capitals_train_config(&dir, &dir.join("out"), &[&worker], STEPS);
    config["model"] = json!(model);
    let weights = dir.join("weights");
    config["weight_sync"] = json!({"kind": "vllm_disk", "path": weights, "urls": urls});
    std::fs::write(dir.join("train.json"), config.to_string()).unwrap();
    let done = Command::new(binary("kart"))
        .args(["train", "--config"])
        .arg(dir.join("train.json"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{log}");

    let records = step_records(&dir.join("out"));
    assert_eq!(records.len() as u64, STEPS, "{records:?}");
    for record in &records {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the version the replicas report: {record}");
        assert!(record["timing/sync_s"].as_f64().is_some_and(|s| s > 0.0), "a publish each step: {record}");
    }
    let figures = |key: &str| records.iter().map(|r| r[key].to_string()).collect::<Vec<_>>().join(", ");
    kart_tests::log(&format!(
        "vllm_disk to 2 replicas: step seconds {}; sync seconds {}; staleness/max {}",
        figures("timing/step_s"),
        figures("timing/sync_s"),
        figures("staleness/max")
    ));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let last = weights.join(format!("v{STEPS}"));
    let trained = EmbeddedEngine::spawn(
        CausalLm::load(&last, tch::Device::Cpu).unwrap(),
        Tokenizer::load(&last).unwrap(),
        4,
        STEPS as i64,
        0,
    );
    let initial = CausalLm::load(&model, tch::Device::Cpu).unwrap();
    let moved = CausalLm::load(&last, tch::Device::Cpu).unwrap();
    let (a, b) = (initial.named_tensors(), moved.named_tensors());
    assert!(a.iter().zip(&b).any(|((_, x), (_, y))| !x.equal(y)), "training changed the weights");
    let tokenizer = Tokenizer::load(&model).unwrap();
    let prompts =
        ["Capital of Peru? Search, then answer.", "<|im_start|>user\nwho was born in Paris?<|im_end|>\n"];
    for replica in &replicas {
        let served = VllmEngine::new(&replica.url, &replica.served, Duration::from_secs(600));
        let version = runtime.block_on(served.weight_version()).unwrap();
        assert_eq!(version, Some(STEPS as i64), "{}: the last version", replica.url);
        for prompt in prompts {
            let ids = tokenizer.encode(prompt, false).unwrap();
            let (from_vllm, from_kart) = runtime.block_on(async {
                futures::join!(served.generate(greedy(&ids)), trained.generate(greedy(&ids)))
            });
            let (from_vllm, from_kart) = (from_vllm.unwrap(), from_kart.unwrap());
            assert_eq!(from_vllm.version, STEPS as i64, "{}", replica.url);
            assert_eq!(
                from_vllm.generation.token_ids, from_kart.generation.token_ids,
                "{}: {prompt:?} on the trained weights",
                replica.url
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
