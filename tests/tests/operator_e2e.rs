//! The operator end to end on a real control plane (`scripts/control-plane.sh`): the real
//! `kart-operator` reconciles a Retriever, a RolloutPool and TrainingJobs applied with `kubectl`;
//! the real Deployment, ReplicaSet and Job controllers, scheduler, PersistentVolume binder and
//! garbage collector do their part, and kart's node agent runs the Pods as real `kart` processes
//! (the index build, the retriever, two rollout workers on the fixture model behind their Service,
//! the trainers) on volumes of its provisioner.
//!
//! A run succeeds with every step, each worker generating with the weights of the version it was
//! asked for, and `kubectl get tj` shows it; its workloads go after `ttlSecondsAfterFinished`; a
//! run on two nodes of two ranks each trains as one; a trainer killed midway is restarted from its
//! checkpoint; an operator killed mid-run is replaced without a child recreated or a status lost;
//! a suspended run stops its trainer and resumes from its checkpoint; deleting a TrainingJob stops
//! its trainer and lets the garbage collector remove every child, down to the checkpoint volume.

use k8s_openapi::api::core::v1::Pod;
use kart_operator::crd::TrainingJob;
use kart_operator::crd::retriever::RetrieverPhase;
use kart_operator::crd::rollout_pool::RolloutPoolPhase;
use kart_operator::crd::training_job::{TrainingJobPhase, TrainingJobStatus};
use kart_operator::crd::{Retriever, RolloutPool};
use kart_tests::control_plane::{API_SECONDS, ControlPlane};
use kart_tests::operator::Operator;
use kart_tests::workloads::{retriever, rollout_pool, training_job};
use kart_tests::{eventually, fresh_dir, http, sample, step_records, steps_logged, write_capitals};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const NAMESPACE: &str = "ml";
const STEPS: u64 = 4;
/// How long a wait that spans training steps (and the trainer's start) may take on a loaded
/// machine.
const RUN_SECONDS: u64 = 1200;

/// The control plane, its namespace `ml` with kart's CRDs, and the operator watching it.
struct Cluster {
    cp: ControlPlane,
    dir: PathBuf,
    operator: Option<Operator>,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let cp = ControlPlane::up(&dir.join("control-plane")).unwrap();
        cp.install_crds().unwrap();
        cp.run_kubectl(&["create", "namespace", NAMESPACE]).unwrap();
        let mut cluster = Cluster { cp, dir: dir.to_path_buf(), operator: None };
        cluster.start_operator("kart-operator-0");
        cluster
    }

    /// Starts the operator as Pod `pod` (reaching the trainers' Services through the pod network's
    /// proxy); returns once it is ready (the leader).
    fn start_operator(&mut self, pod: &str) {
        let args = [
            "--namespace",
            NAMESPACE,
            "--lease-namespace",
            NAMESPACE,
            // Long enough that a loaded machine's slow renewals never lose the Lease; a
            // replacement waits it out once.
            "--lease-duration-seconds",
            "15",
            "--status-poll-seconds",
            "1",
        ];
        let proxy = self.cp.proxy_url().unwrap();
        let log = self.dir.join(format!("{pod}.log"));
        let operator = Operator::start(&self.cp.kubeconfig, pod, &log, &args, Some(&proxy)).unwrap();
        let (http, ready) = (http(), format!("{}/readyz", operator.url));
        eventually(
            API_SECONDS,
            "the operator ready",
            || operator.log_text(),
            || http.get(&ready).send().ok().filter(|r| r.status().is_success()).map(drop),
        );
        self.operator = Some(operator);
    }

    /// `kubectl apply` of `object` (written to a file named for `name`) in the namespace.
    fn apply(&self, name: &str, object: &Value) {
        let path = self.dir.join(format!("{name}.json"));
        std::fs::write(&path, object.to_string()).unwrap();
        self.kubectl(&["apply", "-f", &path.display().to_string()]);
    }

    /// `kubectl args… -n ml`; its output.
    fn kubectl(&self, args: &[&str]) -> String {
        let args = [args, &["-n", NAMESPACE]].concat();
        self.cp.run_kubectl(&args).unwrap_or_else(|e| panic!("{e}\n{}", self.describe()))
    }

    /// `kubectl get args… -n ml -o json`, as `T`.
    fn get<T: k8s_openapi::serde::de::DeserializeOwned>(&self, args: &[&str]) -> anyhow::Result<T> {
        let args = [args, &["-n", NAMESPACE]].concat();
        Ok(serde_json::from_value(self.cp.get_json(&args)?)?)
    }

    /// The Pods that `selector` selects, or `None` when kubectl fails (a poll asks again).
    fn pods(&self, selector: &str) -> Option<Vec<Pod>> {
        let list: Value = self.get(&["pods", "-l", selector]).ok()?;
        Some(serde_json::from_value(list["items"].clone()).unwrap())
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
            || self.describe(),
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
        eventually(API_SECONDS, &what, || self.describe(), || self.pods(&selector)?.pop())
    }

    /// The folder of claim `name` once it is bound.
    fn claim(&self, name: &str) -> PathBuf {
        let what = format!("claim {name} bound");
        eventually(API_SECONDS, &what, || self.describe(), || self.cp.claim_folder(NAMESPACE, name).ok())
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
        let items = list["items"].as_array().unwrap();
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

    /// The cluster's Pods with their output, and the end of the operator's log.
    fn describe(&self) -> String {
        let log = self.operator.as_ref().map(Operator::log_text).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n  ");
        format!("{}operator log:\n  {tail}", self.cp.describe())
    }
}

/// The address of `pod`, once it has one.
fn pod_ip(cluster: &Cluster, pod: &str) -> Option<String> {
    let pod: Pod = cluster.get(&["pod", pod]).ok()?;
    pod.status?.pod_ip
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// The newest checkpoint step in `output`.
fn newest_checkpoint(output: &Path) -> u64 {
    let checkpoints = std::fs::read_dir(output.join("checkpoints")).unwrap();
    checkpoints
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("step-")?.parse::<u64>().ok())
        .max()
        .unwrap()
}

/// The `step` the trainer of `pod` reports on its `/status`, once it is past `after`.
fn trainer_step_after(cluster: &Cluster, pod: &str, after: u64) -> u64 {
    let direct = http();
    eventually(
        API_SECONDS,
        &format!("a step of {pod} past {after}"),
        || cluster.describe(),
        || {
            let ip = pod_ip(cluster, pod)?;
            let status: Value = direct.get(format!("http://{ip}:8002/status")).send().ok()?.json().ok()?;
            status["step"].as_u64().filter(|s| *s > after)
        },
    )
}

/// The ending of `pod`'s process, deleted with its Job: SIGTERM, which the trainer heeds.
fn assert_stopped_by_sigterm(cluster: &Cluster, pod: &str) {
    let files = cluster.cp.pod(NAMESPACE, pod);
    let exit = eventually(API_SECONDS, &format!("{pod} stopped"), || cluster.describe(), || files.exit());
    let log = files.log();
    assert!(!exit.killed_after_grace, "the trainer ignored SIGTERM until its grace period ended: {exit:?}");
    assert_eq!(exit.code, 143, "stopped by SIGTERM, not by an error: {log}");
    assert!(log.contains("stopped by a termination signal"), "{log}");
}

#[test]
fn training_jobs_run_restart_suspend_and_go_through_the_operator_on_a_real_control_plane() {
    let dir = fresh_dir("kart-operator-e2e");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_capitals(&data);
    let mut cluster = Cluster::start(&dir);

    cluster.apply("wiki", &retriever(&data));
    cluster.apply("pool", &rollout_pool(&data));
    let mut search = training_job("search", &data, STEPS);
    search["spec"]["ttlSecondsAfterFinished"] = json!(0);
    cluster.apply("search", &search);

    // 1. A run to the end, as `kubectl get tj` shows it; its workloads go, its checkpoints stay.
    let output = cluster.claim("search-checkpoints");
    let status = cluster.status("search", RUN_SECONDS, |s| s.phase.is_finished());
    assert_eq!(status.phase, TrainingJobPhase::Succeeded, "{status:?}\n{}", cluster.describe());
    assert_eq!((status.step, status.policy_version, status.attempts), (STEPS, Some(STEPS), 1), "{status:?}");
    let listing = cluster.kubectl(&["get", "tj", "search"]);
    let (header, row) = listing.split_once('\n').unwrap();
    let columns: Vec<&str> = header.split_whitespace().collect();
    let values: Vec<&str> = row.split_whitespace().collect();
    let column =
        |name: &str| values[columns.iter().position(|c| *c == name).unwrap_or_else(|| panic!("{listing}"))];
    assert_eq!((column("PHASE"), column("STEP")), ("Succeeded", "4"), "{listing}");
    let retriever: Retriever = cluster.get(&["retriever", "wiki"]).unwrap();
    let retriever = retriever.status.unwrap();
    assert_eq!(
        (retriever.phase, retriever.index_built, retriever.ready_replicas),
        (RetrieverPhase::Ready, true, 1)
    );
    let pool: RolloutPool = cluster.get(&["rp", "pool"]).unwrap();
    let pool = pool.status.unwrap();
    assert_eq!((pool.phase, pool.ready_replicas), (RolloutPoolPhase::Ready, 2));
    assert_eq!(steps_logged(&output), [0, 1, 2, 3, 4], "an evaluation at step 0, then one record per step");
    assert!(output.join("model/config.json").is_file(), "the final model is on the checkpoint claim");
    // Each publish reached one worker through the Service; every trajectory still came from the
    // version its step asked for (the other worker pulled it), and both workers end on the last
    // version: the final evaluation's requests were balanced over them.
    for record in &step_records(&output)[1..] {
        assert_eq!(record["staleness/max"], 0.0, "a worker generated with old weights: {record}");
    }
    let direct = http();
    let workers = cluster.pods("app.kubernetes.io/instance=pool").unwrap();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let mut loads = [0.0; 2];
    for worker in &workers {
        let ip = worker.status.as_ref().unwrap().pod_ip.clone().unwrap();
        let metrics = direct.get(format!("http://{ip}:8001/metrics")).send().unwrap().text().unwrap();
        let name = worker.metadata.name.as_deref().unwrap();
        assert_eq!(sample(&metrics, "kart_rollout_policy_version"), Some(STEPS as f64), "{name}: {metrics}");
        for (i, trigger) in ["push", "pull"].into_iter().enumerate() {
            let series = format!("kart_rollout_weight_loads_total{{outcome=\"ok\",trigger=\"{trigger}\"}}");
            loads[i] += sample(&metrics, &series).unwrap_or(0.0);
        }
    }
    assert_eq!(loads[0], (STEPS + 1) as f64, "each of the versions 0..={STEPS} was pushed to one worker");
    assert!(loads[1] >= 1.0, "the worker the last push missed pulled it");
    let cleaned = cluster.status("search", API_SECONDS, |s| s.cleaned_up);
    assert_eq!(cleaned.phase, TrainingJobPhase::Succeeded);
    let left: Vec<String> = cluster.children("search").unwrap().into_keys().collect();
    assert_eq!(left, ["PersistentVolumeClaim/search-checkpoints"], "only the checkpoints stay");

    // 2. Two nodes of two CPU ranks each: one data-parallel run, node 1 meeting node 0 at its pod
    // DNS name, to the end.
    let mut ranks = training_job("ranks", &data, 2);
    ranks["spec"]["nodes"] = json!(2);
    ranks["spec"]["gpusPerNode"] = json!(2);
    ranks["spec"]["checkpoint"]["accessModes"] = json!(["ReadWriteMany"]);
    cluster.apply("ranks", &ranks);
    let output = cluster.claim("ranks-checkpoints");
    let status = cluster.status("ranks", RUN_SECONDS, |s| s.phase.is_finished());
    assert_eq!(status.phase, TrainingJobPhase::Succeeded, "{status:?}\n{}", cluster.describe());
    assert_eq!((status.step, status.world_size, status.attempts), (2, Some(4), 1), "{status:?}");
    let pods = cluster.pods("app.kubernetes.io/instance=ranks").unwrap();
    assert_eq!(pods.len(), 2, "one pod per node");
    for pod in &pods {
        let index = &pod.metadata.labels.as_ref().unwrap()["batch.kubernetes.io/job-completion-index"];
        let log = cluster.cp.pod(NAMESPACE, pod.metadata.name.as_deref().unwrap()).log();
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

    // 3. A trainer killed after its first checkpoint: the next attempt resumes from it.
    cluster.apply("resume", &training_job("resume", &data, 1000));
    let output = cluster.claim("resume-checkpoints");
    let first = cluster.trainer_pod("resume", 0).metadata.name.unwrap();
    let checkpoint = output.join("checkpoints/step-00000002/trainer_state.json");
    let pid = eventually(
        RUN_SECONDS,
        "the first checkpoint of resume",
        || cluster.describe(),
        || checkpoint.is_file().then(|| cluster.cp.pod(NAMESPACE, &first).pid()).flatten(),
    );
    // SAFETY: SIGKILL to the trainer process the node agent started, as an out-of-memory kill would.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    eventually(API_SECONDS, "the killed trainer gone", || cluster.describe(), || (!alive(pid)).then_some(()));
    // The newest checkpoint it left (a fast step may have added one after the first).
    let newest = newest_checkpoint(&output);
    let second = cluster.trainer_pod("resume", 1);
    let args = second.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
    assert_eq!(args.last().map(String::as_str), Some("--resume"), "{args:?}");
    let second = second.metadata.name.unwrap();
    // The new attempt's own trainer reports a step past the checkpoint it loaded.
    let step = trainer_step_after(&cluster, &second, newest);
    let log = cluster.cp.pod(NAMESPACE, &second).log();
    let resumed = log.lines().find(|l| l.contains("resuming")).unwrap_or_else(|| panic!("{log}"));
    assert!(resumed.contains(&format!("\"step\":{newest}")), "{resumed}");
    assert!(resumed.contains(&format!("step-{newest:08}")), "{resumed}");
    // The metrics record of the step the trainer reported follows its /status by a moment.
    let steps = eventually(
        API_SECONDS,
        &format!("the metrics record of step {step}"),
        || cluster.describe(),
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

    // 4. The operator killed mid-run and replaced by another Pod: it takes the Lease once it
    // expires, follows the run on, and recreates no child and loses no status.
    let children = cluster.children("resume").unwrap();
    for child in ["Job/resume-trainer-1", "PersistentVolumeClaim/resume-checkpoints"] {
        assert!(children.contains_key(child), "{child}: {children:?}");
    }
    drop(cluster.operator.take());
    let before = cluster.status("resume", API_SECONDS, |_| true);
    cluster.start_operator("kart-operator-1");
    let status = cluster.status("resume", RUN_SECONDS, |s| s.step > before.step);
    assert_eq!(
        (status.phase, status.attempts, status.failures, status.job_name.as_deref()),
        (TrainingJobPhase::Running, 2, 1, Some("resume-trainer-1")),
        "{status:?}"
    );
    assert_eq!(cluster.children("resume").unwrap(), children, "a child was recreated");

    // 5. Suspended, the run's trainer stops (SIGTERM); resumed, a new attempt goes on from the
    // checkpoint, and a suspension is no failure.
    cluster.kubectl(&["patch", "tj", "resume", "--type", "merge", "-p", r#"{"spec": {"suspend": true}}"#]);
    cluster.status("resume", API_SECONDS, |s| s.phase == TrainingJobPhase::Suspended);
    assert_stopped_by_sigterm(&cluster, &second);
    let newest = newest_checkpoint(&output);
    cluster.kubectl(&["patch", "tj", "resume", "--type", "merge", "-p", r#"{"spec": {"suspend": false}}"#]);
    let third = cluster.trainer_pod("resume", 2);
    let args = third.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
    assert_eq!(args.last().map(String::as_str), Some("--resume"), "{args:?}");
    let third = third.metadata.name.unwrap();
    trainer_step_after(&cluster, &third, newest);
    let status = cluster.status("resume", API_SECONDS, |s| s.attempts == 3);
    assert_eq!((status.phase, status.failures), (TrainingJobPhase::Running, 1), "{status:?}");

    // 6. Deleting the TrainingJob stops its trainer, and only it; the garbage collector removes
    // every child, and the provisioner the released checkpoint volume.
    let retriever_pod = cluster.pods("app.kubernetes.io/component=retriever").unwrap().pop().unwrap();
    let retriever_pid =
        cluster.cp.pod(NAMESPACE, retriever_pod.metadata.name.as_deref().unwrap()).pid().unwrap();
    cluster.kubectl(&["delete", "tj", "resume", "--wait=true"]);
    assert_stopped_by_sigterm(&cluster, &third);
    assert!(alive(retriever_pid), "the retriever belongs to no TrainingJob");
    eventually(
        API_SECONDS,
        "every child of resume collected",
        || cluster.describe(),
        || cluster.children("resume")?.is_empty().then_some(()),
    );
    eventually(
        API_SECONDS,
        "the checkpoint volume reclaimed",
        || cluster.describe(),
        || (!output.exists()).then_some(()),
    );
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
