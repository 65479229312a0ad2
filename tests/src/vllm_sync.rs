//! A `kart train` run keeping real vLLM replicas on its policy with `weight_sync: vllm_disk`, as
//! a RolloutPool with `engine.kind: vllm` runs them: each replica runs the container of the
//! operator's inference Deployment (`vllm serve`, its arguments and environment), the worker the
//! engine of the operator's rendered config, behind a real retriever; and what a replica serves
//! afterwards, against kart's log-probabilities of the same tokens.

use crate::vllm::{Vllm, score, serving_copy};
use crate::{
    Child, binary, capitals_retriever, capitals_train_config, fresh_dir, log, rollout_worker_on, step_records,
};
use kart_core::engine::Engine;
use kart_core::generation::{Generation, GenerationRequest, SamplingParams};
use kart_model::CausalLm;
use kart_operator::build::{Settings, rollout_pool};
use kart_operator::crd::RolloutPool;
use kart_rollout::engines::vllm::VllmEngine;
use kart_tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Steps, and so policy versions published, of a run.
pub const STEPS: u64 = 3;
/// vLLM's log-probabilities against kart's on the same weights, both in f32.
pub const LOGPROB_TOLERANCE: f64 = 1e-4;
/// The pool's `config.engine.model`: the name the replicas serve the model under.
pub const SERVED: &str = "policy";
/// What the replicas are asked after the run.
const PROMPTS: [&str; 2] =
    ["Capital of Peru? Search, then answer.", "<|im_start|>user\nwho was born in Paris?<|im_end|>\n"];

/// A finished run, its replicas still serving.
pub struct VllmRun {
    /// The run's folder (removed by [`VllmRun::finish`]).
    pub dir: PathBuf,
    pub replicas: [Vllm; 2],
    /// Where `vllm_disk` published: a folder `v{N}` per version.
    pub weights: PathBuf,
    _retriever: Child,
    _worker: Child,
    _copy: tempfile::TempDir,
}

/// A RolloutPool of one worker and two vLLM replicas serving `model` in float32 (the oracle's
/// precision) with `server_args` besides, as a user writes it.
fn pool(model: &Path, server_args: &[&str]) -> RolloutPool {
    let mut args = vec!["--dtype", "float32", "--max-model-len", "4096", "--seed", "0"];
    args.extend(server_args);
    let spec = json!({
        "replicas": 1,
        "retrieverRef": "wiki",
        "config": {"model": model, "engine": {"kind": "vllm", "model": SERVED}},
        "inference": {"replicas": 2, "args": args}
    });
    let mut pool = RolloutPool::new("pool", serde_json::from_value(spec).unwrap());
    pool.metadata.namespace = Some("ml".into());
    pool
}

/// Trains [`STEPS`] steps of the serving fixture `model` through such a pool (its servers given
/// `server_args`), the trainer's config edited by `edit`, and checks that every step published
/// (`timing/sync_s`) and trained on tokens of the version the replicas held.
pub fn train_through_vllm(
    tag: &str,
    model: &Path,
    server_args: &[&str],
    edit: impl FnOnce(&mut Value),
) -> VllmRun {
    let dir = fresh_dir(tag);
    let (retriever, retriever_url) = capitals_retriever(&dir);
    let (copy, served_copy) = serving_copy(model);
    let pool = pool(&served_copy, server_args);
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
    let (worker, worker_url) = rollout_worker_on(&dir, model, engine, &retriever_url);

    let mut config = capitals_train_config(&dir, &dir.join("out"), &[&worker_url], STEPS);
    config["model"] = json!(model);
    let weights = dir.join("weights");
    config["weight_sync"] = json!({"kind": "vllm_disk", "path": weights, "urls": urls});
    edit(&mut config);
    std::fs::write(dir.join("train.json"), config.to_string()).unwrap();
    let done = Command::new(binary("kart"))
        .args(["train", "--config"])
        .arg(dir.join("train.json"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));

    let records = step_records(&dir.join("out"));
    assert_eq!(records.len() as u64, STEPS, "{records:?}");
    for record in &records {
        assert_eq!(record["staleness/max"], 0.0, "tokens carry the version the replicas report: {record}");
        assert!(record["timing/sync_s"].as_f64().is_some_and(|s| s > 0.0), "a publish each step: {record}");
    }
    let figures = |key: &str| records.iter().map(|r| r[key].to_string()).collect::<Vec<_>>().join(", ");
    log(&format!(
        "{tag}: vllm_disk to 2 replicas: step seconds {}; sync seconds {}",
        figures("timing/step_s"),
        figures("timing/sync_s"),
    ));
    VllmRun { dir, replicas, weights, _retriever: retriever, _worker: worker, _copy: copy }
}

/// A greedy request for 24 tokens.
pub fn greedy(input_ids: &[u32]) -> GenerationRequest {
    GenerationRequest {
        input_ids: input_ids.to_vec(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        max_new_tokens: 24,
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

impl VllmRun {
    /// What `replica` serves now: it holds the last version, and each prompt's greedy
    /// generation carries it and has log-probabilities within [`LOGPROB_TOLERANCE`] of kart's
    /// under `policy`, and more than ten times that from `start`'s (the weights it started
    /// with) at some step. Returns each prompt's ids and generation.
    pub fn check_served(
        &self,
        replica: &Vllm,
        tokenizer: &Tokenizer,
        policy: &CausalLm,
        start: &CausalLm,
    ) -> Vec<(Vec<u32>, Generation)> {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let url = &replica.url;
        let served = VllmEngine::new(url, &replica.served, Duration::from_secs(600));
        let version = runtime.block_on(served.weight_version()).unwrap();
        assert_eq!(version, Some(STEPS as i64), "{url}: the last version");
        let (mut worst, mut away) = (0f64, 0f64);
        let mut generations = Vec::new();
        for prompt in PROMPTS {
            let ids = tokenizer.encode(prompt, false).unwrap();
            let output = runtime.block_on(served.generate(greedy(&ids))).unwrap();
            assert_eq!(output.version, STEPS as i64, "{url}");
            let generation = output.generation;
            assert_eq!(generation.logprobs.len(), generation.token_ids.len(), "{url}");
            let ours = score(policy, &ids, &generation.token_ids).logprobs;
            let first = score(start, &ids, &generation.token_ids).logprobs;
            for (step, ((served, ours), first)) in
                generation.logprobs.iter().zip(&ours).zip(&first).enumerate()
            {
                let served = *served as f64;
                assert!(
                    (served - ours).abs() <= LOGPROB_TOLERANCE,
                    "{url}: {prompt:?} step {step}: vLLM's log-probability {served} against kart's {ours}"
                );
                worst = worst.max((served - ours).abs());
                away = away.max((served - first).abs());
            }
            generations.push((ids, generation));
        }
        log(&format!(
            "{url}: log-probabilities within {worst:.2e} of kart's on the trained policy, up to {away:.2e} from the initial one's"
        ));
        assert!(
            away > 10.0 * LOGPROB_TOLERANCE,
            "{url}: vLLM serves the initial policy ({away:.2e} apart at most)"
        );
        generations
    }

    /// Removes the run's folder.
    pub fn finish(self) {
        std::fs::remove_dir_all(&self.dir).unwrap();
    }
}
