//! The benchmark's objects: Retrievers, RolloutPools and TrainingJobs spread over namespaces, each
//! TrainingJob with a pool of its own (one GPU, rollouts on an embedded engine) and each pool
//! with one of the Retrievers of its namespace; every volume is a claim of the namespace's,
//! bound before the objects come (simulated nodes mount nothing, and no provisioner runs).

use serde_json::{Value, json};

/// How many objects of each kind, over how many namespaces.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Counts {
    pub training_jobs: usize,
    pub rollout_pools: usize,
    pub retrievers: usize,
    pub namespaces: usize,
}

/// The claim every object's volumes are (a PersistentVolume bound to it ahead).
pub const CLAIM: &str = "bench-shared";

/// Name of namespace `i`.
pub fn namespace(i: usize) -> String {
    format!("bench-{i}")
}

/// Namespace `i` with its bound claim: the Namespace, a PersistentVolume and the claim.
pub fn namespace_objects(i: usize) -> Vec<Value> {
    let ns = namespace(i);
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("{ns}-shared")},
               "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
                        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                        "hostPath": {"path": format!("/srv/{ns}")},
                        "claimRef": {"namespace": ns, "name": CLAIM}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": ns},
               "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": format!("{ns}-shared"),
                        "resources": {"requests": {"storage": "1Ti"}}}}),
    ]
}

/// Which namespace object `i` of `count` goes to.
fn spread(i: usize, count: usize, namespaces: usize) -> usize {
    i * namespaces / count.max(1)
}

/// Retriever `i`.
pub fn retriever(i: usize, counts: &Counts) -> Value {
    let ns = namespace(spread(i, counts.retrievers, counts.namespaces));
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever",
           "metadata": {"name": format!("wiki-{i}"), "namespace": ns},
           "spec": {"config": {"method": "bm25", "topk": 3},
                    "index": {"existingClaim": CLAIM, "prebuilt": true}}})
}

/// RolloutPool `i`, with a Retriever of its namespace.
pub fn rollout_pool(i: usize, counts: &Counts) -> Value {
    let n = spread(i, counts.rollout_pools, counts.namespaces);
    // The Retrievers of namespace n are those whose spread lands there.
    let retrievers: Vec<usize> =
        (0..counts.retrievers).filter(|&r| spread(r, counts.retrievers, counts.namespaces) == n).collect();
    let mut spec = json!({"replicas": 1,
                          "config": {"model": "/models/qwen", "engine": {"kind": "embedded"},
                                     "env": {"kind": "search-r1", "max_turns": 2}}});
    if !retrievers.is_empty() {
        spec["retrieverRef"] = json!(format!("wiki-{}", retrievers[i % retrievers.len()]));
    }
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool",
           "metadata": {"name": format!("pool-{i}"), "namespace": namespace(n)}, "spec": spec})
}

/// TrainingJob `i`, on RolloutPool `i` (when there is one) with one GPU.
pub fn training_job(i: usize, counts: &Counts) -> Value {
    let n = spread(i, counts.training_jobs, counts.namespaces);
    let mut spec = json!({"checkpoint": {"existingClaim": CLAIM},
                          "config": {"model": "/models/qwen", "total_steps": 1000,
                                     "data": {"train": "/data/train.parquet"}},
                          "pod": {"resources": {"requests": {"cpu": "4", "nvidia.com/gpu": 1},
                                                "limits": {"nvidia.com/gpu": 1}}}});
    if i < counts.rollout_pools && spread(i, counts.rollout_pools, counts.namespaces) == n {
        spec["rolloutPoolRef"] = json!(format!("pool-{i}"));
    }
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": format!("run-{i}"), "namespace": namespace(n)}, "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Retriever, RolloutPool, TrainingJob};
    use kube::ResourceExt;

    #[test]
    fn every_object_parses_and_refers_to_one_of_its_namespace() {
        let counts = Counts { training_jobs: 30, rollout_pools: 30, retrievers: 5, namespaces: 3 };
        let retrievers: Vec<Retriever> =
            (0..5).map(|i| serde_json::from_value(retriever(i, &counts)).unwrap()).collect();
        let pools: Vec<RolloutPool> =
            (0..30).map(|i| serde_json::from_value(rollout_pool(i, &counts)).unwrap()).collect();
        let jobs: Vec<TrainingJob> =
            (0..30).map(|i| serde_json::from_value(training_job(i, &counts)).unwrap()).collect();
        for pool in &pools {
            let reference = pool.spec.retriever_ref.as_ref().expect("each namespace has a Retriever");
            assert!(
                retrievers.iter().any(|r| &r.name_any() == reference && r.namespace() == pool.namespace())
            );
        }
        for job in &jobs {
            let reference = job.spec.rollout_pool_ref.as_ref().unwrap();
            assert!(pools.iter().any(|p| &p.name_any() == reference && p.namespace() == job.namespace()));
        }
        let spread: std::collections::BTreeSet<_> = jobs.iter().map(|j| j.namespace().unwrap()).collect();
        assert_eq!(spread.len(), 3);
    }
}
