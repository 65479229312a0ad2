//! The fixture-model workloads of the real node's test: a BM25 Retriever `wiki` of the
//! synthetic corpus ([`crate::write_capitals`]), a RolloutPool `pool` of two embedded-engine
//! workers and TrainingJobs on the tiny Qwen2 model, each mounting the fixture models at /models
//! and the data at /data (hostPath volumes of the node).

use serde_json::{Value, json};
use std::path::Path;

/// The environment the trainers request and the pool serves.
pub fn env() -> Value {
    json!({"kind": "search-r1", "max_turns": 2, "max_response_length": 16, "max_obs_length": 48})
}

/// Pod overrides mounting the fixture models at /models and the data at /data (hostPath volumes).
pub fn volumes(data: &Path) -> Value {
    let models = crate::shared_dir().join("fixtures/models").canonicalize().unwrap();
    json!({
        "volumes": [{"name": "models", "hostPath": {"path": models}},
                    {"name": "data", "hostPath": {"path": data}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": true},
                         {"name": "data", "mountPath": "/data", "readOnly": true}],
    })
}

/// A BM25 Retriever `wiki` of the synthetic corpus.
pub fn retriever(data: &Path) -> Value {
    json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "Retriever", "metadata": {"name": "wiki"},
        "spec": {
            "config": {"method": "bm25", "topk": 3}, "corpus": "/data/corpus.jsonl",
            "index": {"size": "1Gi"}, "pod": volumes(data),
        },
    })
}

/// A RolloutPool `pool` of two workers with the embedded engine on the fixture model.
pub fn rollout_pool(data: &Path) -> Value {
    json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "pool"},
        "spec": {
            "replicas": 2, "retrieverRef": "wiki",
            "config": {
                "model": "/models/tiny-qwen2", "engine": {"kind": "embedded", "max_batch": 16}, "env": env(),
            },
            "pod": volumes(data),
        },
    })
}

/// A TrainingJob `name` of `total_steps` on the fixture model, checkpointing every 2 steps.
pub fn training_job(name: &str, data: &Path, total_steps: u64) -> Value {
    json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "retrieverRef": "wiki", "rolloutPoolRef": "pool", "checkpoint": {"size": "1Gi"},
            "config": {
                "model": "/models/tiny-qwen2", "total_steps": total_steps, "seed": 3,
                "data": {"train": "/data/train.jsonl", "test": "/data/test.jsonl"},
                "batch": {"prompts": 2, "n": 2, "mini_batch_prompts": 1, "micro_batch_size": 2},
                "optim": {"lr": 1e-4},
                "rollout": {"env": env()},
                "checkpoint": {"every": 2, "keep": 3},
                "eval": {"every": 2},
            },
            "pod": volumes(data),
        },
    })
}
