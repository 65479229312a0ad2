//! kart's CRDs, examples and operator against a real Kubernetes control plane
//! (`scripts/control-plane.sh`): the API server's schema validation and CEL rules, printer
//! columns and the scale subresource as `kubectl` shows them, and the operator's children turned
//! into ReplicaSets and Pods by the real controllers and collected by the real garbage collector.

use kart_tests::control_plane::ControlPlane;
use kart_tests::{binary, free_port, repo_root};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `check` every 200 ms until it returns `Some`, or fails after `seconds` naming `what`.
fn eventually<T>(seconds: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what} within {seconds}s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn install_crds(cp: &ControlPlane) {
    let crds = repo_root().join("crds/kart.dev_crds.yaml");
    cp.run_kubectl(&["apply", "--server-side", "-f", &crds.display().to_string()]).unwrap();
    cp.run_kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/retrievers.kart.dev",
        "crd/rolloutpools.kart.dev",
        "crd/trainingjobs.kart.dev",
    ])
    .unwrap();
}

/// The CRDs install into a real API server; every example is admitted; a spec that breaks a CEL
/// rule is rejected with the rule's message, as `kubectl` shows it to a user; `kubectl get`
/// shows the printer columns and `kubectl scale` resizes a RolloutPool through its scale
/// subresource.
#[test]
fn crds_examples_cel_rules_and_subresources_on_a_real_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::up(dir.path()).unwrap();
    install_crds(&cp);

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

    let invalid = r#"{"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever",
        "metadata": {"name": "too-many"},
        "spec": {"replicas": 1, "corpus": "/data/c.jsonl", "config": {"method": "bm25", "topk": 5000}}}"#;
    let output = cp
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(invalid.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the API server admitted topk 5000");
    assert!(stderr.contains("config.topk must be between 1 and 1000"), "{stderr}");

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
}

/// The operator, out of the cluster with the admin's kubeconfig, reconciles a RolloutPool: the
/// API server accepts every child it applies, the real Deployment and ReplicaSet controllers make
/// the Pods (Pending: this control plane has no node), and deleting the pool lets the real
/// garbage collector remove every child through their owner references.
#[test]
fn the_operator_reconciles_and_the_real_controllers_take_over() {
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::up(dir.path()).unwrap();
    install_crds(&cp);
    let namespace = "kart";
    cp.run_kubectl(&["create", "namespace", namespace]).unwrap();

    let port = free_port();
    let log = dir.path().join("operator.log");
    let mut command = Command::new(binary("kart-operator"));
    command
        .args(["run", "--http-port", &port.to_string(), "--log-format", "text"])
        .args(["--namespace", namespace, "--lease-namespace", namespace])
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("POD_NAME", "kart-operator-0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _operator = kart_tests::Child(command.spawn().unwrap());

    let resources = r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever", "metadata": {"name": "wiki"},
         "spec": {"config": {"method": "bm25", "topk": 3}, "corpus": "/data/corpus.jsonl", "index": {"size": "1Gi"}}},
        {"apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "pool"},
         "spec": {"replicas": 2, "retrieverRef": "wiki",
                  "config": {"model": "/models/tiny-qwen2", "engine": {"kind": "embedded"},
                             "env": {"kind": "search-r1", "max_turns": 2}}}}]}"#;
    let path = dir.path().join("resources.json");
    std::fs::write(&path, resources).unwrap();
    cp.run_kubectl(&["apply", "-n", namespace, "-f", &path.display().to_string()]).unwrap();

    let operator_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let names = |kinds: &str| -> Vec<String> {
        let out = cp.run_kubectl(&["get", kinds, "-n", namespace, "-o", "name"]).unwrap_or_default();
        out.lines().map(str::to_owned).collect()
    };
    let pool_pods =
        || -> Vec<String> { names("pods").into_iter().filter(|p| p.starts_with("pod/pool-")).collect() };
    eventually(120, "two Pods of the pool's Deployment, made by the real controllers", || {
        (pool_pods().len() == 2).then_some(())
    });
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
    let replica_sets = names("rs");
    assert!(replica_sets.iter().any(|r| r.starts_with("replicaset.apps/pool-")), "{replica_sets:?}");

    cp.run_kubectl(&["delete", "rp", "pool", "-n", namespace, "--wait=true"]).unwrap();
    eventually(120, "the garbage collector removing the pool's children", || {
        let left: Vec<String> =
            names("deploy,rs,pods,svc").into_iter().filter(|n| n.contains("/pool")).collect();
        left.is_empty().then_some(())
    });
    let retriever = names("deploy,svc,jobs");
    assert!(retriever.iter().any(|n| n.contains("wiki")), "the retriever's children stay: {retriever:?}");
}
