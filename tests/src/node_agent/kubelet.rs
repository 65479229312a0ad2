//! The node agent's kubelet: runs the container of each Pod bound to its Node as a local process
//! and reports the Pod's state through the API, as a node's kubelet would.
//!
//! - Image: `ghcr.io/kart-dev/kart:<tag>` is the `kart` binary of this workspace with the image's
//!   environment (its folder first on `PATH`, `KART_LOG=info`, the loader path libtorch needs);
//!   other images fail to pull.
//! - Process: the container's command (else the image's entrypoint `kart`) and args, in a fresh
//!   environment: the image's, `HOSTNAME`, the container's variables (literal values and
//!   `fieldRef`s; a Pod's DNS name becomes its address, and the Pod waits in `ContainerCreating`
//!   until that Pod has one, as a process retries a lookup), then the pod network's
//!   `KART_BIND_ADDRESS`, `HTTP_PROXY` and `NO_PROXY` (see [`super::network`]); paths mapped and the working directory set by [`RootFs`]; output
//!   appended to the Pod's `log`.
//! - Status: `Pending` with the reason while volumes cannot mount; `Running` with the Pod's
//!   address; `Ready` from the readiness probe (HTTP GET on the Pod's address, at the probe's
//!   period and failure threshold); restarts with back-off under `restartPolicy: Always` (and after
//!   failed liveness probes); `Succeeded` or `Failed` with the exit code (128 + signal when killed)
//!   and the termination message otherwise.
//! - Deletion: SIGTERM, then SIGKILL after the Pod's grace period; once the process has ended,
//!   the Pod is removed (a delete with no grace period, as a kubelet confirms one).
//! - Files: each Pod's folder (see [`PodFiles`]) keeps its output, its process id and how a deleted
//!   Pod's process ended, where tests read them as `kubectl logs` and a container runtime show them.
//!
//! Not simulated: several containers, init containers, resources, security contexts, exec and TCP
//! probes, `envFrom` and variables from Secrets or ConfigMaps.

use super::network::{self, Addresses};
use super::rootfs::RootFs;
use k8s_openapi::api::core::v1::{Container, Pod, Probe, Secret, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The image the kubelet can run.
pub const KART_IMAGE: &str = "ghcr.io/kart-dev/kart";
/// Its entrypoint.
const ENTRYPOINT: &str = "kart";
/// The longest termination message the kubelet reads, as Kubernetes caps it.
const MAX_MESSAGE: usize = 4096;

/// How the process of a deleted Pod ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    /// The exit code, 128 + the signal for a process a signal ended.
    pub code: i32,
    /// Whether SIGKILL ended it after the grace period because SIGTERM did not.
    pub killed_after_grace: bool,
}

/// The files the kubelet keeps of a Pod, in `<node folder>/pods/<namespace>/<name>/`.
#[derive(Debug, Clone)]
pub struct PodFiles(PathBuf);

impl PodFiles {
    /// The files of Pod `namespace/name` of the node whose folder is `node_dir`.
    pub fn new(node_dir: &std::path::Path, namespace: &str, name: &str) -> PodFiles {
        PodFiles(node_dir.join("pods").join(namespace).join(name))
    }

    /// The Pod's folder.
    pub fn dir(&self) -> &std::path::Path {
        &self.0
    }

    /// The output of the container (all its runs), as `kubectl logs` shows it.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.0.join("log")).unwrap_or_default()
    }

    /// The process id of the container's running process.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.0.join("pid")).ok()?.trim().parse().ok()
    }

    /// How the process of the deleted Pod ended, once it has.
    pub fn exit(&self) -> Option<Exit> {
        let text = std::fs::read_to_string(self.0.join("exit.json")).ok()?;
        let exit: Value = serde_json::from_str(&text).ok()?;
        Some(Exit {
            code: i32::try_from(exit["code"].as_i64()?).ok()?,
            killed_after_grace: exit["killed_after_grace"].as_bool()?,
        })
    }

    fn set_pid(&self, pid: Option<u32>) {
        let _ = match pid {
            Some(pid) => std::fs::write(self.0.join("pid"), pid.to_string()),
            None => std::fs::remove_file(self.0.join("pid")),
        };
    }

    fn set_exit(&self, exit: &Exit) -> std::io::Result<()> {
        let record = json!({"code": exit.code, "killed_after_grace": exit.killed_after_grace});
        std::fs::write(self.0.join("exit.json"), record.to_string())
    }
}

/// The exit code a process's status stands for (128 + the signal that ended it).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Why a Pod's container cannot start yet: the waiting reason and message.
type Waiting = (&'static str, String);

/// A periodic HTTP probe of a container.
#[derive(Debug, Clone)]
struct Prober {
    url: String,
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    failure_threshold: u32,
    next: Instant,
    failures: u32,
}

impl Prober {
    fn new(probe: Option<&Probe>, container: &Container, ip: Ipv4Addr) -> Result<Option<Prober>, String> {
        let Some(probe) = probe else { return Ok(None) };
        let get = probe.http_get.as_ref().ok_or("only httpGet probes are simulated")?;
        if get.scheme.as_deref().is_some_and(|s| s != "HTTP") {
            return Err("only HTTP probes are simulated".into());
        }
        let port = match &get.port {
            IntOrString::Int(port) => *port,
            IntOrString::String(name) => {
                container
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name))
                    .ok_or_else(|| format!("probe port {name}: no container port of that name"))?
                    .container_port
            }
        };
        let seconds = |s: Option<i32>, default: i32| Duration::from_secs(s.unwrap_or(default).max(0) as u64);
        Ok(Some(Prober {
            url: format!("http://{ip}:{port}{}", get.path.as_deref().unwrap_or("/")),
            initial_delay: seconds(probe.initial_delay_seconds, 0),
            period: seconds(probe.period_seconds, 10),
            timeout: seconds(probe.timeout_seconds, 1),
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
            next: Instant::now(),
            failures: 0,
        }))
    }

    /// Whether a probe is due; if so, the next one is scheduled.
    fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.period;
        true
    }

    /// Records an outcome; returns whether the failures reached the threshold.
    fn record(&mut self, ok: bool) -> bool {
        self.failures = if ok { 0 } else { self.failures + 1 };
        self.failures >= self.failure_threshold
    }
}

/// A Pod the kubelet runs.
struct Slot {
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    container: Container,
    restart_policy: String,
    grace: Duration,
    rootfs: RootFs,
    files: PodFiles,
    program: Vec<String>,
    env: Vec<(String, String)>,
    process: Option<tokio::process::Child>,
    started: Value,
    phase: &'static str,
    state: Value,
    last_state: Value,
    restarts: u32,
    restart_at: Option<Instant>,
    ready: bool,
    readiness: Option<Prober>,
    liveness: Option<Prober>,
    reported: Option<Value>,
}

fn now() -> Value {
    json!(Time(k8s_openapi::jiff::Timestamp::now()))
}

impl Slot {
    /// Starts (or restarts) the container's process.
    fn start(&mut self) {
        let spawned = (|| {
            std::fs::write(self.rootfs.termination_log(), "")?;
            let log =
                std::fs::OpenOptions::new().create(true).append(true).open(self.files.dir().join("log"))?;
            tokio::process::Command::new(&self.program[0])
                .args(&self.program[1..])
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .current_dir(self.rootfs.root())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
        })();
        match spawned {
            Ok(child) => {
                self.files.set_pid(child.id());
                self.process = Some(child);
                self.state = json!({"running": {"startedAt": now()}});
                let start = Instant::now();
                for prober in self.readiness.iter_mut().chain(self.liveness.iter_mut()) {
                    (prober.next, prober.failures) = (start + prober.initial_delay, 0);
                }
                self.ready = self.readiness.is_none();
            }
            Err(e) => self.ended(128, "StartError", format!("{}: {e}", self.program[0])),
        }
    }

    /// Records the end of the container: restarts it later or finishes the Pod.
    fn ended(&mut self, exit_code: i32, reason: &str, message: String) {
        let started = self.state.pointer("/running/startedAt").cloned().unwrap_or_else(now);
        let mut terminated =
            json!({"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now()});
        if !message.is_empty() {
            terminated["message"] = json!(message);
        }
        self.process = None;
        self.files.set_pid(None);
        self.ready = false;
        let restart = match self.restart_policy.as_str() {
            "Never" => false,
            "OnFailure" => exit_code != 0,
            _ => true,
        };
        if restart {
            let back_off = Duration::from_secs(10 << self.restarts.min(5)).min(Duration::from_secs(300));
            self.restart_at = Some(Instant::now() + back_off);
            self.last_state = json!({"terminated": terminated});
            self.state = json!({"waiting": {"reason": "CrashLoopBackOff",
                "message": format!("back-off {}s restarting failed container", back_off.as_secs())}});
        } else {
            self.phase = if exit_code == 0 { "Succeeded" } else { "Failed" };
            self.state = json!({"terminated": terminated});
        }
    }

    /// Notices an exited process, restarts a container whose back-off is over.
    fn advance(&mut self, now: Instant) {
        if let Some(child) = &mut self.process {
            if let Ok(Some(status)) = child.try_wait() {
                let code = exit_code(status);
                let mut message = std::fs::read(self.rootfs.termination_log()).unwrap_or_default();
                message.truncate(MAX_MESSAGE);
                let reason = if code == 0 { "Completed" } else { "Error" };
                self.ended(code, reason, String::from_utf8_lossy(&message).into_owned());
            }
        } else if self.restart_at.is_some_and(|at| now >= at) {
            self.restart_at = None;
            self.restarts += 1;
            self.start();
        }
    }

    /// The Pod's status as the kubelet reports it.
    fn status(&self) -> Value {
        let ready = self.ready && self.process.is_some();
        let condition =
            |kind: &str, ok: bool| json!({"type": kind, "status": if ok { "True" } else { "False" }});
        json!({
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "podIP": self.ip.to_string(),
            "podIPs": [{"ip": self.ip.to_string()}],
            "startTime": self.started,
            "conditions": [condition("PodScheduled", true), condition("Initialized", true),
                           condition("ContainersReady", ready), condition("Ready", ready)],
            "containerStatuses": [{
                "name": self.container.name, "image": self.container.image, "imageID": "",
                "ready": ready, "started": self.process.is_some(), "restartCount": self.restarts,
                "state": self.state, "lastState": self.last_state,
            }],
        })
    }
}

/// The kubelet of a Node.
pub struct Kubelet {
    client: kube::Client,
    http: reqwest::Client,
    dir: PathBuf,
    image_env: Vec<(String, String)>,
    proxy: String,
    addresses: Addresses,
    slots: Mutex<HashMap<String, Slot>>,
    /// The waiting status last reported for Pods that could not start, by uid.
    waiting: Mutex<HashMap<String, Value>>,
    /// The Node whose Pods this kubelet runs.
    node: String,
    /// Deleted Pods whose processes are being stopped, by uid.
    stopping: Arc<Mutex<HashSet<String>>>,
}

/// Whether the Pod has not finished (`Succeeded` or `Failed`) and is not being deleted.
fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && pod.metadata.deletion_timestamp.is_none()
}

/// `name=value` in `env`, replacing an earlier value (the last definition wins).
fn set(env: &mut Vec<(String, String)>, name: &str, value: String) {
    env.retain(|(n, _)| n != name);
    env.push((name.to_string(), value));
}

/// The value of a `fieldRef`.
fn field(pod: &Pod, path: &str, ip: Ipv4Addr) -> Result<String, String> {
    let meta = &pod.metadata;
    let keyed = |prefix: &str| path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']"));
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "status.podIP" => Some(ip.to_string()),
        _ => {
            if let Some(key) = keyed("metadata.labels['") {
                meta.labels.as_ref().and_then(|l| l.get(key).cloned())
            } else if let Some(key) = keyed("metadata.annotations['") {
                meta.annotations.as_ref().and_then(|a| a.get(key).cloned())
            } else {
                return Err(format!("fieldRef {path} is not simulated"));
            }
        }
    };
    Ok(value.unwrap_or_default())
}

impl Kubelet {
    /// The kubelet of Node `node`, keeping Pod folders under `dir`, running the kart image from
    /// the binaries in `bin_dir`, with Services reached through the HTTP proxy `proxy`.
    pub fn new(
        client: kube::Client,
        node: &str,
        dir: PathBuf,
        bin_dir: &std::path::Path,
        proxy: String,
    ) -> Kubelet {
        let mut image_env = vec![
            ("PATH".to_string(), format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir.display())),
            ("KART_LOG".to_string(), "info".to_string()),
        ];
        if let Ok(path) = std::env::var("LD_LIBRARY_PATH") {
            image_env.push(("LD_LIBRARY_PATH".to_string(), path));
        }
        Kubelet {
            client,
            http: reqwest::Client::builder().no_proxy().build().expect("an HTTP client"),
            dir,
            image_env,
            proxy,
            addresses: Addresses::default(),
            slots: Mutex::default(),
            waiting: Mutex::default(),
            node: node.to_string(),
            stopping: Arc::default(),
        }
    }

    /// Everything needed to run `pod`, or why it cannot start yet.
    async fn prepare(&self, pod: &Pod, pods: &[Pod]) -> Result<Slot, Waiting> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let config = |m: String| ("CreateContainerConfigError", m);
        let [container] = spec.containers.as_slice() else {
            return Err(config("the harness runs Pods of one container".into()));
        };
        let image = container.image.as_deref().unwrap_or_default();
        if image.rsplit_once(':').map_or(image, |(repository, _)| repository) != KART_IMAGE {
            return Err(("ErrImagePull", format!("{image}: the harness runs only {KART_IMAGE} images")));
        }
        let files = PodFiles::new(&self.dir, &namespace, &name);
        let rootfs = RootFs::mount(&self.client, pod, container, files.dir())
            .await
            .map_err(|e| ("ContainerCreating", format!("{e:#}")))?;
        let ip = self.addresses.next();
        let mut env = self.image_env.clone();
        set(&mut env, "HOSTNAME", name.clone());
        if container.env_from.is_some() {
            return Err(config("envFrom is not simulated".into()));
        }
        for var in container.env.iter().flatten() {
            let value = match var.value_from.as_ref().map(|s| (&s.field_ref, &s.secret_key_ref)) {
                Some((Some(field_ref), _)) => field(pod, &field_ref.field_path, ip).map_err(config)?,
                Some((None, Some(key))) => self.secret_value(&namespace, key).await?,
                Some(_) => {
                    return Err(config(format!(
                        "env {}: only fieldRef and secretKeyRef are simulated",
                        var.name
                    )));
                }
                None => var.value.clone().unwrap_or_default(),
            };
            let value = self.resolve(value, pod, ip, pods)?;
            set(&mut env, &var.name, rootfs.map(&value));
        }
        set(&mut env, kart_http::BIND_ADDRESS_ENV, ip.to_string());
        set(&mut env, "HTTP_PROXY", self.proxy.clone());
        set(&mut env, "NO_PROXY", "127.0.0.1,localhost".into());
        let mut program = container.command.clone().unwrap_or_else(|| vec![ENTRYPOINT.into()]);
        program.extend(container.args.iter().flatten().cloned());
        let program = program.iter().map(|a| rootfs.map(a)).collect();
        let readiness = Prober::new(container.readiness_probe.as_ref(), container, ip).map_err(config)?;
        let liveness = Prober::new(container.liveness_probe.as_ref(), container, ip).map_err(config)?;
        self.addresses.take();
        Ok(Slot {
            namespace,
            ip,
            container: container.clone(),
            restart_policy: spec.restart_policy.clone().unwrap_or_else(|| "Always".into()),
            grace: Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64),
            rootfs,
            files,
            program,
            env,
            process: None,
            started: now(),
            phase: "Running",
            state: json!({"waiting": {"reason": "ContainerCreating"}}),
            last_state: json!({}),
            restarts: 0,
            restart_at: None,
            ready: false,
            readiness,
            liveness,
            reported: None,
            name,
        })
    }

    /// The value of `key` in its Secret; as the kubelet does, waits while the Secret or the key is
    /// missing.
    async fn secret_value(&self, namespace: &str, key: &SecretKeySelector) -> Result<String, Waiting> {
        let waiting = |m: String| ("CreateContainerConfigError", m);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret =
            secrets.get_opt(&key.name).await.map_err(|e| waiting(format!("secret {:?}: {e}", key.name)))?;
        let value = secret
            .and_then(|s| s.data?.remove(&key.key))
            .ok_or_else(|| waiting(format!("secret {:?} or its key {:?} not found", key.name, key.key)))?;
        String::from_utf8(value.0)
            .map_err(|_| waiting(format!("secret {:?} key {:?} is not UTF-8", key.name, key.key)))
    }

    /// `value`, or the address of the Pod it names by DNS (`pod` itself has `ip`); waits while
    /// that Pod has not started.
    fn resolve(&self, value: String, pod: &Pod, ip: Ipv4Addr, pods: &[Pod]) -> Result<String, Waiting> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some((host, subdomain)) = network::pod_named(&value, namespace) else { return Ok(value) };
        let named = |p: &Pod| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.spec.as_ref().is_some_and(|s| {
                    s.hostname.as_deref() == Some(host) && s.subdomain.as_deref() == Some(subdomain)
                })
        };
        if named(pod) {
            return Ok(ip.to_string());
        }
        let Some(target) = pods.iter().filter(|p| is_active(p)).find(|p| named(p)) else {
            return Ok(value);
        };
        let uid = target.metadata.uid.as_deref().unwrap_or_default();
        match self.slots.lock().expect("slots lock").get(uid) {
            Some(slot) => Ok(slot.ip.to_string()),
            None => Err(("ContainerCreating", format!("{value} does not resolve yet"))),
        }
    }

    /// Stops the process of a deleted Pod: SIGTERM, SIGKILL after the grace period; then removes
    /// the Pod.
    fn stop(&self, uid: String, slot: Slot) {
        let finalize = self.finalizer(uid.clone(), &slot.namespace, &slot.name);
        self.stopping.lock().expect("stopping lock").insert(uid);
        let Some(mut child) = slot.process else {
            tokio::spawn(finalize);
            return;
        };
        tokio::spawn(async move {
            if let Some(pid) = child.id() {
                // SAFETY: signalling a child process this kubelet started and has not reaped.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            }
            let (status, killed_after_grace) = match tokio::time::timeout(slot.grace, child.wait()).await {
                Ok(status) => (status, false),
                Err(_) => {
                    let _ = child.start_kill();
                    (child.wait().await, true)
                }
            };
            slot.files.set_pid(None);
            if let Ok(status) = status {
                let exit = Exit { code: exit_code(status), killed_after_grace };
                if let Err(e) = slot.files.set_exit(&exit) {
                    eprintln!("kubelet: recording the exit of pod {}: {e}", slot.name);
                }
            }
            finalize.await;
        });
    }

    /// What removes deleted Pod `namespace/name` (uid `uid`) from the API server once it has
    /// stopped, as a kubelet confirms a deletion: a delete with no grace period, for that uid.
    fn finalizer(&self, uid: String, namespace: &str, name: &str) -> impl Future<Output = ()> + use<> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let (name, stopping) = (name.to_string(), self.stopping.clone());
        async move {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => eprintln!("kubelet: removing pod {name}: {e}"),
            }
            stopping.lock().expect("stopping lock").remove(&uid);
        }
    }

    /// One pass: stops the processes of deleted Pods, starts new Pods, notices exits, probes and
    /// reports every status that changed.
    pub async fn sync(&self) -> anyhow::Result<()> {
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let pods = Api::<Pod>::all(self.client.clone()).list(&params).await?.items;
        let live: HashSet<&str> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let gone: Vec<(String, Slot)> = {
            let mut slots = self.slots.lock().expect("slots lock");
            let uids: Vec<String> = slots.keys().filter(|u| !live.contains(u.as_str())).cloned().collect();
            uids.into_iter().filter_map(|u| slots.remove(&u).map(|slot| (u, slot))).collect()
        };
        for (uid, slot) in gone {
            self.stop(uid, slot);
        }
        // Deleted Pods that never ran here (or were stopped before) go at once.
        for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_some()) {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let busy = self.stopping.lock().expect("stopping lock").contains(&uid)
                || self.slots.lock().expect("slots lock").contains_key(&uid);
            if !busy {
                let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                self.finalizer(uid, &namespace, &pod.name_any()).await;
            }
        }
        self.waiting.lock().expect("waiting lock").retain(|uid, _| live.contains(uid.as_str()));

        for pod in pods.iter().filter(|p| is_active(p)) {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.slots.lock().expect("slots lock").contains_key(&uid) {
                continue;
            }
            match self.prepare(pod, &pods).await {
                Ok(mut slot) => {
                    slot.start();
                    self.waiting.lock().expect("waiting lock").remove(&uid);
                    self.slots.lock().expect("slots lock").insert(uid, slot);
                }
                Err((reason, message)) => self.report_waiting(pod, &uid, reason, message).await?,
            }
        }

        let now = Instant::now();
        let mut probes = Vec::new();
        for (uid, slot) in self.slots.lock().expect("slots lock").iter_mut() {
            slot.advance(now);
            if slot.process.is_none() {
                continue;
            }
            for (liveness, prober) in [(false, &mut slot.readiness), (true, &mut slot.liveness)] {
                if let Some(p) = prober.as_mut()
                    && p.due(now)
                {
                    probes.push((uid.clone(), liveness, p.url.clone(), p.timeout));
                }
            }
        }
        let outcomes = futures::future::join_all(probes.into_iter().map(|(uid, liveness, url, timeout)| {
            let http = self.http.clone();
            async move {
                let answer = http.get(&url).timeout(timeout).send().await;
                (uid, liveness, answer.is_ok_and(|r| r.status().is_success() || r.status().is_redirection()))
            }
        }))
        .await;
        let mut reports = Vec::new();
        {
            let mut slots = self.slots.lock().expect("slots lock");
            for (uid, liveness, ok) in outcomes {
                let Some(slot) = slots.get_mut(&uid) else { continue };
                if liveness {
                    if slot.liveness.as_mut().is_some_and(|p| p.record(ok))
                        && let Some(child) = &mut slot.process
                    {
                        let _ = child.start_kill();
                    }
                } else if let Some(p) = slot.readiness.as_mut() {
                    let failed = p.record(ok);
                    slot.ready = ok || (slot.ready && !failed);
                }
            }
            for (uid, slot) in slots.iter() {
                let status = slot.status();
                if slot.reported.as_ref() != Some(&status) {
                    reports.push((uid.clone(), slot.namespace.clone(), slot.name.clone(), status));
                }
            }
        }
        for (uid, namespace, name, status) in reports {
            if self.patch_status(&namespace, &name, &status).await?
                && let Some(slot) = self.slots.lock().expect("slots lock").get_mut(&uid)
            {
                slot.reported = Some(status);
            }
        }
        Ok(())
    }

    /// Reports that `pod` waits to start, once per change.
    async fn report_waiting(
        &self,
        pod: &Pod,
        uid: &str,
        reason: &str,
        message: String,
    ) -> anyhow::Result<()> {
        let container = pod.spec.as_ref().and_then(|s| s.containers.first());
        let status = json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{
                "name": container.map(|c| c.name.clone()), "image": container.and_then(|c| c.image.clone()),
                "imageID": "", "ready": false, "started": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }],
        });
        if self.waiting.lock().expect("waiting lock").get(uid) == Some(&status) {
            return Ok(());
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        if self.patch_status(&namespace, &pod.metadata.name.clone().unwrap_or_default(), &status).await? {
            self.waiting.lock().expect("waiting lock").insert(uid.to_string(), status);
        }
        Ok(())
    }

    /// Writes a Pod's status; `false` when the Pod is gone.
    async fn patch_status(&self, namespace: &str, name: &str, status: &Value) -> anyhow::Result<bool> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
