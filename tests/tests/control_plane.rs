//! kart's CRDs, examples and operator against a real Kubernetes control plane without a node
//! (`scripts/control-plane.sh up --node none`): the API server's schema validation and CEL rules,
//! printer columns and the scale subresource as `kubectl` shows them, leader election, and the
//! operator's children turned into ReplicaSets and Pods by the real controllers and collected by
//! the real garbage collector. The Pods stay Pending: tests/real_node.rs runs them on a real node.

use kart_tests::control_plane::{API_SECONDS, ControlPlane, Node};
use kart_tests::operator::Operator;
use kart_tests::{eventually, http, repo_root};
use std::path::Path;
use std::time::Duration;

/// Starts `kart-operator run args…` with `kubeconfig` as Pod `pod`, logging to `dir/<pod>.log`.
fn start_operator(kubeconfig: &Path, pod: &str, dir: &Path, args: &[&str]) -> Operator {
    Operator::start(kubeconfig, pod, &dir.join(format!("{pod}.log")), args).unwrap()
}

/// A BM25 Retriever `wiki` and a RolloutPool `pool` of two embedded-engine workers in `namespace`.
fn apply_pool(cp: &ControlPlane, namespace: &str) {
    apply_pool_named(cp, namespace, "pool");
}

/// [`apply_pool`] with the RolloutPool named `pool`.
fn apply_pool_named(cp: &ControlPlane, namespace: &str, pool: &str) {
    let resources = r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever", "metadata": {"name": "wiki"},
         "spec": {"config": {"method": "bm25", "topk": 3}, "corpus": "/data/corpus.jsonl", "index": {"size": "1Gi"}}},
        {"apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "POOL"},
         "spec": {"replicas": 2, "retrieverRef": "wiki",
                  "config": {"model": "/models/tiny-qwen2", "engine": {"kind": "embedded"},
                             "env": {"kind": "search-r1", "max_turns": 2}}}}]}"#;
    let path = cp.dir.join(format!("resources-{namespace}-{pool}.json"));
    std::fs::write(&path, resources.replace("POOL", pool)).unwrap();
    cp.run_kubectl(&["apply", "-n", namespace, "-f", &path.display().to_string()]).unwrap();
}

/// A RolloutPool `llm` whose vLLM servers the operator runs, and a TrainingJob `tune` of LoRA
/// adapters (rank 32) published to them by `vllm_disk`, in `namespace` (beside [`apply_pool`]'s
/// Retriever `wiki`).
fn apply_lora_job(cp: &ControlPlane, namespace: &str) {
    let resources = r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "llm"},
         "spec": {"replicas": 1, "retrieverRef": "wiki", "inference": {"replicas": 1},
                  "config": {"model": "/models/qwen", "engine": {"kind": "vllm", "model": "qwen"}}}},
        {"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "tune"},
         "spec": {"retrieverRef": "wiki", "rolloutPoolRef": "llm",
                  "config": {"model": "/models/qwen", "data": {"train": "/data/train.parquet"},
                             "total_steps": 5, "lora": {"r": 32, "target_modules": "all-linear"},
                             "weight_sync": {"kind": "vllm_disk", "path": "/weights/tune"}}}}]}"#;
    let path = cp.dir.join(format!("resources-{namespace}-lora.json"));
    std::fs::write(&path, resources).unwrap();
    cp.run_kubectl(&["apply", "-n", namespace, "-f", &path.display().to_string()]).unwrap();
}

/// Field `field` of the spec of the operator's Lease `kart-operator` in `namespace`.
fn lease(cp: &ControlPlane, namespace: &str, field: &str) -> anyhow::Result<String> {
    let jsonpath = format!("jsonpath={{.spec.{field}}}");
    cp.run_kubectl(&["get", "lease", "kart-operator", "-n", namespace, "-o", &jsonpath])
}

/// How many Pods of RolloutPool `pool`'s Deployment there are in `namespace`.
fn pool_pods(cp: &ControlPlane, namespace: &str, pool: &str) -> usize {
    let pods = cp.run_kubectl(&["get", "pods", "-n", namespace, "-o", "name"]).unwrap_or_default();
    pods.lines().filter(|p| p.starts_with(&format!("pod/{pool}-"))).count()
}

/// A control plane in `dir` with kart's CRDs and the namespace `namespace`.
fn with_crds_and_namespace(dir: &Path, namespace: &str) -> ControlPlane {
    let cp = ControlPlane::up(dir, Node::Absent).unwrap();
    cp.install_crds().unwrap();
    cp.run_kubectl(&["create", "namespace", namespace]).unwrap();
    cp
}

/// The CRDs install into a real API server; every example is admitted and reconciled (its
/// resources given a phase, their workloads created; there is no node, so the examples, which
/// need GPUs, models or an API key, do not run); a spec that breaks a CEL rule is rejected with the
/// rule's message, as `kubectl` shows it to a user; `kubectl get` shows the printer columns and
/// `kubectl scale` resizes a RolloutPool through its scale subresource, down to its Deployment.
#[test]
fn crds_examples_cel_rules_and_subresources_on_a_real_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::up(dir.path(), Node::Absent).unwrap();
    cp.install_crds().unwrap();
    let operator = start_operator(&cp.kubeconfig, "kart-operator-0", dir.path(), &[]);

    let examples = repo_root().join("deploy/examples");
    let mut files: Vec<_> = std::fs::read_dir(&examples).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for (i, file) in files.iter().enumerate() {
        let namespace = format!("example-{i}");
        cp.run_kubectl(&["create", "namespace", &namespace]).unwrap();
        let out = cp.run_kubectl(&["apply", "-n", &namespace, "-f", &file.display().to_string()]);
        assert!(out.is_ok(), "{}: {out:?}", file.display());
    }
    for (i, file) in files.iter().enumerate() {
        let namespace = format!("example-{i}");
        let what = format!("{} reconciled", file.display());
        eventually(
            API_SECONDS,
            &what,
            || operator.log_text(),
            || {
                let resources = cp.get_json(&["ret,rp,tj", "-n", &namespace]).ok()?;
                let resources = resources["items"].as_array()?.clone();
                let phased =
                    resources.iter().all(|r| r["status"]["phase"].as_str().is_some_and(|p| !p.is_empty()));
                let workloads = cp.get_json(&["deploy,jobs", "-n", &namespace]).ok()?;
                let owned = workloads["items"].as_array()?.iter().any(|w| {
                    let owner = &w["metadata"]["ownerReferences"][0];
                    owner["apiVersion"] == "kart.dev/v1alpha1" && owner["controller"] == true
                });
                (!resources.is_empty() && phased && owned).then_some(())
            },
        );
    }

    let invalid = r#"{"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever",
        "metadata": {"name": "too-many"},
        "spec": {"replicas": 1, "corpus": "/data/c.jsonl", "config": {"method": "bm25", "topk": 5000}}}"#;
    let path = dir.path().join("too-many.json");
    std::fs::write(&path, invalid).unwrap();
    let refused = cp.run_kubectl(&["apply", "-f", &path.display().to_string()]);
    let error = refused.expect_err("the API server admitted topk 5000").to_string();
    assert!(error.contains("config.topk must be between 1 and 1000"), "{error}");

    let listing = cp.run_kubectl(&["get", "tj", "--all-namespaces"]).unwrap();
    let header = listing.lines().next().unwrap_or_default();
    for column in ["NAME", "PHASE", "RANKS", "STEP", "REWARD"] {
        assert!(header.contains(column), "kubectl get tj: {listing}");
    }
    let pools = cp
        .run_kubectl(&[
            "get",
            "rp",
            "-A",
            "-o",
            "jsonpath={.items[0].metadata.namespace} {.items[0].metadata.name}",
        ])
        .unwrap();
    let (namespace, pool) = pools.split_once(' ').unwrap();
    cp.run_kubectl(&["scale", "rp", pool, "-n", namespace, "--replicas", "3"]).unwrap();
    let replicas =
        cp.run_kubectl(&["get", "rp", pool, "-n", namespace, "-o", "jsonpath={.spec.replicas}"]).unwrap();
    assert_eq!(replicas, "3");
    eventually(
        API_SECONDS,
        "the pool's Deployment scaled by the operator",
        || operator.log_text(),
        || {
            let workers = cp.get_json(&["deploy", &format!("{pool}-rollout"), "-n", namespace]).ok()?;
            (workers["spec"]["replicas"] == 3).then_some(())
        },
    );
}

/// The operator, out of the cluster with the admin's kubeconfig, reconciles a RolloutPool: the
/// API server accepts every child it applies, the real Deployment and ReplicaSet controllers make
/// the Pods, and deleting the pool lets the real garbage collector remove every child through
/// their owner references (the Pods, bound to no node, go at once). The operator serves its
/// health, readiness and metrics, holds its Lease, and on SIGTERM exits cleanly, releasing it.
#[test]
fn the_operator_reconciles_and_the_real_controllers_take_over() {
    let dir = tempfile::tempdir().unwrap();
    let namespace = "kart";
    let cp = with_crds_and_namespace(dir.path(), namespace);

    let args = ["--namespace", namespace, "--lease-namespace", namespace];
    let operator = start_operator(&cp.kubeconfig, "kart-operator-0", dir.path(), &args);
    apply_pool(&cp, namespace);
    let http = http();
    let get = |path: &str| -> Option<String> {
        let response = http.get(format!("{}{path}", operator.url)).send().ok()?;
        response.status().is_success().then(|| response.text().ok()).flatten()
    };
    let healthz = eventually(API_SECONDS, "the operator healthy", || operator.log_text(), || get("/healthz"));
    assert_eq!(healthz, "ok");
    eventually(API_SECONDS, "the operator ready", || operator.log_text(), || get("/readyz"));

    let operator_log = || operator.log_text();
    // The names of the objects of `kinds`, or `None` when kubectl fails (never an empty list).
    let names = |kinds: &str| -> Option<Vec<String>> {
        let out = cp.run_kubectl(&["get", kinds, "-n", namespace, "-o", "name"]).ok()?;
        Some(out.lines().map(str::to_owned).collect())
    };
    let pool_pods = || -> Option<Vec<String>> {
        Some(names("pods")?.into_iter().filter(|p| p.starts_with("pod/pool-")).collect())
    };
    eventually(
        API_SECONDS,
        "two Pods of the pool's Deployment, made by the real controllers",
        || cp.describe(),
        || (pool_pods()?.len() == 2).then_some(()),
    );
    let owners = cp
        .run_kubectl(&[
            "get",
            "deploy",
            "-n",
            namespace,
            "-o",
            "jsonpath={.items[*].metadata.ownerReferences[0].kind}",
        ])
        .unwrap();
    assert!(owners.split_whitespace().any(|k| k == "RolloutPool"), "{owners}\n{}", operator_log());
    let replica_sets = names("rs").unwrap();
    assert!(replica_sets.iter().any(|r| r.starts_with("replicaset.apps/pool-")), "{replica_sets:?}");

    // The servers of a pool that a TrainingJob publishes LoRA adapters to load adapters of its
    // rank while it is there, and stop when it is gone.
    apply_lora_job(&cp, namespace);
    let server_args = || {
        let jsonpath = "jsonpath={.spec.template.spec.containers[0].args}";
        cp.run_kubectl(&["get", "deploy", "llm-vllm", "-n", namespace, "-o", jsonpath]).ok()
    };
    let args = eventually(
        API_SECONDS,
        "the vLLM servers taking the TrainingJob's adapters",
        || format!("{}\n{}", cp.describe(), operator_log()),
        || server_args().filter(|a| a.contains("--enable-lora")),
    );
    assert!(args.contains(r#""--max-lora-rank","32""#), "{args}");
    cp.run_kubectl(&["delete", "tj", "tune", "-n", namespace, "--wait=true"]).unwrap();
    eventually(
        API_SECONDS,
        "the vLLM servers without adapters once the TrainingJob is gone",
        || format!("{}\n{}", cp.describe(), operator_log()),
        || server_args().filter(|a| !a.contains("--enable-lora")).map(drop),
    );

    cp.run_kubectl(&["delete", "rp", "pool", "-n", namespace, "--wait=true"]).unwrap();
    eventually(
        API_SECONDS,
        "the garbage collector removing the pool's children",
        || cp.describe(),
        || {
            let left: Vec<String> =
                names("deploy,rs,pods,svc")?.into_iter().filter(|n| n.contains("/pool")).collect();
            left.is_empty().then_some(())
        },
    );
    let retriever = names("deploy,svc,jobs").unwrap();
    assert!(retriever.iter().any(|n| n.contains("wiki")), "the retriever's children stay: {retriever:?}");

    let metrics = get("/metrics").unwrap();
    assert!(metrics.contains("kart_operator_reconciles_total{controller=\"rollout-pool\"}"), "{metrics}");
    assert_eq!(lease(&cp, namespace, "holderIdentity").unwrap(), "kart-operator-0");
    let exit = operator.terminate(Duration::from_secs(120));
    assert!(exit.success(), "the operator's exit on SIGTERM: {exit}");
    assert_eq!(lease(&cp, namespace, "holderIdentity").unwrap(), "", "the Lease is released on shutdown");

    // Dropped, the control plane stops every process it started and frees etcd's memory.
    let pids: Vec<i32> = std::fs::read_to_string(cp.dir.join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    let etcd_data = std::fs::read_to_string(cp.dir.join("etcd-in-memory")).unwrap();
    assert!(pids.len() >= 4 && Path::new(etcd_data.trim()).is_dir(), "{pids:?} {etcd_data}");
    drop(cp);
    // SAFETY: signal 0 only checks whether a process exists.
    let alive: Vec<i32> = pids.into_iter().filter(|&pid| unsafe { libc::kill(pid, 0) } == 0).collect();
    assert!(alive.is_empty(), "left running: {alive:?}");
    assert!(!Path::new(etcd_data.trim()).exists(), "{etcd_data} left behind");
}

/// Two operator replicas elect one leader on a real Lease: the leader reconciles, and when it is
/// killed (SIGKILL, no release) the other takes the Lease once it expires and reconciles what
/// arrives next, down to `kubectl scale rp` resizing the workers.
#[test]
fn two_operator_replicas_elect_one_leader_and_hand_over_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let namespace = "ops";
    let cp = with_crds_and_namespace(dir.path(), namespace);
    // Long enough that a loaded machine's slow renewals never lose the Lease; the handover
    // below waits it out once.
    let args = ["--lease-namespace", namespace, "--lease-duration-seconds", "15"];
    let mut replicas: Vec<(String, Option<Operator>)> = ["op-a", "op-b"]
        .into_iter()
        .map(|id| (id.to_string(), Some(start_operator(&cp.kubeconfig, id, dir.path(), &args))))
        .collect();
    let holder = || lease(&cp, namespace, "holderIdentity").ok().filter(|h| !h.is_empty());
    let first = eventually(API_SECONDS, "a leader", || cp.describe(), holder);
    apply_pool_named(&cp, namespace, "first");
    eventually(
        API_SECONDS,
        "the leader reconciling the first pool",
        || cp.describe(),
        || (pool_pods(&cp, namespace, "first") == 2).then_some(()),
    );

    let (_, leader) = replicas.iter_mut().find(|(id, _)| *id == first).expect("the leader is a replica");
    drop(leader.take());
    let second = eventually(
        API_SECONDS,
        "the other replica taking the expired Lease",
        || cp.describe(),
        || holder().filter(|h| *h != first),
    );
    assert!(["op-a", "op-b"].contains(&second.as_str()), "{second}");
    apply_pool_named(&cp, namespace, "second");
    eventually(
        API_SECONDS,
        "the new leader reconciling the second pool",
        || cp.describe(),
        || (pool_pods(&cp, namespace, "second") == 2).then_some(()),
    );
    let transitions = lease(&cp, namespace, "leaseTransitions").unwrap();
    assert!(transitions.parse::<u32>().unwrap() >= 1, "{transitions}");

    // `kubectl scale rp` resizes the workers: the scale subresource, the operator, the
    // Deployment and ReplicaSet controllers, all for real.
    cp.run_kubectl(&["scale", "rp", "second", "-n", namespace, "--replicas", "3"]).unwrap();
    eventually(
        API_SECONDS,
        "three workers of the scaled pool",
        || cp.describe(),
        || (pool_pods(&cp, namespace, "second") == 3).then_some(()),
    );
}
