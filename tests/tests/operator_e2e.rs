//! The operator end to end on one machine: the real `kart-operator` reconciles a Retriever, a
//! RolloutPool and TrainingJobs against the fake API server, and the simulated cluster of
//! `kart_tests::cluster` runs the Pods its Deployments and Jobs imply as real `kart` processes
//! (the index build, the retriever, two rollout workers on the fixture model behind their
//! Service, the trainers). A run succeeds with every step, each worker generating with the weights
//! of the version it was asked for; a run on two nodes of two ranks each trains as one; a trainer
//! killed midway is restarted by the operator from its checkpoint; deleting a TrainingJob stops
//! its processes.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kart_operator::crd::retriever::RetrieverPhase;
use kart_operator::crd::rollout_pool::RolloutPoolPhase;
use kart_operator::crd::training_job::{TrainingJobPhase, TrainingJobStatus};
use kart_operator::crd::{Retriever, RolloutPool, TrainingJob};
use kart_tests::cluster::Cluster;
use kart_tests::{fresh_dir, sample, shared_dir, step_records, steps_logged, write_capitals};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const NAMESPACE: &str = "ml";
const STEPS: u64 = 4;

/// The environment the trainers request and the pool serves.
fn env() -> Value {
    json!({"kind": "search-r1", "max_turns": 2, "max_response_length": 16, "max_obs_length": 48})
}

/// Pod overrides mounting the fixture models at /models and the data at /data (hostPath volumes).
fn volumes(data: &Path) -> Value {
    let models = shared_dir().join("fixtures/models").canonicalize().unwrap();
    json!({
        "volumes": [{"name": "models", "hostPath": {"path": models}},
                    {"name": "data", "hostPath": {"path": data}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": true},
                         {"name": "data", "mountPath": "/data", "readOnly": true}],
    })
}

/// A BM25 Retriever `wiki` of the synthetic corpus.
fn retriever(data: &Path) -> Retriever {
    serde_json::from_value(json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "Retriever",
        "metadata": {"name": "wiki", "namespace": NAMESPACE},
        "spec": {
            "config": {"method": "bm25", "topk": 3}, "corpus": "/data/corpus.jsonl",
            "index": {"size": "1Gi"}, "pod": volumes(data),
        },
    }))
    .unwrap()
}

/// A RolloutPool `pool` of two workers with the embedded engine on the fixture model.
fn rollout_pool(data: &Path) -> RolloutPool {
    serde_json::from_value(json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool",
        "metadata": {"name": "pool", "namespace": NAMESPACE},
        "spec": {
            "replicas": 2, "retrieverRef": "wiki",
            "config": {
                "model": "/models/tiny-qwen2", "engine": {"kind": "embedded", "max_batch": 16}, "env": env(),
            },
            "pod": volumes(data),
        },
    }))
    .unwrap()
}

/// A TrainingJob `name` of `total_steps` on the fixture model, checkpointing every 2 steps.
fn training_job(name: &str, data: &Path, total_steps: u64) -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
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
    }))
    .unwrap()
}

async fn create<K>(client: &kube::Client, object: K)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), NAMESPACE).create(&PostParams::default(), &object).await.unwrap();
}

/// The status of TrainingJob `name` once `done` holds for it.
async fn training_job_status(
    cluster: &Cluster,
    name: &str,
    deadline: Duration,
    done: impl Fn(&TrainingJobStatus) -> bool,
) -> TrainingJobStatus {
    let api = Api::<TrainingJob>::namespaced(cluster.client.clone(), NAMESPACE);
    cluster
        .wait(&format!("TrainingJob {name}"), deadline, async || {
            api.get(name).await.ok()?.status.filter(|s| done(s))
        })
        .await
}

/// The trainer Pod of attempt `attempt` of TrainingJob `name`.
async fn trainer_pod(cluster: &Cluster, name: &str, attempt: i32) -> Pod {
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={name},kart.dev/attempt={attempt}");
    cluster
        .wait(
            &format!("the trainer Pod of {name}, attempt {attempt}"),
            Duration::from_secs(120),
            async || pods.list(&ListParams::default().labels(&selector)).await.ok()?.items.pop(),
        )
        .await
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_jobs_run_restart_from_checkpoints_and_stop_through_the_operator() {
    let dir = fresh_dir("kart-operator-e2e");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_capitals(&data);
    let cluster = Cluster::start(&dir.join("cluster"), NAMESPACE).await.unwrap();
    let client = cluster.client.clone();

    create(&client, retriever(&data)).await;
    create(&client, rollout_pool(&data)).await;
    create(&client, training_job("search", &data, STEPS)).await;

    // 1. A run to the end.
    let status =
        training_job_status(&cluster, "search", Duration::from_secs(240), |s| s.phase.is_finished()).await;
    assert_eq!(status.phase, TrainingJobPhase::Succeeded, "{status:?}\n{}", cluster.describe());
    assert_eq!((status.step, status.policy_version, status.attempts), (STEPS, Some(STEPS), 1), "{status:?}");
    let retriever = Api::<Retriever>::namespaced(client.clone(), NAMESPACE).get("wiki").await.unwrap();
    let retriever = retriever.status.unwrap();
    assert_eq!(
        (retriever.phase, retriever.index_built, retriever.ready_replicas),
        (RetrieverPhase::Ready, true, 1)
    );
    let pool =
        Api::<RolloutPool>::namespaced(client.clone(), NAMESPACE).get("pool").await.unwrap().status.unwrap();
    assert_eq!((pool.phase, pool.ready_replicas), (RolloutPoolPhase::Ready, 2));
    let output = cluster.kubelet.claim(NAMESPACE, "search-checkpoints");
    assert_eq!(steps_logged(&output), [0, 1, 2, 3, 4], "an evaluation at step 0, then one record per step");
    assert!(output.join("model/config.json").is_file(), "the final model is on the checkpoint claim");
    // Each publish reached one worker through the Service; every trajectory still came from the
    // version its step asked for (the other worker pulled it), and both workers end on the last
    // version: the final evaluation's requests were balanced over them.
    for record in &step_records(&output)[1..] {
        assert_eq!(record["staleness/max"], 0.0, "a worker generated with old weights: {record}");
    }
    let direct = reqwest::Client::builder().no_proxy().build().unwrap();
    let workers = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=pool"))
        .await
        .unwrap();
    assert_eq!(workers.items.len(), 2, "{workers:?}");
    let mut loads = [0.0; 2];
    for worker in &workers.items {
        let ip = worker.status.as_ref().unwrap().pod_ip.clone().unwrap();
        let metrics =
            direct.get(format!("http://{ip}:8001/metrics")).send().await.unwrap().text().await.unwrap();
        let name = worker.name_any();
        assert_eq!(sample(&metrics, "kart_rollout_policy_version"), Some(STEPS as f64), "{name}: {metrics}");
        for (i, trigger) in ["push", "pull"].into_iter().enumerate() {
            let series = format!("kart_rollout_weight_loads_total{{outcome=\"ok\",trigger=\"{trigger}\"}}");
            loads[i] += sample(&metrics, &series).unwrap_or(0.0);
        }
    }
    assert_eq!(loads[0], (STEPS + 1) as f64, "each of the versions 0..={STEPS} was pushed to one worker");
    assert!(loads[1] >= 1.0, "the worker the last push missed pulled it");

    // 2. Two nodes of two CPU ranks each: one data-parallel run, node 1 meeting node 0 at its pod
    // DNS name, to the end.
    let mut ranks = training_job("ranks", &data, 2);
    ranks.spec.nodes = 2;
    ranks.spec.gpus_per_node = Some(2);
    ranks.spec.checkpoint.access_modes = vec!["ReadWriteMany".into()];
    create(&client, ranks).await;
    let status =
        training_job_status(&cluster, "ranks", Duration::from_secs(300), |s| s.phase.is_finished()).await;
    assert_eq!(status.phase, TrainingJobPhase::Succeeded, "{status:?}\n{}", cluster.describe());
    assert_eq!((status.step, status.world_size, status.attempts), (2, Some(4), 1), "{status:?}");
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/instance=ranks"))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 2, "one pod per node");
    for pod in &pods.items {
        let index = &pod.metadata.labels.as_ref().unwrap()["batch.kubernetes.io/job-completion-index"];
        let log = cluster.kubelet.logs(NAMESPACE, &pod.name_any());
        let node: usize = index.parse().unwrap();
        for rank in [2 * node, 2 * node + 1].into_iter().filter(|&r| r > 0) {
            let finished = format!("\"rank\":{rank}");
            assert!(
                log.lines().any(|l| l.contains("rank finished") && l.contains(&finished)),
                "node {node} ran rank {rank}: {log}"
            );
        }
    }
    let output = cluster.kubelet.claim(NAMESPACE, "ranks-checkpoints");
    assert_eq!(steps_logged(&output), [0, 1, 2], "rank 0 alone writes the metrics");

    // 3. A trainer killed after its first checkpoint: the next attempt resumes from it.
    create(&client, training_job("resume", &data, 50)).await;
    let output = cluster.kubelet.claim(NAMESPACE, "resume-checkpoints");
    let first = trainer_pod(&cluster, "resume", 0).await;
    let checkpoint = output.join("checkpoints/step-00000002/trainer_state.json");
    let pid = cluster
        .wait("the first checkpoint of resume", Duration::from_secs(180), async || {
            checkpoint.is_file().then(|| cluster.kubelet.pid(NAMESPACE, &first.name_any())).flatten()
        })
        .await;
    // SAFETY: SIGKILL to the trainer process the kubelet started, as an out-of-memory kill would.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    cluster
        .wait("the killed trainer gone", Duration::from_secs(30), async || (!alive(pid)).then_some(()))
        .await;
    // The newest checkpoint it left (a fast step may have added one after the first).
    let checkpoints = std::fs::read_dir(output.join("checkpoints")).unwrap();
    let newest = checkpoints
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("step-")?.parse::<u64>().ok())
        .max()
        .unwrap();
    let second = trainer_pod(&cluster, "resume", 1).await;
    let args = second.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
    assert_eq!(args.last().map(String::as_str), Some("--resume"), "{args:?}");
    // The new attempt's own trainer reports a step past the checkpoint it loaded.
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let step = cluster
        .wait("a step of the resumed trainer", Duration::from_secs(120), async || {
            let ip = pods.get(&second.name_any()).await.ok()?.status?.pod_ip?;
            let status: Value =
                direct.get(format!("http://{ip}:8002/status")).send().await.ok()?.json().await.ok()?;
            status["step"].as_u64().filter(|s| *s > newest)
        })
        .await;
    let log = cluster.kubelet.logs(NAMESPACE, &second.name_any());
    let resumed = log.lines().find(|l| l.contains("resuming")).unwrap_or_else(|| panic!("{log}"));
    assert!(resumed.contains(&format!("\"step\":{newest}")), "{resumed}");
    assert!(resumed.contains(&format!("step-{newest:08}")), "{resumed}");
    let steps = steps_logged(&output);
    assert!(steps.len() as u64 > step, "{steps:?}");
    assert_eq!(steps, (0..steps.len() as u64).collect::<Vec<_>>(), "no step twice, none missing");
    // The operator follows the resumed trainer through its Service (the killed one, checkpointing
    // every 2 steps, never got past step newest + 2).
    let status = training_job_status(&cluster, "resume", Duration::from_secs(120), |s| {
        s.attempts == 2 && s.step > newest + 2
    })
    .await;
    assert_eq!((status.phase, status.failures), (TrainingJobPhase::Running, 1), "{status:?}");

    // 4. Deleting the TrainingJob stops its trainer, and only it.
    let pid = cluster.kubelet.pid(NAMESPACE, &second.name_any()).expect("the resumed trainer runs");
    let retriever_pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=retriever"))
        .await
        .unwrap();
    let retriever_pid = cluster.kubelet.pid(NAMESPACE, &retriever_pods.items[0].name_any()).unwrap();
    Api::<TrainingJob>::namespaced(client.clone(), NAMESPACE)
        .delete("resume", &DeleteParams::default())
        .await
        .unwrap();
    let exit = cluster
        .wait("the resumed trainer stopped", Duration::from_secs(60), async || {
            cluster.kubelet.exits().into_iter().find(|e| e.pod == second.name_any())
        })
        .await;
    let log = cluster.kubelet.logs(NAMESPACE, &second.name_any());
    assert!(!exit.killed_after_grace, "the trainer ignored SIGTERM until its grace period ended: {exit:?}");
    assert_eq!(exit.status.code(), Some(143), "stopped by SIGTERM, not by an error: {log}");
    assert!(log.contains("stopped by a termination signal"), "{log}");
    assert!(!alive(pid), "the trainer process {pid} still exists");
    assert!(alive(retriever_pid), "the retriever belongs to no TrainingJob");
    let jobs = Api::<Job>::namespaced(client.clone(), NAMESPACE).list(&ListParams::default()).await.unwrap();
    assert!(
        jobs.items.iter().all(|j| !j.name_any().starts_with("resume-")),
        "the Jobs went with their owner"
    );
    let services =
        Api::<Service>::namespaced(client.clone(), NAMESPACE).get_opt("resume-trainer").await.unwrap();
    assert!(services.is_none());
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
