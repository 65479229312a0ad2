//! TrainingJobs behind a real Kueue (`scripts/control-plane.sh up --kueue`: Kueue's manager, its
//! CRDs and webhooks, built from its Go module) on a real control plane without a node: the
//! operator labels the trainer Jobs for their LocalQueue and creates them suspended, Kueue admits
//! them by quota (unsuspending them) and by priority preempts them (suspending them again), and
//! the TrainingJobs show it: `Queued` with Kueue's reason, `Running` once admitted, a preemption
//! counted as such and not as a failure. Without a node the trainers' Pods stay Pending; the
//! checkpoint a preempted trainer writes on SIGTERM and resumes from is tests/tests/train_cli.rs'.

use kart_tests::control_plane::{API_SECONDS, Addon, ControlPlane, Node};
use kart_tests::eventually;
use kart_tests::operator::Operator;
use serde_json::{Value, json};

const NAMESPACE: &str = "ml";

/// The cluster with Kueue, kart's CRDs and operator, a ResourceFlavor `default`, the priority
/// classes `low` and `high`, and in [`NAMESPACE`] the LocalQueues `team` (ClusterQueue `gpus`,
/// 2 GPUs, preempting lower priorities) and `gang` (ClusterQueue `gang`, 3 GPUs).
struct Cluster {
    cp: ControlPlane,
    operator: Operator,
}

impl Cluster {
    fn start(dir: &std::path::Path) -> Cluster {
        let cp = ControlPlane::up_with(dir, Node::Absent, &[Addon::Kueue]).unwrap();
        cp.install_crds().unwrap();
        cp.run_kubectl(&["create", "namespace", NAMESPACE]).unwrap();
        let operator =
            Operator::start(&cp.kubeconfig, "kart-operator-0", &dir.join("operator.log"), &[]).unwrap();
        let cluster = Cluster { cp, operator };
        let cluster_queue = |name: &str, gpus: u32| {
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
                   "spec": {"namespaceSelector": {},
                            "preemption": {"withinClusterQueue": "LowerPriority"},
                            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                                "flavors": [{"name": "default", "resources": [
                                                    {"name": "cpu", "nominalQuota": "64"},
                                                    {"name": "memory", "nominalQuota": "256Gi"},
                                                    {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
        };
        let local_queue = |name: &str, cluster_queue: &str| {
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                   "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"clusterQueue": cluster_queue}})
        };
        let priority = |name: &str, value: u32| {
            json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                   "metadata": {"name": name}, "value": value})
        };
        cluster.apply(
            "queues",
            &json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
                cluster_queue("gpus", 2), cluster_queue("gang", 3),
                local_queue("team", "gpus"), local_queue("gang", "gang"),
                priority("low", 100), priority("high", 1000)]}),
        );
        cluster
    }

    /// `kubectl apply` of `object`.
    fn apply(&self, name: &str, object: &Value) {
        let path = self.cp.dir.join(format!("{name}.json"));
        std::fs::write(&path, object.to_string()).unwrap();
        self.cp.run_kubectl(&["apply", "-f", &path.display().to_string()]).unwrap();
    }

    /// TrainingJob `name`'s status once `ready` holds of it.
    fn status_when(&self, name: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        eventually(
            API_SECONDS,
            &format!("TrainingJob {name}: {what}"),
            || format!("{}\n{}", self.operator.log_text(), self.cp.logs_tail()),
            || {
                let tj = self.cp.get_json(&["tj", name, "-n", NAMESPACE]).ok()?;
                ready(&tj["status"]).then(|| tj["status"].clone())
            },
        )
    }

    /// The trainer Job of TrainingJob `name`'s first attempt.
    fn job(&self, name: &str) -> Value {
        self.cp.get_json(&["job", &format!("{name}-trainer-0"), "-n", NAMESPACE]).unwrap()
    }

    /// How many Pods the trainer Jobs of TrainingJob `name` have.
    fn pods(&self, name: &str) -> usize {
        let selector = format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=trainer");
        let pods = self.cp.get_json(&["pods", "-n", NAMESPACE, "-l", &selector]).unwrap();
        pods["items"].as_array().unwrap().len()
    }

    /// The reasons of the Events on TrainingJob `name`.
    fn events(&self, name: &str) -> Vec<String> {
        let selector = format!("involvedObject.kind=TrainingJob,involvedObject.name={name}");
        let events = self.cp.get_json(&["events", "-n", NAMESPACE, "--field-selector", &selector]).unwrap();
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

/// A TrainingJob `name` in LocalQueue `queue` of `nodes` pods with `gpus` GPUs each, rolling out
/// on a pool of its own (`config.rollout.urls`).
fn training_job(name: &str, queue: &str, nodes: u32, gpus: u32, priority: Option<&str>) -> Value {
    let labels = priority.map_or_else(|| json!({}), |p| json!({"kueue.x-k8s.io/priority-class": p}));
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
           "spec": {"queueName": queue, "nodes": nodes,
                    "checkpoint": {"accessModes": [if nodes > 1 { "ReadWriteMany" } else { "ReadWriteOnce" }]},
                    "config": {"model": "/models/qwen", "data": {"train": "/data/train.parquet"}, "total_steps": 5,
                               "rollout": {"urls": ["http://rollouts.ml.svc:8000"]}},
                    "pod": {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": gpus},
                                          "limits": {"nvidia.com/gpu": gpus}}}}})
}

fn phase(status: &Value) -> &str {
    status["phase"].as_str().unwrap_or("")
}

#[test]
fn queued_training_jobs_wait_for_quota_are_admitted_whole_and_preempted_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path());
    let cp = &cluster.cp;

    // 1. Quota for one job's GPUs: the first runs, the second waits with Kueue's reason, and runs
    // once the first is gone.
    cluster.apply("first", &training_job("first", "team", 1, 2, None));
    let first = cluster.status_when("first", "admitted and Running", |s| phase(s) == "Running");
    assert_eq!(first["queue"]["admitted"], true, "{first}");
    assert_eq!(
        (first["queue"]["reason"].as_str(), first["queue"]["clusterQueue"].as_str()),
        (Some("Admitted"), Some("gpus"))
    );
    let job = cluster.job("first");
    assert_eq!(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team");
    assert_eq!(job["spec"]["suspend"], false, "Kueue unsuspended the Job it admitted");
    cluster.apply("second", &training_job("second", "team", 1, 2, None));
    let second = cluster.status_when("second", "Queued for want of quota", |s| {
        // Pending at first without a word ("not yet considered by Kueue"), then with its reason.
        phase(s) == "Queued"
            && s["queue"]["reason"] == "Pending"
            && s["queue"]["message"].as_str().is_some_and(|m| m.contains("insufficient"))
    });
    let message = second["queue"]["message"].as_str().unwrap_or("");
    assert!(message.contains("insufficient") && message.contains("nvidia.com/gpu"), "{second}");
    assert!(second["queue"]["workload"].as_str().is_some_and(|w| !w.is_empty()), "{second}");
    let queued = second["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Queued").cloned();
    assert_eq!(queued.as_ref().map(|c| c["status"].clone()), Some(json!("True")), "{second}");
    assert_eq!(cluster.job("second")["spec"]["suspend"], true);
    assert_eq!(cluster.pods("second"), 0, "a queued Job has no Pods");
    let listing = cp.run_kubectl(&["get", "tj", "second", "-n", NAMESPACE]).unwrap();
    let (header, row) = listing.split_once('\n').unwrap();
    let columns: Vec<&str> = header.split_whitespace().collect();
    let values: Vec<&str> = row.split_whitespace().collect();
    let column =
        |name: &str| values[columns.iter().position(|c| *c == name).unwrap_or_else(|| panic!("{listing}"))];
    assert_eq!((column("PHASE"), column("QUEUE")), ("Queued", "Pending"), "{listing}");
    assert!(cluster.events("second").contains(&"Queued".to_string()));
    cp.run_kubectl(&["delete", "tj", "first", "-n", NAMESPACE]).unwrap();
    let second = cluster.status_when("second", "admitted once the quota is free", |s| phase(s) == "Running");
    assert_eq!((second["failures"].as_i64(), second["attempts"].as_i64()), (Some(0), Some(1)), "{second}");
    assert!(cluster.events("second").contains(&"Admitted".to_string()));

    // 2. A gang: two pods of two GPUs each against 3 GPUs of quota is not admitted in part (no Pod
    // at all); with a fourth GPU both Pods are made at once.
    cluster.apply("gang", &training_job("gang", "gang", 2, 2, None));
    let gang = cluster.status_when("gang", "Queued as a whole", |s| {
        // Pending at first without a word ("not yet considered by Kueue"), then with its reason.
        phase(s) == "Queued"
            && s["queue"]["reason"] == "Pending"
            && s["queue"]["message"].as_str().is_some_and(|m| m.contains("insufficient"))
    });
    assert!(gang["queue"]["message"].as_str().unwrap_or("").contains("nvidia.com/gpu"), "{gang}");
    assert_eq!((cluster.pods("gang"), cluster.job("gang")["spec"]["suspend"].clone()), (0, json!(true)));
    cp.run_kubectl(&[
        "patch", "clusterqueue", "gang", "--type", "json", "-p",
        r#"[{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/2/nominalQuota", "value": 4}]"#,
    ])
    .unwrap();
    cluster.status_when("gang", "admitted whole", |s| phase(s) == "Running");
    eventually(
        API_SECONDS,
        "both Pods of the gang",
        || cp.describe(),
        || (cluster.pods("gang") == 2).then_some(()),
    );

    // 3. Preemption: a high-priority job evicts the low-priority one running in `team`'s quota;
    // the evicted run waits Queued (a preemption, not a failure) and, readmitted, runs the same
    // Job again, whose Pods resume.
    cp.run_kubectl(&["delete", "tj", "second", "-n", NAMESPACE]).unwrap();
    cluster.apply("low", &training_job("low", "team", 1, 2, Some("low")));
    cluster.status_when("low", "Running", |s| phase(s) == "Running");
    cluster.apply("high", &training_job("high", "team", 1, 2, Some("high")));
    let low = cluster.status_when("low", "preempted", |s| phase(s) == "Queued" && s["preemptions"] == 1);
    assert_eq!(low["queue"]["reason"], "Preempted", "{low}");
    assert_eq!((low["failures"].as_i64(), low["attempts"].as_i64()), (Some(0), Some(1)), "{low}");
    assert!(cluster.events("low").contains(&"Preempted".to_string()), "{:?}", cluster.events("low"));
    cluster.status_when("high", "Running", |s| phase(s) == "Running");
    cp.run_kubectl(&["delete", "tj", "high", "-n", NAMESPACE]).unwrap();
    let low = cluster.status_when("low", "readmitted", |s| phase(s) == "Running");
    assert_eq!(
        (low["preemptions"].as_i64(), low["failures"].as_i64(), low["attempts"].as_i64()),
        (Some(1), Some(0), Some(1)),
        "{low}"
    );
    let args = cluster.job("low")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(args.as_array().unwrap().contains(&json!("--resume")), "{args}");

    // 4. A RolloutPool held until admitted runs no workers while its TrainingJob waits (behind
    // `low`), and scales up once Kueue admits it.
    cluster.apply(
        "held",
        &json!({"apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool",
                "metadata": {"name": "held", "namespace": NAMESPACE},
                "spec": {"replicas": 2, "holdUntilAdmitted": true,
                         "config": {"model": "/models/qwen", "engine": {"kind": "embedded"}}}}),
    );
    let workers = || {
        cp.get_json(&["deploy", "held-rollout", "-n", NAMESPACE]).ok().map(|d| d["spec"]["replicas"].clone())
    };
    let pool_phase =
        || cp.get_json(&["rp", "held", "-n", NAMESPACE]).ok().map(|p| p["status"]["phase"].clone());
    eventually(
        API_SECONDS,
        "the pool held at zero workers",
        || cluster.operator.log_text(),
        || (pool_phase()? == "Held" && workers()? == 0).then_some(()),
    );
    let mut served = training_job("served", "team", 1, 2, None);
    served["spec"]["rolloutPoolRef"] = json!("held");
    served["spec"]["config"].as_object_mut().unwrap().remove("rollout");
    cluster.apply("served", &served);
    cluster.status_when("served", "Queued behind low", |s| {
        // Pending at first without a word ("not yet considered by Kueue"), then with its reason.
        phase(s) == "Queued"
            && s["queue"]["reason"] == "Pending"
            && s["queue"]["message"].as_str().is_some_and(|m| m.contains("insufficient"))
    });
    assert_eq!((pool_phase(), workers()), (Some(json!("Held")), Some(json!(0))), "held while its job waits");
    cp.run_kubectl(&["delete", "tj", "low", "-n", NAMESPACE]).unwrap();
    cluster.status_when("served", "admitted", |s| phase(s) == "Running");
    eventually(
        API_SECONDS,
        "the pool's workers once its job runs",
        || cluster.operator.log_text(),
        || (workers()? == 2 && pool_phase()? != "Held").then_some(()),
    );
}
