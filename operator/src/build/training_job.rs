//! A TrainingJob's children: the rendered config, the checkpoint claim, the trainer Service
//! (rank 0's `/status`, `/metrics` and `/weights`), for several nodes a headless Service for the
//! rendezvous, and one indexed trainer Job per attempt.
//!
//! Ranks: each pod runs `kart train --nproc-per-node <gpusPerNode>`, which starts one trainer
//! process per GPU; `WORLD_SIZE` is nodes x gpusPerNode and `NODE_RANK` the pod's completion
//! index, so the ranks of pod `i` are `i * gpusPerNode ..`.
//!
//! Attempts: every Job runs `kart train --config /etc/kart/config.json`; every Job after the first
//! adds `--resume` (continue from the last checkpoint in `output_dir`, or start afresh when there
//! is none). The Job itself never retries (`backoffLimit: 0`): the controller counts failed
//! attempts against `spec.backoffLimit`, so all ranks restart together.
//!
//! Queues: with `spec.queueName` the Job carries Kueue's queue label (and the TrainingJob's
//! priority-class label) and is created suspended, as Kueue's own webhook would make it; from
//! then on `spec.suspend` is Kueue's: the operator never writes the Job again. Its pods always
//! `--resume`, since Kueue starts the same Job's pods again when it readmits an evicted run.

use super::meta::{self, COMPLETION_INDEX, child};
use super::objects::{claim, config_map, service};
use super::pod::{
    ContainerParts, STATUS_FILE, claim_volume, config_mount, config_volume, env, field_env, mount, template,
    token_env,
};
use super::{
    InvalidSpec, MASTER_PORT, Settings, TRAINER_PORT, adapters, config_path, retriever, rollout_pool,
};
use crate::crd::{RolloutPool, TrainingJob, kueue};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kart_core::config::rollout::EngineConfig;
use kart_core::config::train::WeightSync;
use kart_core::config::train::{InferenceServer, TrainConfig};
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Component label of the trainer pods.
pub const COMPONENT: &str = "trainer";

/// Label of a trainer Job and its pods with the attempt number.
pub const ATTEMPT: &str = "kart.dev/attempt";

/// What a TrainingJob owns besides its Jobs.
#[derive(Debug, Clone)]
pub struct TrainingJobChildren {
    pub config_map: ConfigMap,
    /// The checkpoint claim, unless the spec names an existing one.
    pub claim: Option<PersistentVolumeClaim>,
    /// Rank 0's Service.
    pub service: Service,
    /// The headless Service of a multi-node run.
    pub nodes_service: Option<Service>,
}

/// Name of the ConfigMap and rank 0's Service.
pub fn workload_name(name: &str) -> String {
    format!("{name}-trainer")
}

/// Name of the headless Service of a multi-node run.
pub fn nodes_service_name(name: &str) -> String {
    format!("{name}-trainer-nodes")
}

/// Name of the checkpoint claim the operator creates.
pub fn claim_name(name: &str) -> String {
    format!("{name}-checkpoints")
}

/// Name of attempt `attempt`'s Job (0-based).
pub fn job_name(name: &str, attempt: i32) -> String {
    format!("{name}-trainer-{attempt}")
}

/// The URL of the trainer's `/status`.
pub fn status_url(tj: &TrainingJob) -> String {
    let base =
        meta::endpoint(&workload_name(&tj.name_any()), &tj.namespace().unwrap_or_default(), TRAINER_PORT);
    format!("{base}/status")
}

/// The config the trainer reads: the user's with `output_dir` on the checkpoint volume, the
/// server on 0.0.0.0:8002, `rollout.urls` from `rolloutPoolRef` and `rollout.retriever_url` from
/// `retrieverRef` when unset, and the weight-sync URLs: the one workers pull from, or the pool's
/// replicas (every ready server) for `sglang_disk`, `sglang_broadcast`, `vllm_disk` and
/// `vllm_broadcast` without `urls`.
pub fn render_config(tj: &TrainingJob) -> TrainConfig {
    let name = tj.name_any();
    let namespace = tj.namespace().unwrap_or_default();
    let spec = &tj.spec;
    let mut config = spec.config.clone();
    config.output_dir = spec.checkpoint.mount_path.clone().into();
    config.host = "0.0.0.0".into();
    config.port = TRAINER_PORT;
    if config.rollout.urls.is_empty()
        && let Some(pool) = &spec.rollout_pool_ref
    {
        config.rollout.urls =
            vec![meta::endpoint(&rollout_pool::workload_name(pool), &namespace, super::ROLLOUT_PORT)];
    }
    if config.rollout.context.retriever_url.is_none()
        && let Some(r) = &spec.retriever_ref
    {
        config.rollout.context.retriever_url =
            Some(meta::endpoint(&retriever::workload_name(r), &namespace, super::RETRIEVER_PORT));
    }
    match &mut config.weight_sync {
        WeightSync::HttpPull { advertise_url: url @ None } => {
            *url = Some(meta::endpoint(&workload_name(&name), &namespace, TRAINER_PORT));
        }
        WeightSync::SglangDisk { urls, .. } | WeightSync::SglangBroadcast { urls, .. } if urls.is_empty() => {
            if let Some(pool) = &spec.rollout_pool_ref {
                *urls = vec![rollout_pool::replicas_url(InferenceServer::Sglang, pool, &namespace)];
            }
        }
        WeightSync::VllmDisk { urls, .. } | WeightSync::VllmBroadcast { urls, .. } if urls.is_empty() => {
            if let Some(pool) = &spec.rollout_pool_ref {
                *urls = vec![rollout_pool::replicas_url(InferenceServer::Vllm, pool, &namespace)];
            }
        }
        _ => {}
    }
    config
}

/// The GPU resource a pod's limit names.
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Trainer processes per pod: `gpusPerNode`, else the pod's `nvidia.com/gpu` limit, else 1.
pub fn gpus_per_node(tj: &TrainingJob) -> Result<i32, InvalidSpec> {
    let spec = &tj.spec;
    if let Some(n) = spec.gpus_per_node {
        return match n {
            1.. => Ok(n),
            _ => Err(InvalidSpec::new("spec.gpusPerNode", n, "must be at least 1")),
        };
    }
    let limit = spec.pod.resources.as_ref().and_then(|r| r.limits.as_ref()).and_then(|l| l.get(GPU_RESOURCE));
    match limit {
        None => Ok(1),
        Some(q) => match q.0.trim().parse::<i32>() {
            Ok(n @ 1..) => Ok(n),
            _ => Err(InvalidSpec::new(
                format!("spec.pod.resources.limits[{GPU_RESOURCE}]"),
                &q.0,
                "must be a whole number of GPUs, at least 1 (or set spec.gpusPerNode)",
            )),
        },
    }
}

/// Trainer processes of the run: nodes x [`gpus_per_node`].
pub fn world_size(tj: &TrainingJob) -> Result<i32, InvalidSpec> {
    let per_node = gpus_per_node(tj)?;
    tj.spec.nodes.checked_mul(per_node).ok_or_else(|| {
        InvalidSpec::new("spec.gpusPerNode", per_node, format!("x {} nodes overflows", tj.spec.nodes))
    })
}

/// The trainer's own checks on the rendered config, plus the operator's fields.
pub fn validate(tj: &TrainingJob) -> Result<(), InvalidSpec> {
    let spec = &tj.spec;
    if spec.nodes < 1 {
        return Err(InvalidSpec::new("spec.nodes", spec.nodes, "must be at least 1"));
    }
    world_size(tj)?;
    // Every node's rank 0 reads the checkpoint a resumed attempt continues from, and node 0
    // writes it: a volume one node can mount cannot serve them. (An existing claim's modes are
    // the cluster's to check; its pods stay Pending on a volume they cannot attach.)
    let single_node = |m: &String| m == "ReadWriteOnce" || m == "ReadWriteOncePod";
    if spec.nodes > 1
        && spec.checkpoint.existing_claim.is_none()
        && spec.checkpoint.access_modes.iter().all(single_node)
    {
        return Err(InvalidSpec::new(
            "spec.checkpoint.accessModes",
            format!("{:?}", spec.checkpoint.access_modes),
            format!("{} nodes share the checkpoint volume: use ReadWriteMany", spec.nodes),
        ));
    }
    if spec.backoff_limit < 0 {
        return Err(InvalidSpec::new("spec.backoffLimit", spec.backoff_limit, "must be >= 0"));
    }
    render_config(tj)
        .validate()
        .map_err(|e| InvalidSpec::new(format!("spec.config.{}", e.field), e.value, e.reason))
}

/// Whether the trainer's weight sync can keep the engine of `pool` (the RolloutPool of
/// `rolloutPoolRef`) on its weights: `http_pull` for kart's embedded engine, `sglang_disk` or
/// `sglang_broadcast` for SGLang, `vllm_disk` or `vllm_broadcast` for vLLM; and whether the
/// servers the pool runs take the LoRA adapters a disk sync publishes ([`adapters::fit`]).
pub fn weight_sync_fits(tj: &TrainingJob, pool: &RolloutPool) -> Result<(), InvalidSpec> {
    let pool_name = pool.name_any();
    let sync = &tj.spec.config.weight_sync;
    let (engine, wanted) = match (&pool.spec.config.engine, sync.servers()) {
        (EngineConfig::Vllm { .. }, Some((InferenceServer::Vllm, _)))
        | (EngineConfig::Sglang { .. }, Some((InferenceServer::Sglang, _))) => {
            return adapters::fit(tj, pool);
        }
        (EngineConfig::Embedded { .. }, None) => return Ok(()),
        (EngineConfig::Embedded { .. }, _) => ("embedded", "http_pull"),
        (EngineConfig::Sglang { .. }, _) => ("SGLang", "sglang_disk or sglang_broadcast"),
        (EngineConfig::Vllm { .. }, _) => ("vLLM", "vllm_disk or vllm_broadcast"),
    };
    let kind = sync.kind();
    Err(InvalidSpec::new(
        "spec.config.weight_sync.kind",
        kind,
        format!("RolloutPool {pool_name} runs the {engine} engine: use {wanted}"),
    ))
}

/// The TrainingJob's children other than its Jobs.
pub fn children(tj: &TrainingJob) -> Result<TrainingJobChildren, InvalidSpec> {
    validate(tj)?;
    let name = tj.name_any();
    let spec = &tj.spec;
    let workload = workload_name(&name);
    let text = serde_json::to_string_pretty(&render_config(tj)).expect("the config serialises");
    let mut rank0 = meta::selector(&name, COMPONENT);
    rank0.insert(COMPLETION_INDEX.into(), "0".into());
    Ok(TrainingJobChildren {
        config_map: config_map(child(tj, &workload, COMPONENT), text),
        claim: spec.checkpoint.existing_claim.is_none().then(|| {
            claim(
                child(tj, &claim_name(&name), COMPONENT),
                &spec.checkpoint.size,
                spec.checkpoint.storage_class_name.as_ref(),
                &spec.checkpoint.access_modes,
            )
        }),
        service: rank0_service(tj, rank0),
        nodes_service: (spec.nodes > 1).then(|| nodes_service(tj)),
    })
}

/// The headless Service giving each trainer pod a DNS name (`<job>-<index>.<service>`). Its
/// records exist before the pods are ready: the ranks meet at node 0's address before any of them
/// serves a probe.
fn nodes_service(tj: &TrainingJob) -> Service {
    let name = tj.name_any();
    let mut s = service(
        child(tj, &nodes_service_name(&name), COMPONENT),
        meta::selector(&name, COMPONENT),
        &[("rendezvous", MASTER_PORT)],
        true,
    );
    if let Some(spec) = s.spec.as_mut() {
        spec.publish_not_ready_addresses = Some(true);
    }
    s
}

/// Rank 0's Service. It routes to the trainer before any readiness probe passed: the trainer
/// tells the workers to pull its first weights from this Service as soon as it has loaded them.
fn rank0_service(tj: &TrainingJob, selector: BTreeMap<String, String>) -> Service {
    let mut s = service(
        child(tj, &workload_name(&tj.name_any()), COMPONENT),
        selector,
        &[("http", TRAINER_PORT)],
        false,
    );
    if let Some(spec) = s.spec.as_mut() {
        spec.publish_not_ready_addresses = Some(true);
    }
    s
}

/// Attempt `attempt`'s trainer Job: `nodes` indexed pods running `kart train --nproc-per-node`
/// with `MASTER_ADDR` (node 0's stable host name), `MASTER_PORT`, `WORLD_SIZE` (every rank of
/// every node) and `NODE_RANK` (the completion index, from the pod's
/// `batch.kubernetes.io/job-completion-index` annotation). The spec is valid ([`validate`]).
pub fn job(tj: &TrainingJob, settings: &Settings, attempt: i32) -> Job {
    let name = tj.name_any();
    let spec = &tj.spec;
    let job = job_name(&name, attempt);
    let multi = spec.nodes > 1;
    let master = if multi { format!("{job}-0.{}", nodes_service_name(&name)) } else { "127.0.0.1".into() };
    let per_node = gpus_per_node(tj).unwrap_or(1);
    let mut args = vec![
        "train".to_string(),
        "--config".into(),
        config_path(),
        "--nproc-per-node".into(),
        per_node.to_string(),
    ];
    let queue = tj.queue();
    if attempt > 0 || queue.is_some() {
        args.push("--resume".into());
    }
    let claim = spec.checkpoint.existing_claim.clone().unwrap_or_else(|| claim_name(&name));
    let text = serde_json::to_string_pretty(&render_config(tj)).expect("the config serialises");
    let mut labels = meta::labels(&name, COMPONENT);
    labels.insert(ATTEMPT.into(), attempt.to_string());
    let mut pod = template(
        settings,
        &spec.pod,
        labels,
        BTreeMap::from([("kart.dev/config-hash".to_string(), meta::config_hash(&text))]),
        ContainerParts {
            name: "trainer".into(),
            command: vec!["kart".into()],
            args,
            ports: vec![("http", TRAINER_PORT), ("rendezvous", MASTER_PORT)],
            probes: Some(("/healthz", None)),
            env: [
                env("MASTER_ADDR", master),
                env("MASTER_PORT", MASTER_PORT.to_string()),
                env("WORLD_SIZE", (spec.nodes * per_node).to_string()),
                field_env("NODE_RANK", format!("metadata.annotations['{COMPLETION_INDEX}']")),
                // Where SGLang's workers reach rank 0 (`sglang_broadcast`).
                field_env("POD_IP", "status.podIP"),
                env("KART_STATUS_FILE", STATUS_FILE),
            ]
            .into_iter()
            .chain(spec.rollout_pool_ref.as_deref().map(token_env))
            .collect(),
            mounts: vec![config_mount(), mount("checkpoints", &spec.checkpoint.mount_path, false)],
            ..ContainerParts::default()
        },
        vec![config_volume(&workload_name(&name)), claim_volume("checkpoints", &claim, false)],
        Some("Never"),
    );
    if let Some(p) = pod.spec.as_mut() {
        p.termination_grace_period_seconds = Some(spec.termination_grace_period_seconds);
        if multi {
            p.subdomain = Some(nodes_service_name(&name));
        }
    }
    let mut metadata = child(tj, &job, COMPONENT);
    let labels = metadata.labels.get_or_insert_default();
    labels.insert(ATTEMPT.into(), attempt.to_string());
    if let Some(queue) = queue {
        labels.insert(kueue::QUEUE_NAME.into(), queue.into());
        if let Some(priority) = tj.labels().get(kueue::PRIORITY_CLASS) {
            labels.insert(kueue::PRIORITY_CLASS.into(), priority.clone());
        }
    }
    Job {
        metadata,
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(spec.nodes),
            parallelism: Some(spec.nodes),
            backoff_limit: Some(0),
            suspend: queue.map(|_| true),
            template: pod,
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;

    fn env_of(job: &Job) -> BTreeMap<String, String> {
        let c = &job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        c.env
            .iter()
            .flatten()
            .map(|e| {
                let v = e.value.clone().or_else(|| {
                    let from = e.value_from.as_ref()?;
                    let field = from.field_ref.as_ref().map(|f| format!("fieldRef:{}", f.field_path));
                    field.or_else(|| {
                        from.secret_key_ref.as_ref().map(|s| format!("secret:{}/{}", s.name, s.key))
                    })
                });
                (e.name.clone(), v.unwrap_or_default())
            })
            .collect()
    }

    #[test]
    fn rendered_config_points_at_the_pool_the_retriever_and_the_volume() {
        let tj = fixtures::training_job(1);
        let c = children(&tj).unwrap();
        let config: TrainConfig =
            serde_json::from_str(&c.config_map.data.as_ref().unwrap()["config.json"]).unwrap();
        assert_eq!(config.rollout.urls, ["http://pool-rollout.ml.svc:8001"]);
        assert_eq!(
            config.rollout.context.retriever_url.as_deref(),
            Some("http://wiki-retriever.ml.svc:8000")
        );
        assert_eq!(config.output_dir, std::path::PathBuf::from("/var/lib/kart/checkpoints"));
        assert_eq!((config.port, config.total_steps), (8002, 5));
        assert_eq!(
            config.weight_sync,
            WeightSync::HttpPull { advertise_url: Some("http://run-trainer.ml.svc:8002".into()) }
        );
        let mut sglang = tj.clone();
        sglang.spec.config.weight_sync = WeightSync::SglangDisk { path: "/weights".into(), urls: vec![] };
        assert_eq!(
            render_config(&sglang).weight_sync,
            WeightSync::SglangDisk {
                path: "/weights".into(),
                urls: vec!["http://pool-sglang-replicas.ml.svc:30000".into()]
            },
            "every replica of the pool's SGLang servers"
        );
        sglang.spec.config.weight_sync =
            serde_json::from_value(serde_json::json!({"kind": "sglang_broadcast"})).unwrap();
        let rendered = render_config(&sglang).weight_sync;
        assert_eq!(
            rendered.servers(),
            Some((InferenceServer::Sglang, &["http://pool-sglang-replicas.ml.svc:30000".to_string()][..]))
        );
        sglang.spec.config.weight_sync =
            serde_json::from_value(serde_json::json!({"kind": "vllm_broadcast"})).unwrap();
        let rendered = render_config(&sglang).weight_sync;
        assert_eq!(
            rendered.servers(),
            Some((InferenceServer::Vllm, &["http://pool-vllm-replicas.ml.svc:8000".to_string()][..]))
        );
        assert_eq!(c.claim.as_ref().unwrap().metadata.name.as_deref(), Some("run-checkpoints"));
        assert!(c.nodes_service.is_none());
        let selector = c.service.spec.as_ref().unwrap().selector.as_ref().unwrap();
        assert_eq!(
            selector.get(COMPLETION_INDEX).map(String::as_str),
            Some("0"),
            "the Service reaches rank 0"
        );
        let spec = c.service.spec.as_ref().unwrap();
        assert_eq!(
            (spec.publish_not_ready_addresses, spec.cluster_ip.as_deref()),
            (Some(true), None),
            "workers pull the first weights before the trainer's readiness probe ran"
        );
        assert_eq!(status_url(&tj), "http://run-trainer.ml.svc:8002/status");
    }

    #[test]
    fn first_attempt_starts_fresh_later_ones_resume() {
        let tj = fixtures::training_job(1);
        let first = job(&tj, &Settings::default(), 0);
        let args = |j: &Job| {
            j.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].args.clone().unwrap()
        };
        assert_eq!(first.metadata.name.as_deref(), Some("run-trainer-0"));
        assert_eq!(args(&first), ["train", "--config", "/etc/kart/config.json", "--nproc-per-node", "8"]);
        let second = job(&tj, &Settings::default(), 1);
        assert_eq!(second.metadata.name.as_deref(), Some("run-trainer-1"));
        assert_eq!(args(&second)[5..], ["--resume"]);
        let spec = first.spec.as_ref().unwrap();
        assert_eq!(
            (spec.backoff_limit, spec.completions, spec.completion_mode.as_deref()),
            (Some(0), Some(1), Some("Indexed"))
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.priority_class_name.as_deref(), Some("training"));
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let env = env_of(&first);
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["WORLD_SIZE"], "8", "one node's 8 GPUs (its nvidia.com/gpu limit)");
        assert_eq!(env["KART_STATUS_FILE"], "/dev/termination-log");
        assert_eq!(env["POD_IP"], "fieldRef:status.podIP", "where SGLang's workers reach rank 0");
    }

    #[test]
    fn a_queued_job_is_labelled_for_kueue_created_suspended_and_always_resumes() {
        let mut tj = fixtures::training_job(2);
        let plain = job(&tj, &Settings::default(), 0);
        assert_eq!(plain.spec.as_ref().unwrap().suspend, None, "no queue: Kubernetes runs it at once");
        assert!(!plain.labels().contains_key(kueue::QUEUE_NAME));
        tj.spec.queue_name = Some("team-a".into());
        tj.metadata.labels = Some(BTreeMap::from([(kueue::PRIORITY_CLASS.to_string(), "high".to_string())]));
        let queued = job(&tj, &Settings::default(), 0);
        assert_eq!(queued.labels()[kueue::QUEUE_NAME], "team-a");
        assert_eq!(queued.labels()[kueue::PRIORITY_CLASS], "high");
        let spec = queued.spec.as_ref().unwrap();
        assert_eq!(spec.suspend, Some(true), "Kueue unsuspends it once the whole gang fits");
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.containers[0].args.as_ref().unwrap().last().map(String::as_str), Some("--resume"));
        assert_eq!(pod.termination_grace_period_seconds, Some(300), "time to checkpoint on SIGTERM");
        tj.spec.queue_name = None;
        tj.metadata.labels = Some(BTreeMap::from([(kueue::QUEUE_NAME.to_string(), "team-b".to_string())]));
        assert_eq!(
            job(&tj, &Settings::default(), 0).labels()[kueue::QUEUE_NAME],
            "team-b",
            "the label does the same"
        );
    }

    #[test]
    fn the_weight_sync_must_fit_the_pools_engine() {
        let mut tj = fixtures::training_job(1);
        let mut pool = fixtures::rollout_pool();
        let message =
            |tj: &TrainingJob, pool: &RolloutPool| weight_sync_fits(tj, pool).unwrap_err().to_string();
        assert_eq!(
            message(&tj, &pool),
            "spec.config.weight_sync.kind = http_pull: RolloutPool pool runs the SGLang engine: use sglang_disk or sglang_broadcast"
        );
        let broadcast: WeightSync =
            serde_json::from_value(serde_json::json!({"kind": "sglang_broadcast"})).unwrap();
        tj.spec.config.weight_sync = broadcast.clone();
        assert_eq!(weight_sync_fits(&tj, &pool), Ok(()));
        tj.spec.config.weight_sync = WeightSync::SglangDisk { path: "/weights".into(), urls: vec![] };
        assert_eq!(weight_sync_fits(&tj, &pool), Ok(()));
        pool.spec.config.engine = EngineConfig::default();
        assert!(message(&tj, &pool).starts_with("spec.config.weight_sync.kind = sglang_disk"));
        tj.spec.config.weight_sync = broadcast;
        assert!(message(&tj, &pool).starts_with("spec.config.weight_sync.kind = sglang_broadcast"));
        tj.spec.config.weight_sync = WeightSync::default();
        assert_eq!(weight_sync_fits(&tj, &pool), Ok(()));
        pool.spec.config.engine =
            EngineConfig::Vllm { urls: vec![], model: "qwen".into(), timeout_secs: 60.0 };
        assert_eq!(
            message(&tj, &pool),
            "spec.config.weight_sync.kind = http_pull: RolloutPool pool runs the vLLM engine: use vllm_disk or vllm_broadcast"
        );
        tj.spec.config.weight_sync =
            serde_json::from_value(serde_json::json!({"kind": "vllm_broadcast"})).unwrap();
        assert_eq!(weight_sync_fits(&tj, &pool), Ok(()));
        pool.spec.config.engine = EngineConfig::default();
        assert!(message(&tj, &pool).starts_with("spec.config.weight_sync.kind = vllm_broadcast: RolloutPool pool runs the embedded engine: use http_pull"));
    }

    #[test]
    fn multi_node_runs_an_indexed_job_with_a_headless_service() {
        let tj = fixtures::training_job(4);
        let c = children(&tj).unwrap();
        let nodes = c.nodes_service.as_ref().unwrap();
        assert_eq!(nodes.metadata.name.as_deref(), Some("run-trainer-nodes"));
        let service = nodes.spec.as_ref().unwrap();
        assert_eq!(
            (service.cluster_ip.as_deref(), service.publish_not_ready_addresses),
            (Some("None"), Some(true)),
            "node 0's name resolves before its readiness probe passes"
        );
        let j = job(&tj, &Settings::default(), 2);
        let spec = j.spec.as_ref().unwrap();
        assert_eq!((spec.completions, spec.parallelism), (Some(4), Some(4)));
        assert_eq!(spec.template.spec.as_ref().unwrap().subdomain.as_deref(), Some("run-trainer-nodes"));
        let env = env_of(&j);
        assert_eq!(env["MASTER_ADDR"], "run-trainer-2-0.run-trainer-nodes");
        assert_eq!(env["MASTER_PORT"], "29500");
        assert_eq!(env["WORLD_SIZE"], "32", "4 nodes x 8 GPUs");
        assert_eq!(
            env["NODE_RANK"],
            "fieldRef:metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        assert!(!env.contains_key("RANK"), "the launcher gives each process its rank");
        assert_eq!(env["KART_TOKEN"], "secret:pool-token/token", "the token of the pool it uses");
        let container = &spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.args.as_ref().unwrap()[3..5], ["--nproc-per-node", "8"]);
        let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(labels[ATTEMPT], "2");
    }

    #[test]
    fn invalid_configs_are_named_with_their_spec_path() {
        let mut tj = fixtures::training_job(1);
        tj.spec.config.algorithm.clip_ratio_low = 1.5;
        assert_eq!(
            validate(&tj).unwrap_err().to_string(),
            "spec.config.algorithm.clip_ratio_low = 1.5: must be in (0, 1)"
        );
        let mut tj = fixtures::training_job(1);
        tj.spec.nodes = 0;
        assert_eq!(validate(&tj).unwrap_err().to_string(), "spec.nodes = 0: must be at least 1");
    }

    #[test]
    fn gpus_per_node_comes_from_the_spec_else_the_gpu_limit_else_one() {
        let mut tj = fixtures::training_job(2);
        assert_eq!((gpus_per_node(&tj).unwrap(), world_size(&tj).unwrap()), (8, 16));
        tj.spec.gpus_per_node = Some(2);
        assert_eq!((gpus_per_node(&tj).unwrap(), world_size(&tj).unwrap()), (2, 4));
        tj.spec.gpus_per_node = None;
        tj.spec.pod.resources = None;
        assert_eq!(world_size(&tj).unwrap(), 2, "one process per pod without GPUs");
        tj.spec.gpus_per_node = Some(0);
        assert_eq!(validate(&tj).unwrap_err().to_string(), "spec.gpusPerNode = 0: must be at least 1");
        tj.spec.gpus_per_node = None;
        tj.spec.pod.resources =
            serde_json::from_value(serde_json::json!({"limits": {"nvidia.com/gpu": "500m"}})).unwrap();
        let error = validate(&tj).unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.value.as_str()),
            ("spec.pod.resources.limits[nvidia.com/gpu]", "500m")
        );
    }

    #[test]
    fn several_nodes_need_a_checkpoint_volume_they_can_all_mount() {
        let mut tj = fixtures::training_job(2);
        tj.spec.checkpoint.access_modes = vec!["ReadWriteOnce".into()];
        assert_eq!(
            validate(&tj).unwrap_err().to_string(),
            "spec.checkpoint.accessModes = [\"ReadWriteOnce\"]: 2 nodes share the checkpoint volume: use ReadWriteMany"
        );
        tj.spec.nodes = 1;
        assert!(validate(&tj).is_ok(), "one node may use a ReadWriteOnce volume");
        tj.spec.nodes = 2;
        tj.spec.checkpoint.existing_claim = Some("shared".into());
        assert!(validate(&tj).is_ok(), "an existing claim's modes are the cluster's to check");
    }
}
