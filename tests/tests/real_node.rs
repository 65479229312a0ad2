//! kart on a real node (`scripts/control-plane.sh up`: containerd, runc, a CNI bridge, the
//! kubelet, kube-proxy and CoreDNS), running kart's images (`scripts/images.sh`, from
//! deploy/Dockerfile.*) in containers, as a user's cluster does: one cluster for the whole story,
//! since bringing one up costs a minute.
//!
//! `helm install` of charts/kart runs two operator replicas in the cluster from its image, under
//! the chart's ServiceAccount and RBAC, with in-cluster configuration (the API server through the
//! `kubernetes` Service). The leader reconciles the fixture-model Retriever, RolloutPool and
//! TrainingJobs, whose Pods (the worker image) reach each other through Services and cluster DNS
//! names, on volumes of rancher's local-path-provisioner, every kart container as user 65532 on a
//! read-only root file system under the runtime's default seccomp profile; the real Deployment,
//! ReplicaSet and Job controllers, scheduler, volume binder and garbage collector do their part.
//!
//! A run succeeds with every step, each worker generating with the weights of the version it was
//! asked for, and `kubectl get tj` shows it; its workloads go after `ttlSecondsAfterFinished`; a
//! run on two nodes of two ranks each (the indexed Job's two Pods on the one node) trains as one;
//! a trainer killed midway (SIGKILL, as the kernel's OOM killer sends it) is restarted from its
//! checkpoint; the leading operator's Pod deleted mid-run is replaced without a child recreated or
//! a status lost; a suspended run stops its trainer with SIGTERM and resumes from its checkpoint;
//! deleting a TrainingJob stops its trainer and lets the garbage collector remove every child,
//! down to the checkpoint volume. The TIR sandbox fails in a container under `RuntimeDefault` as
//! the book's Deploying chapter says, and runs under the fix it gives with the sandbox's escape probes contained.
//! Taken down, the cluster leaves no process, network namespace, cgroup or mount behind.

use k8s_openapi::api::core::v1::Pod;
use kart_operator::crd::TrainingJob;
use kart_operator::crd::retriever::RetrieverPhase;
use kart_operator::crd::rollout_pool::RolloutPoolPhase;
use kart_operator::crd::training_job::{TrainingJobPhase, TrainingJobStatus};
use kart_operator::crd::{Retriever, RolloutPool};
use kart_tests::control_plane::{API_SECONDS, ControlPlane, Node};
use kart_tests::workloads::{retriever, rollout_pool, training_job};
use kart_tests::{
    Child, binary, eventually, fresh_dir, http, repo_root, sample, step_records, steps_logged, walk_files,
    write_capitals,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const NAMESPACE: &str = "ml";
/// The chart's namespace.
const SYSTEM: &str = "kart-system";
const STEPS: u64 = 4;
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

/// The control plane and its node, with the test namespace `ml`.
struct Cluster {
    cp: ControlPlane,
}

impl Cluster {
    /// `kubectl apply` of `object` (written to a file named for `name`) in the test namespace.
    fn apply(&self, name: &str, object: &Value) {
        let path = self.cp.dir.join(format!("{name}.json"));
        std::fs::write(&path, object.to_string()).unwrap();
        self.kubectl(&["apply", "-f", &path.display().to_string()]);
    }

    /// `kubectl VERB -n ml args…`; its output.
    fn kubectl(&self, verb_and_args: &[&str]) -> String {
        let (verb, rest) = verb_and_args.split_first().unwrap();
        let args = [&[*verb, "-n", NAMESPACE], rest].concat();
        self.cp.run_kubectl(&args).unwrap_or_else(|e| panic!("{e}\n{}", self.cp.describe()))
    }

    /// `kubectl get -n ml args… -o json`, as `T`.
    fn get<T: k8s_openapi::serde::de::DeserializeOwned>(&self, args: &[&str]) -> anyhow::Result<T> {
        let args = [&["-n", NAMESPACE], args].concat();
        Ok(serde_json::from_value(self.cp.get_json(&args)?)?)
    }

    /// The Pods of `namespace` that `selector` selects (all when empty), or `None` when kubectl
    /// fails (a poll asks again).
    fn pods(&self, namespace: &str, selector: &str) -> Option<Vec<Pod>> {
        let list = self.cp.get_json(&["pods", "-n", namespace, "-l", selector]).ok()?;
        serde_json::from_value(list["items"].clone()).ok()
    }

    /// The status of TrainingJob `name` once `done` holds for it.
    fn status(
        &self,
        name: &str,
        seconds: u64,
        done: impl Fn(&TrainingJobStatus) -> bool,
    ) -> TrainingJobStatus {
        eventually(
            seconds,
            &format!("TrainingJob {name}"),
            || self.cp.describe(),
            || {
                let tj: TrainingJob = self.get(&["tj", name]).ok()?;
                tj.status.filter(|s| done(s))
            },
        )
    }

    /// The trainer Pod of attempt `attempt` of TrainingJob `name`.
    fn trainer_pod(&self, name: &str, attempt: i32) -> Pod {
        let selector = format!("app.kubernetes.io/instance={name},kart.dev/attempt={attempt}");
        let what = format!("the trainer Pod of {name}, attempt {attempt}");
        eventually(API_SECONDS, &what, || self.cp.describe(), || self.pods(NAMESPACE, &selector)?.pop())
    }

    /// The folder of claim `name` once it is bound.
    fn claim(&self, name: &str) -> PathBuf {
        let what = format!("claim {name} bound");
        eventually(API_SECONDS, &what, || self.cp.describe(), || self.cp.claim_folder(NAMESPACE, name).ok())
    }

    /// The uid of each child of TrainingJob `name`, by kind and name, or `None` when kubectl fails
    /// (a poll asks again).
    fn children(&self, name: &str) -> Option<BTreeMap<String, String>> {
        let list: Value = self.get(&["jobs,services,configmaps,persistentvolumeclaims"]).ok()?;
        let owned = |o: &&Value| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "TrainingJob" && r["name"] == name))
        };
        let items = list["items"].as_array()?;
        let children = items
            .iter()
            .filter(owned)
            .map(|o| {
                let key =
                    format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap());
                (key, o["metadata"]["uid"].as_str().unwrap().to_string())
            })
            .collect();
        Some(children)
    }

    /// The operator replica holding the Lease, once one does.
    fn leader(&self) -> String {
        let holder = || {
            let lease = self.cp.get_json(&["lease", "kart-operator", "-n", SYSTEM]).ok()?;
            lease["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_owned)
        };
        eventually(API_SECONDS, "an operator leading", || self.cp.describe(), holder)
    }

    /// `kubectl logs` of Pod `name` in `namespace`.
    fn logs(&self, namespace: &str, name: &str) -> String {
        self.cp.run_kubectl(&["logs", "-n", namespace, name]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The `step` the trainer of `pod` reports on its `/status` (from the host, straight to the
    /// Pod's address), once it is past `after`.
    fn trainer_step_after(&self, pod: &str, after: u64) -> u64 {
        let direct = http();
        eventually(
            API_SECONDS,
            &format!("a step of {pod} past {after}"),
            || self.cp.describe(),
            || {
                let pod: Pod = self.get(&["pod", pod]).ok()?;
                let ip = pod.status?.pod_ip?;
                let status: Value =
                    direct.get(format!("http://{ip}:8002/status")).send().ok()?.json().ok()?;
                status["step"].as_u64().filter(|s| *s > after)
            },
        )
    }
}

/// The end of a Pod's container as the cluster shows it, recorded from before the Pod is asked
/// to stop (once it is gone, so are its log and status): its output to the end (`kubectl logs
/// -f`) and each state of the Pod (`kubectl get -w`).
struct Ending {
    pod: String,
    output: (Child, PathBuf),
    states: (Child, PathBuf),
}

impl Ending {
    /// Starts recording the end of Pod `pod` of the test namespace.
    fn record(cluster: &Cluster, pod: &str) -> Ending {
        let record = |what: &str, args: &[&str]| {
            let path = cluster.cp.dir.join(format!("{pod}.{what}"));
            let child = cluster
                .cp
                .kubectl()
                .args(args)
                .args(["-n", NAMESPACE])
                .stdout(std::fs::File::create(&path).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (Child(child), path)
        };
        let output = record("output", &["logs", "-f", pod]);
        let states = record("states", &["get", "pod", pod, "-w", "-o", "json"]);
        Ending { pod: pod.to_string(), output, states }
    }

    /// Waits for the container's end; its exit code and its whole output.
    fn wait(mut self, cluster: &Cluster) -> (i64, String) {
        let exit_code = eventually(
            API_SECONDS,
            &format!("{} terminated", self.pod),
            || cluster.cp.describe(),
            || {
                let text = std::fs::read_to_string(&self.states.1).ok()?;
                // The last object may still be half written.
                let states =
                    serde_json::Deserializer::from_str(&text).into_iter::<Value>().map_while(Result::ok);
                states
                    .filter_map(|pod| {
                        pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"].as_i64()
                    })
                    .last()
            },
        );
        let output = &mut self.output.0.0;
        eventually(API_SECONDS, &format!("the output of {} ended", self.pod), String::new, || {
            output.try_wait().ok().flatten()
        });
        (exit_code, std::fs::read_to_string(&self.output.1).unwrap())
    }
}

/// The ending recorded by `ending`: SIGTERM, which the trainer heeds (an exit by SIGKILL after the
/// grace period would be 137).
fn assert_stopped_by_sigterm(cluster: &Cluster, ending: Ending) {
    let (code, output) = ending.wait(cluster);
    assert_eq!(code, 143, "stopped by SIGTERM, not by an error or SIGKILL: {output}");
    assert!(output.contains("stopped by a termination signal"), "{output}");
}

/// The newest checkpoint step in `output`.
fn newest_checkpoint(output: &Path) -> u64 {
    let checkpoints = std::fs::read_dir(output.join("checkpoints")).unwrap();
    checkpoints
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("step-")?.parse::<u64>().ok())
        .max()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[test]
fn the_chart_and_training_jobs_run_restart_suspend_and_go_in_containers_on_a_real_node() {
    let dir = fresh_dir("kart-real-node");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_capitals(&data);
    build_images();
    let cp = ControlPlane::up(&dir.join("control-plane"), Node::Kubelet).unwrap();
    let cluster = Cluster { cp };
    let cp = &cluster.cp;
    let node = cp.get_json(&["node", "kart-node"]).unwrap();
    assert_eq!(node["status"]["capacity"]["nvidia.com/gpu"], "4", "the GPUs the Node reports");

    // 1. The chart, with two operator replicas: both run from the operator image, one leads.
    let chart = repo_root().join("charts/kart").display().to_string();
    let args = ["install", "kart", &chart, "--namespace", SYSTEM, "--create-namespace"];
    let installed = cp.helm(&[&args[..], &["--set", "replicaCount=2"]].concat()).unwrap();
    assert!(installed.contains("kart: deployed (revision 1)"), "{installed}");
    let operators = eventually(
        API_SECONDS,
        "both operator Pods running and one ready (the leader)",
        || cp.describe(),
        || {
            let pods = cluster.pods(SYSTEM, "")?;
            let running = pods.iter().filter(|p| phase(p) == "Running").count();
            let ready = pods.iter().filter(|p| ready(p)).count();
            (running == 2 && ready >= 1).then_some(pods)
        },
    );
    let leader = cluster.leader();
    assert!(operators.iter().any(|p| p.metadata.name.as_deref() == Some(&leader)), "{leader} leads");

    // 2. The fixture-model run, reconciled by the operator in the cluster, to the end, as
    // `kubectl get tj` shows it; its workloads go, its checkpoints stay.
    cp.run_kubectl(&["create", "namespace", NAMESPACE]).unwrap();
    cluster.apply("wiki", &retriever(&data));
    cluster.apply("pool", &rollout_pool(&data));
    let mut search = training_job("search", &data, STEPS);
    search["spec"]["ttlSecondsAfterFinished"] = json!(0);
    cluster.apply("search", &search);
    let output = cluster.claim("search-checkpoints");
    let status = cluster.status("search", RUN_SECONDS, |s| s.phase.is_finished());
    assert_eq!(status.phase, TrainingJobPhase::Succeeded, "{status:?}\n{}", cp.describe());
    assert_eq!(
        (status.step, status.policy_version, status.attempts),
        (STEPS, Some(STEPS), 1),
        "{status:?}\n{}\n{}",
        cluster.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]),
        cp.describe()
    );
    let listing = cluster.kubectl(&["get", "tj", "search"]);
    let (header, row) = listing.split_once('\n').unwrap();
    // Columns by where kubectl aligns them: an empty one (QUEUE without a queue) is blank.
    let starts: Vec<usize> = header
        .match_indices(|c: char| !c.is_whitespace())
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || header.as_bytes()[i - 1] == b' ')
        .collect();
    let column = |name: &str| {
        let at =
            starts.iter().position(|&i| header[i..].starts_with(name)).unwrap_or_else(|| panic!("{listing}"));
        let end = starts.get(at + 1).copied().unwrap_or(row.len()).min(row.len());
        row.get(starts[at]..end).unwrap_or_default().trim()
    };
    assert_eq!((column("PHASE"), column("STEP")), ("Succeeded", STEPS.to_string().as_str()), "{listing}");
    let wiki: Retriever = cluster.get(&["retriever", "wiki"]).unwrap();
    let wiki = wiki.status.unwrap();
    assert_eq!((wiki.phase, wiki.index_built, wiki.ready_replicas), (RetrieverPhase::Ready, true, 1));
    let pool: RolloutPool = cluster.get(&["rp", "pool"]).unwrap();
    let pool = pool.status.unwrap();
    assert_eq!((pool.phase, pool.ready_replicas), (RolloutPoolPhase::Ready, 2));
    assert_eq!(
        steps_logged(&output),
        (0..=STEPS).collect::<Vec<_>>(),
        "an evaluation at step 0, then one record per step"
    );
    // The checkpoints are on a provisioned volume, written by the trainer's user.
    let written = walk_files(&output);
    assert!(written.iter().any(|p| p.ends_with("model/config.json")), "the final model: {written:?}");
    for file in &written {
        let uid = std::fs::metadata(file).unwrap().uid();
        assert_eq!(uid, KART_UID, "{} written as another user", file.display());
    }
    // Each publish reached one worker through the Service, and every trajectory still came from
    // the version its step asked for (a worker behind on it pulls first). kube-proxy balances
    // connections, not requests, so which workers served the trainer's few connections is chance.
    for record in &step_records(&output)[1..] {
        assert_eq!(record["staleness/max"], 0.0, "a worker generated with old weights: {record}");
    }
    let direct = http();
    let workers = cluster.pods(NAMESPACE, "app.kubernetes.io/instance=pool").unwrap();
    assert_eq!(workers.len(), 2, "{}", cp.describe());
    let (mut pushes, mut newest) = (0.0, 0.0_f64);
    for worker in &workers {
        // From the host, straight to the Pod's address (the host routes to the node's Pod network).
        let ip = worker.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
        let metrics = direct.get(format!("http://{ip}:8001/metrics")).send().unwrap().text().unwrap();
        let series = r#"kart_rollout_weight_loads_total{outcome="ok",trigger="push"}"#;
        pushes += sample(&metrics, series).unwrap_or(0.0);
        newest = newest.max(sample(&metrics, "kart_rollout_policy_version").unwrap_or(0.0));
    }
    assert_eq!(pushes, (STEPS + 1) as f64, "each of the versions 0..={STEPS} was pushed to one worker");
    assert_eq!(newest, STEPS as f64, "the last step's policy generated the final evaluation");
    // The retriever, reached from a worker's container by its Service's cluster DNS name.
    let name = workers[0].metadata.name.as_deref().unwrap();
    let resolved = cluster.kubectl(&["exec", name, "--", "getent", "hosts", "wiki-retriever"]);
    assert!(resolved.contains("wiki-retriever.ml.svc.cluster.local"), "cluster DNS: {resolved}");
    let fetch =
        "import urllib.request; print(urllib.request.urlopen('http://wiki-retriever:8000/readyz').status)";
    let answer = cluster.kubectl(&["exec", name, "--", "python3", "-c", fetch]);
    assert_eq!(answer.trim(), "200", "the retriever through its Service");
    let cleaned = cluster.status("search", API_SECONDS, |s| s.cleaned_up);
    assert_eq!(cleaned.phase, TrainingJobPhase::Succeeded);
    let left: Vec<String> = cluster.children("search").unwrap().into_keys().collect();
    assert_eq!(left, ["PersistentVolumeClaim/search-checkpoints"], "only the checkpoints stay");

    // 3. Two nodes of two CPU ranks each: one data-parallel run, node 1 meeting node 0 at its Pod's
    // DNS name (the Job's headless Service), to the end.
    let mut ranks = training_job("ranks", &data, 2);
    ranks["spec"]["nodes"] = json!(2);
    ranks["spec"]["gpusPerNode"] = json!(2);
    // Both Pods write the one checkpoint claim: ReadWriteMany, of the node's shared class.
    ranks["spec"]["checkpoint"]["accessModes"] = json!(["ReadWriteMany"]);
    ranks["spec"]["checkpoint"]["storageClassName"] = json!("kart-shared");
    cluster.apply("ranks", &ranks);
    let output = cluster.claim("ranks-checkpoints");
    let status = cluster.status("ranks", RUN_SECONDS, |s| s.phase.is_finished());
    assert_eq!(status.phase, TrainingJobPhase::Succeeded, "{status:?}\n{}", cp.describe());
    assert_eq!((status.step, status.world_size, status.attempts), (2, Some(4), 1), "{status:?}");
    let pods = cluster.pods(NAMESPACE, "app.kubernetes.io/instance=ranks").unwrap();
    assert_eq!(pods.len(), 2, "one Pod per node");
    for pod in &pods {
        let index = label(pod, "batch.kubernetes.io/job-completion-index").unwrap();
        let log = cluster.logs(NAMESPACE, pod.metadata.name.as_deref().unwrap());
        let node: usize = index.parse().unwrap();
        for rank in [2 * node, 2 * node + 1].into_iter().filter(|&r| r > 0) {
            let finished = format!("\"rank\":{rank}");
            assert!(
                log.lines().any(|l| l.contains("rank finished") && l.contains(&finished)),
                "node {node} ran rank {rank}: {log}"
            );
        }
    }
    assert_eq!(steps_logged(&output), [0, 1, 2], "rank 0 alone writes the metrics");

    // 4. A trainer killed after its first checkpoint (SIGKILL from the host, as the OOM killer
    // sends it): the next attempt resumes from it.
    cluster.apply("resume", &training_job("resume", &data, 1000));
    let output = cluster.claim("resume-checkpoints");
    let first = cluster.trainer_pod("resume", 0).metadata.name.unwrap();
    let checkpoint = output.join("checkpoints/step-00000002/trainer_state.json");
    let pid = eventually(
        RUN_SECONDS,
        "the first checkpoint of resume",
        || cp.describe(),
        || checkpoint.is_file().then(|| cp.container_pid(NAMESPACE, &first)).flatten(),
    );
    // SAFETY: SIGKILL to the trainer's process, the init process of its container.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    eventually(API_SECONDS, "the killed trainer gone", || cp.describe(), || (!alive(pid)).then_some(()));
    // The newest checkpoint it left (a fast step may have added one after the first).
    let newest = newest_checkpoint(&output);
    let second = cluster.trainer_pod("resume", 1);
    let args = second.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
    assert_eq!(args.last().map(String::as_str), Some("--resume"), "{args:?}");
    let second = second.metadata.name.unwrap();
    // The new attempt's own trainer reports a step past the checkpoint it loaded.
    let step = cluster.trainer_step_after(&second, newest);
    let log = cluster.logs(NAMESPACE, &second);
    let resumed = log.lines().find(|l| l.contains("resuming")).unwrap_or_else(|| panic!("{log}"));
    assert!(resumed.contains(&format!("\"step\":{newest}")), "{resumed}");
    assert!(resumed.contains(&format!("step-{newest:08}")), "{resumed}");
    // The metrics record of the step the trainer reported follows its /status by a moment.
    let steps = eventually(
        API_SECONDS,
        &format!("the metrics record of step {step}"),
        || cp.describe(),
        || {
            let steps = steps_logged(&output);
            (steps.len() as u64 > step).then_some(steps)
        },
    );
    assert_eq!(steps, (0..steps.len() as u64).collect::<Vec<_>>(), "no step twice, none missing");
    // The operator follows the resumed trainer through its Service (the killed one, checkpointing
    // every 2 steps, never got past step newest + 2).
    let status = cluster.status("resume", RUN_SECONDS, |s| s.attempts == 2 && s.step > newest + 2);
    assert_eq!((status.phase, status.failures), (TrainingJobPhase::Running, 1), "{status:?}");

    // 5. Every kart container (the operators', the index build's, the retriever's, the workers',
    // the trainers') runs as user 65532, not root, on a read-only root file system, under
    // RuntimeDefault.
    let mut all = cluster.pods(SYSTEM, "").unwrap();
    all.extend(cluster.pods(NAMESPACE, "").unwrap());
    assert!(all.len() >= 8, "{}", cp.describe());
    for pod in &all {
        assert_restricted(&cluster, pod);
    }

    // 6. The leading operator's Pod deleted mid-run (a drain, a rollout): the other replica takes
    // the Lease, follows the run on, and recreates no child and loses no status.
    let children = cluster.children("resume").unwrap();
    for child in ["Job/resume-trainer-1", "PersistentVolumeClaim/resume-checkpoints"] {
        assert!(children.contains_key(child), "{child}: {children:?}");
    }
    let mut operator_logs = vec![(leader.clone(), cluster.logs(SYSTEM, &leader))];
    cp.run_kubectl(&["delete", "pod", &leader, "-n", SYSTEM, "--wait=true"]).unwrap();
    let before = cluster.status("resume", API_SECONDS, |_| true);
    let successor = eventually(
        API_SECONDS,
        "another operator leading",
        || cp.describe(),
        || Some(cluster.leader()).filter(|l| *l != leader),
    );
    let status = cluster.status("resume", RUN_SECONDS, |s| s.step > before.step);
    assert_eq!(
        (status.phase, status.attempts, status.failures, status.job_name.as_deref()),
        (TrainingJobPhase::Running, 2, 1, Some("resume-trainer-1")),
        "{status:?}"
    );
    assert_eq!(cluster.children("resume").unwrap(), children, "{successor} recreated a child");

    // 7. Suspended, the run's trainer stops (SIGTERM); resumed, a new attempt goes on from the
    // checkpoint, and a suspension is no failure.
    let ending = Ending::record(&cluster, &second);
    cluster.kubectl(&["patch", "tj", "resume", "--type", "merge", "-p", r#"{"spec": {"suspend": true}}"#]);
    cluster.status("resume", API_SECONDS, |s| s.phase == TrainingJobPhase::Suspended);
    assert_stopped_by_sigterm(&cluster, ending);
    let newest = newest_checkpoint(&output);
    cluster.kubectl(&["patch", "tj", "resume", "--type", "merge", "-p", r#"{"spec": {"suspend": false}}"#]);
    let third = cluster.trainer_pod("resume", 2);
    let args = third.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
    assert_eq!(args.last().map(String::as_str), Some("--resume"), "{args:?}");
    let third = third.metadata.name.unwrap();
    cluster.trainer_step_after(&third, newest);
    let status = cluster.status("resume", API_SECONDS, |s| s.attempts == 3);
    assert_eq!((status.phase, status.failures), (TrainingJobPhase::Running, 1), "{status:?}");

    // 8. Deleting the TrainingJob stops its trainer, and only it; the garbage collector removes
    // every child, and the provisioner the released checkpoint volume.
    let retriever_pod =
        cluster.pods(NAMESPACE, "app.kubernetes.io/component=retriever").unwrap().pop().unwrap();
    let retriever_pod = retriever_pod.metadata.name.unwrap();
    let retriever_pid = cp.container_pid(NAMESPACE, &retriever_pod).unwrap();
    let ending = Ending::record(&cluster, &third);
    cluster.kubectl(&["delete", "tj", "resume", "--wait=true"]);
    assert_stopped_by_sigterm(&cluster, ending);
    eventually(
        API_SECONDS,
        "every child of resume collected",
        || cp.describe(),
        || cluster.children("resume")?.is_empty().then_some(()),
    );
    eventually(
        API_SECONDS,
        "the checkpoint volume reclaimed",
        || cp.describe(),
        || (!output.exists()).then_some(()),
    );
    assert_eq!(
        cp.container_pid(NAMESPACE, &retriever_pod),
        Some(retriever_pid),
        "the retriever belongs to no TrainingJob"
    );

    // 9. The TIR sandbox in a worker container: under RuntimeDefault (which refuses the user
    // namespace bubblewrap needs) the worker fails at start saying so, as the book's Deploying chapter promises;
    // under the fix it gives (seccomp Unconfined, the rest of the restricted profile kept) it runs,
    // and the escape probes of kart-tools' sandbox tests, run in its container, are contained.
    cluster.apply("tir", &tir_pool(None));
    let refused = eventually(
        RUN_SECONDS,
        "the TIR worker refused a sandbox under RuntimeDefault",
        || cp.describe(),
        || {
            let pod = tir_pods(&cluster)?.into_iter().next()?;
            let name = pod.metadata.name.as_deref()?;
            let log = cp.run_kubectl(&["logs", "-n", NAMESPACE, name]).ok()?;
            log.contains("could not run").then_some(log)
        },
    );
    assert!(refused.contains("CLONE_NEWUSER") && refused.contains("isolation: none"), "{refused}");
    let unconfined = json!({
        "runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "Unconfined"},
    });
    cluster.apply("tir", &tir_pool(Some(unconfined)));
    let worker = eventually(
        RUN_SECONDS,
        "the TIR worker ready under seccomp Unconfined",
        || cp.describe(),
        || {
            let pods = tir_pods(&cluster)?;
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

    // 10. The operators worked under the chart's RBAC: no request of any replica was refused.
    for pod in cluster.pods(SYSTEM, "").unwrap() {
        let name = pod.metadata.name.unwrap();
        operator_logs.push((name.clone(), cluster.logs(SYSTEM, &name)));
    }
    for (name, log) in &operator_logs {
        assert!(!log.contains("forbidden"), "{name}: a request the chart's RBAC refused:\n{log}");
    }
    cp.helm(&["uninstall", "kart", "--namespace", SYSTEM]).unwrap();
    cp.run_kubectl(&["get", "crd", "trainingjobs.kart.dev"]).expect("the CRDs are kept on uninstall");

    // 11. Taken down, the cluster leaves nothing behind: no process, network namespace, cgroup
    // or mount.
    let state = cp.dir.clone();
    let n = std::fs::read_to_string(state.join("node/n")).unwrap().trim().to_string();
    let pids: Vec<u32> = std::fs::read_to_string(state.join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(pids.len() >= 8, "{pids:?}");
    drop(cluster);
    let running: Vec<u32> = pids.into_iter().filter(|&pid| alive(pid)).collect();
    assert!(running.is_empty(), "left running: {running:?}");
    let netns = format!("kart-n{n}");
    assert!(!Path::new("/run/netns").join(&netns).exists(), "network namespace {netns} left behind");
    let cgroups: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|controller| controller.path().join(&netns))
        .filter(|cgroup| cgroup.exists())
        .collect();
    assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = state.display().to_string();
    let left: Vec<&str> = mounts.lines().filter(|m| m.contains(&prefix)).collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Asserts that every container of `pod` runs as user 65532 (asked of the running ones), not
/// root, on a read-only root file system, under RuntimeDefault.
fn assert_restricted(cluster: &Cluster, pod: &Pod) {
    let cp = &cluster.cp;
    let name = pod.metadata.name.as_deref().unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let pod_context = spec.security_context.clone().unwrap_or_default();
    for container in &spec.containers {
        let context = container.security_context.clone().unwrap_or_default();
        // The user is the image's (`USER 65532`) unless the spec names one; running Pods are asked
        // below.
        let uid = context.run_as_user.or(pod_context.run_as_user).unwrap_or(KART_UID as i64);
        let non_root = context.run_as_non_root.or(pod_context.run_as_non_root);
        assert_eq!((uid, non_root), (KART_UID as i64, Some(true)), "{name}/{}", container.name);
        assert_eq!(context.read_only_root_filesystem, Some(true), "{name}/{}", container.name);
        let seccomp = context.seccomp_profile.or(pod_context.seccomp_profile.clone()).map(|s| s.type_);
        assert_eq!(seccomp.as_deref(), Some("RuntimeDefault"), "{name}/{}", container.name);
    }
    if phase(pod) == "Running" {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let id = cp.run_kubectl(&["exec", "-n", &namespace, name, "--", "id", "-u"]).unwrap();
        assert_eq!(id.trim(), KART_UID.to_string(), "{name} runs as");
        let write = cp.kubectl().args(["exec", "-n", &namespace, name, "--", "touch", "/x"]).output();
        let stderr = String::from_utf8_lossy(&write.unwrap().stderr).into_owned();
        assert!(
            stderr.contains("Read-only file system"),
            "{name}: the root file system is writable: {stderr}"
        );
    }
}

/// A RolloutPool `tir` of one worker with a Python tool on the fixture model, its container's
/// security context `context` (the operator's default when `None`), kart-tools' unit-test binary
/// (the sandbox's escape probes) at /probe and a scratch folder at /scratch.
fn tir_pool(context: Option<Value>) -> Value {
    let models = kart_tests::shared_dir().join("fixtures/models").canonicalize().unwrap();
    let mut pod = json!({
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
    json!({
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
fn tir_pods(cluster: &Cluster) -> Option<Vec<Pod>> {
    cluster.pods(NAMESPACE, "app.kubernetes.io/instance=tir")
}

/// kart-tools' unit-test binary of this build (the newest, should several be there).
fn kart_tools_tests() -> PathBuf {
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
