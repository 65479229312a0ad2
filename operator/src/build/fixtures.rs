//! Resources for tests.

use crate::crd::{Retriever, RetrieverSpec, RolloutPool, RolloutPoolSpec, TrainingJob, TrainingJobSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ml".into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

/// A BM25 Retriever `wiki` with a corpus.
pub fn retriever() -> Retriever {
    let spec: RetrieverSpec = serde_json::from_value(json!({
        "config": {"method": "bm25", "topk": 3},
        "corpus": "/data/wiki-18.jsonl.gz",
        "pod": {"volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "corpus"}}]}
    }))
    .expect("valid spec");
    Retriever { metadata: meta("wiki"), spec, status: None }
}

/// A RolloutPool `pool` of 2 SGLang-backed workers with one server on a GPU.
pub fn rollout_pool() -> RolloutPool {
    let spec: RolloutPoolSpec = serde_json::from_value(json!({
        "replicas": 2,
        "retrieverRef": "wiki",
        "config": {"model": "/models/qwen", "engine": {"kind": "sglang", "urls": []}},
        "inference": {"args": ["--mem-fraction-static", "0.8"],
                      "pod": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}
    }))
    .expect("valid spec");
    RolloutPool { metadata: meta("pool"), spec, status: None }
}

/// A TrainingJob `run` on `nodes` nodes using `wiki` and `pool`.
pub fn training_job(nodes: i32) -> TrainingJob {
    let spec: TrainingJobSpec = serde_json::from_value(json!({
        "config": {"model": "/models/qwen", "data": {"train": "/data/train.parquet"}, "total_steps": 5},
        "retrieverRef": "wiki",
        "rolloutPoolRef": "pool",
        "nodes": nodes,
        "checkpoint": {"accessModes": [if nodes > 1 { "ReadWriteMany" } else { "ReadWriteOnce" }]},
        "pod": {"resources": {"limits": {"nvidia.com/gpu": "8"}}, "priorityClassName": "training"}
    }))
    .expect("valid spec");
    TrainingJob { metadata: meta("run"), spec, status: None }
}
