//! kart on a real node (`scripts/control-plane.sh up --node kubelet`: containerd, runc, a CNI
//! bridge, the kubelet, kube-proxy and CoreDNS), running kart's images (`scripts/images.sh`, from
//! deploy/Dockerfile.*) in containers, as a user's cluster does.
//!
//! `helm install` of charts/kart runs the operator in the cluster from its image, under the
//! chart's ServiceAccount and RBAC, with in-cluster configuration (the API server through the
//! `kubernetes` Service); it reconciles the fixture-model Retriever, RolloutPool and TrainingJob,
//! whose Pods (the worker image) reach each other through Services and cluster DNS names, on
//! volumes of rancher's local-path-provisioner, every container as user 65532 on a read-only root
//! file system under the runtime's default seccomp profile.

use k8s_openapi::api::core::v1::Pod;
use kart_operator::crd::TrainingJob;
use kart_operator::crd::training_job::TrainingJobPhase;
use kart_tests::control_plane::{API_SECONDS, ControlPlane, Node};
use kart_tests::workloads::{retriever, rollout_pool, training_job};
use kart_tests::{
    binary, eventually, fresh_dir, http, repo_root, sample, steps_logged, walk_files, write_capitals,
};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

const NAMESPACE: &str = "ml";
const STEPS: u64 = 2;
/// How long a wait that spans training steps (and the trainer's start) may take on a loaded
/// machine.
const RUN_SECONDS: u64 = 1200;
/// The user every kart container runs as.
const KART_UID: u32 = 65532;

/// `scripts/images.sh all`: kart's images from the binaries this test runs (cached; a second test
/// binary waits on the first's build).
fn build_images() {
    let bin_dir = binary("kart").parent().unwrap().to_path_buf();
    let output = Command::new("bash")
        .arg(repo_root().join("scripts/images.sh"))
        .arg("all")
        .env("KART_BIN_DIR", bin_dir)
        .output()
        .expect("running scripts/images.sh");
    assert!(output.status.success(), "scripts/images.sh all: {}", String::from_utf8_lossy(&output.stderr));
}

/// Applies `object` (JSON) in the test namespace.
fn apply(cp: &ControlPlane, name: &str, object: &Value) {
    let path = cp.dir.join(format!("{name}.json"));
    std::fs::write(&path, object.to_string()).unwrap();
    cp.run_kubectl(&["apply", "-n", NAMESPACE, "-f", &path.display().to_string()]).unwrap();
}

/// The Pods of `namespace` (`None` while kubectl fails).
fn pods(cp: &ControlPlane, namespace: &str) -> Option<Vec<Pod>> {
    let list = cp.get_json(&["pods", "-n", namespace]).ok()?;
    serde_json::from_value(list["items"].clone()).ok()
}

/// The phase of TrainingJob `name` once `done` holds for its status.
fn training_job_status(
    cp: &ControlPlane,
    name: &str,
    done: impl Fn(TrainingJobPhase) -> bool,
) -> TrainingJobPhase {
    eventually(
        RUN_SECONDS,
        &format!("TrainingJob {name}"),
        || cp.describe(),
        || {
            let job: TrainingJob =
                serde_json::from_value(cp.get_json(&["tj", name, "-n", NAMESPACE]).ok()?).ok()?;
            job.status.map(|s| s.phase).filter(|phase| done(*phase))
        },
    )
}

#[test]
fn the_chart_and_a_training_job_run_in_containers_on_a_real_node() {
    let dir = fresh_dir("kart-real-node");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_capitals(&data);
    build_images();
    let cp = ControlPlane::up_with(&dir.join("control-plane"), Node::Kubelet).unwrap();
    let node = cp.get_json(&["node", "kart-node"]).unwrap();
    assert_eq!(node["status"]["capacity"]["nvidia.com/gpu"], "4", "the GPUs the Node reports");

    // 1. The chart, with two operator replicas: both run from the operator image, one leads.
    let chart = repo_root().join("charts/kart").display().to_string();
    let args = ["install", "kart", &chart, "--namespace", "kart-system", "--create-namespace"];
    let installed = cp.helm(&[&args[..], &["--set", "replicaCount=2"]].concat()).unwrap();
    assert!(installed.contains("kart: deployed (revision 1)"), "{installed}");
    let operators = eventually(
        API_SECONDS,
        "both operator Pods running and one ready (the leader)",
        || cp.describe(),
        || {
            let pods = pods(&cp, "kart-system")?;
            let running = pods.iter().filter(|p| phase(p) == "Running").count();
            let ready = pods.iter().filter(|p| ready(p)).count();
            (running == 2 && ready >= 1).then_some(pods)
        },
    );
    let lease = cp.get_json(&["lease", "kart-operator", "-n", "kart-system"]).unwrap();
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_string();
    assert!(operators.iter().any(|p| p.metadata.name.as_deref() == Some(&holder)), "{holder} leads");

    // 2. The fixture-model run, reconciled by the operator in the cluster, to the end.
    cp.run_kubectl(&["create", "namespace", NAMESPACE]).unwrap();
    apply(&cp, "wiki", &retriever(&data));
    apply(&cp, "pool", &rollout_pool(&data));
    apply(&cp, "search", &training_job("search", &data, STEPS));
    let phase_reached = training_job_status(&cp, "search", |p| p.is_finished());
    assert_eq!(phase_reached, TrainingJobPhase::Succeeded, "{}", cp.describe());

    // Its checkpoints are on a provisioned volume, written by the trainer's user.
    let output = cp.claim_folder(NAMESPACE, "search-checkpoints").unwrap();
    assert_eq!(steps_logged(&output), (0..=STEPS).collect::<Vec<_>>(), "{}", cp.describe());
    let written = walk_files(&output);
    assert!(written.iter().any(|p| p.ends_with("model/config.json")), "{written:?}");
    for file in &written {
        assert_eq!(
            std::fs::metadata(file).unwrap().uid(),
            KART_UID,
            "{} written as another user",
            file.display()
        );
    }

    // The workers' newest policy version (from the host, straight to their Pod addresses), and
    // the retriever reached from a worker's container by its Service's cluster DNS name.
    let workers: Vec<Pod> = pods(&cp, NAMESPACE)
        .unwrap()
        .into_iter()
        .filter(|p| label(p, "app.kubernetes.io/instance") == Some("pool"))
        .collect();
    assert_eq!(workers.len(), 2, "{}", cp.describe());
    let client = http();
    let mut newest = 0.0_f64;
    for worker in &workers {
        // From the host, straight to the Pod's address (the host routes to the node's Pod network).
        let ip = worker.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
        let metrics = client.get(format!("http://{ip}:8001/metrics")).send().unwrap().text().unwrap();
        newest = newest.max(sample(&metrics, "kart_rollout_policy_version").unwrap_or(0.0));
    }
    assert_eq!(newest, STEPS as f64, "the last step's policy reached the workers through their Service");
    let name = workers[0].metadata.name.as_deref().unwrap();
    let resolved =
        cp.run_kubectl(&["exec", "-n", NAMESPACE, name, "--", "getent", "hosts", "wiki-retriever"]).unwrap();
    assert!(resolved.contains("wiki-retriever.ml.svc.cluster.local"), "cluster DNS: {resolved}");
    let fetch =
        "import urllib.request; print(urllib.request.urlopen('http://wiki-retriever:8000/readyz').status)";
    let status = cp.run_kubectl(&["exec", "-n", NAMESPACE, name, "--", "python3", "-c", fetch]).unwrap();
    assert_eq!(status.trim(), "200", "the retriever through its Service");

    // 3. Every kart container (the operator's, the retriever's, the workers', the trainer's) ran
    // as user 65532, not root, on a read-only root file system, under RuntimeDefault.
    let mut all = pods(&cp, "kart-system").unwrap();
    all.extend(pods(&cp, NAMESPACE).unwrap());
    assert!(all.len() >= 6, "{}", cp.describe());
    for pod in &all {
        let name = pod.metadata.name.as_deref().unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let pod_context = spec.security_context.clone().unwrap_or_default();
        for container in &spec.containers {
            let context = container.security_context.clone().unwrap_or_default();
            // The user is the image's (`USER 65532`) unless the spec names one; running Pods are
            // asked below.
            let uid = context.run_as_user.or(pod_context.run_as_user).unwrap_or(KART_UID as i64);
            let non_root = context.run_as_non_root.or(pod_context.run_as_non_root);
            assert_eq!((uid, non_root), (KART_UID as i64, Some(true)), "{name}/{}", container.name);
            assert_eq!(context.read_only_root_filesystem, Some(true), "{name}/{}", container.name);
            let seccomp = context.seccomp_profile.or(pod_context.seccomp_profile.clone()).map(|s| s.type_);
            assert_eq!(seccomp.as_deref(), Some("RuntimeDefault"), "{name}/{}", container.name);
        }
        if phase(pod) == "Running" {
            let id = cp.run_kubectl(&["exec", "-n", &namespace(pod), name, "--", "id", "-u"]).unwrap();
            assert_eq!(id.trim(), KART_UID.to_string(), "{name} runs as");
            let write =
                cp.kubectl().args(["exec", "-n", &namespace(pod), name, "--", "touch", "/x"]).output();
            let stderr = String::from_utf8_lossy(&write.unwrap().stderr).into_owned();
            assert!(
                stderr.contains("Read-only file system"),
                "{name}: the root file system is writable: {stderr}"
            );
        }
    }

    // 4. The TIR sandbox in a worker container: under RuntimeDefault (which refuses the user
    // namespace bubblewrap needs) the worker fails at start saying so, as the README promises;
    // under the fix it gives (seccomp Unconfined, the rest of the restricted profile kept) it runs,
    // and the escape probes of kart-tools' sandbox tests, run in its container, are contained.
    apply(&cp, "tir", &tir_pool(None));
    let refused = eventually(
        RUN_SECONDS,
        "the TIR worker refused a sandbox under RuntimeDefault",
        || cp.describe(),
        || {
            let pod = tir_pods(&cp)?.into_iter().next()?;
            let name = pod.metadata.name.as_deref()?;
            let log = cp.run_kubectl(&["logs", "-n", NAMESPACE, name]).ok()?;
            log.contains("could not run").then_some(log)
        },
    );
    assert!(refused.contains("CLONE_NEWUSER") && refused.contains("isolation: none"), "{refused}");
    let unconfined = serde_json::json!({
        "runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "Unconfined"},
    });
    apply(&cp, "tir", &tir_pool(Some(unconfined)));
    let worker = eventually(
        RUN_SECONDS,
        "the TIR worker ready under seccomp Unconfined",
        || cp.describe(),
        || {
            let pods = tir_pods(&cp)?;
            let unconfined = |p: &Pod| {
                let context = p.spec.as_ref()?.containers[0].security_context.clone()?;
                Some(context.seccomp_profile?.type_ == "Unconfined")
            };
            let pod = pods.into_iter().find(|p| ready(p) && unconfined(p) == Some(true))?;
            pod.metadata.name
        },
    );
    let probes = cp
        .kubectl()
        .args(["exec", "-n", NAMESPACE, &worker, "--", "env", "TMPDIR=/scratch", "CARGO_MANIFEST_DIR=/probe"])
        .args(["KART_SANDBOX_CANARY=secret", "/probe/kart-tools-tests"])
        .args(["--exact", "python::tests::escapes_are_contained", "--test-threads=1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&probes.stdout);
    assert!(
        probes.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&probes.stderr)
    );

    // 5. The operator worked under the chart's RBAC: no request of either replica was refused.
    for operator in &operators {
        let name = operator.metadata.name.as_deref().unwrap();
        let log = cp.run_kubectl(&["logs", "-n", "kart-system", name]).unwrap();
        assert!(!log.contains("forbidden"), "a request the chart's RBAC refused:\n{log}");
    }
    cp.helm(&["uninstall", "kart", "--namespace", "kart-system"]).unwrap();
    cp.run_kubectl(&["get", "crd", "trainingjobs.kart.dev"]).expect("the CRDs are kept on uninstall");
    drop(cp);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A RolloutPool `tir` of one worker with a Python tool on the fixture model, its container's
/// security context `context` (the operator's default when `None`), kart-tools' unit-test binary
/// (the sandbox's escape probes) at /probe and a scratch folder at /scratch.
fn tir_pool(context: Option<Value>) -> Value {
    let models = kart_tests::shared_dir().join("fixtures/models").canonicalize().unwrap();
    let mut pod = serde_json::json!({
        "volumes": [{"name": "models", "hostPath": {"path": models}},
                    {"name": "probe", "hostPath": {"path": kart_tools_tests(), "type": "File"}},
                    {"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": true},
                         {"name": "probe", "mountPath": "/probe/kart-tools-tests", "readOnly": true},
                         {"name": "scratch", "mountPath": "/scratch"}],
    });
    if let Some(context) = context {
        pod["securityContext"] = context;
    }
    serde_json::json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "tir"},
        "spec": {
            "replicas": 1,
            "config": {
                "model": "/models/tiny-qwen2", "engine": {"kind": "embedded", "max_batch": 4},
                "env": {"kind": "tir", "tools": ["python"], "max_turns": 2, "max_length": 256},
            },
            "pod": pod,
        },
    })
}

/// The Pods of RolloutPool `tir`.
fn tir_pods(cp: &ControlPlane) -> Option<Vec<Pod>> {
    let pods = pods(cp, NAMESPACE)?;
    Some(pods.into_iter().filter(|p| label(p, "app.kubernetes.io/instance") == Some("tir")).collect())
}

/// kart-tools' unit-test binary of this build (the newest, should several be there).
fn kart_tools_tests() -> std::path::PathBuf {
    let deps = binary("kart").parent().unwrap().join("deps");
    let mut found: Vec<_> = std::fs::read_dir(&deps)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("kart_tools-") && p.extension().is_none()
        })
        .collect();
    found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    found.pop().unwrap_or_else(|| panic!("no kart_tools test binary in {}", deps.display()))
}

fn phase(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default()
}

fn ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn namespace(pod: &Pod) -> String {
    pod.metadata.namespace.clone().unwrap_or_default()
}
