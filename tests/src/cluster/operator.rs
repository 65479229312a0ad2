//! The real `kart-operator` binary, run against an [`ApiServer`] through its kubeconfig.

use super::apiserver::ApiServer;
use crate::{Child, binary, free_port};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running `kart-operator run`, stopped when dropped.
pub struct Operator {
    _child: Child,
    /// Base URL of its `/metrics`, `/healthz` and `/readyz`.
    pub url: String,
    /// Its log (text format).
    pub log: PathBuf,
}

impl Operator {
    /// Starts the operator watching `namespace` (its Lease there too), reading running trainers'
    /// `/status` every `status_poll_seconds`, logging to `dir/operator.log`. `proxy` is the
    /// `HTTP_PROXY` through which it reaches Services (the pod network's), if any.
    pub fn start(
        api: &ApiServer,
        dir: &Path,
        namespace: &str,
        status_poll_seconds: u64,
        proxy: Option<&str>,
    ) -> std::io::Result<Operator> {
        let port = free_port();
        let log = dir.join("operator.log");
        let mut command = Command::new(binary("kart-operator"));
        command
            .args(["run", "--http-port", &port.to_string(), "--log-format", "text"])
            .args(["--namespace", namespace, "--lease-namespace", namespace])
            .args(["--status-poll-seconds", &status_poll_seconds.to_string()])
            .env_clear()
            .env("KUBECONFIG", &api.kubeconfig)
            .env("POD_NAME", "kart-operator-0")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        if let Some(proxy) = proxy {
            command.env("HTTP_PROXY", proxy);
        }
        // A workspace build unifies kart's features, so this binary links libtorch (the image's,
        // built alone, does not).
        if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
            command.env("LD_LIBRARY_PATH", path);
        }
        let child = Child(command.spawn()?);
        Ok(Operator { _child: child, url: format!("http://127.0.0.1:{port}"), log })
    }
}
