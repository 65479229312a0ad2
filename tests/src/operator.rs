//! The real `kart-operator` binary run out of the cluster, against an API server through a
//! kubeconfig.

use crate::{Child, binary, free_port};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running `kart-operator run`, killed when dropped.
pub struct Operator {
    child: Child,
    /// Base URL of its `/metrics`, `/healthz` and `/readyz`.
    pub url: String,
    /// Its log (text format).
    pub log: PathBuf,
}

impl Operator {
    /// Starts `kart-operator run args…` with `kubeconfig` as Pod `pod` (its leader-election
    /// identity), logging to `log`.
    pub fn start(kubeconfig: &Path, pod: &str, log: &Path, args: &[&str]) -> std::io::Result<Operator> {
        let port = free_port();
        let mut command = Command::new(binary("kart-operator"));
        command
            .args(["run", "--http-port", &port.to_string(), "--log-format", "text"])
            .args(args)
            .env_clear()
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", pod)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?);
        // A workspace build unifies kart's features, so this binary links libtorch (the image's,
        // built alone, does not).
        if let Some(path) = std::env::var_os("LD_LIBRARY_PATH") {
            command.env("LD_LIBRARY_PATH", path);
        }
        let child = Child(command.spawn()?);
        Ok(Operator { child, url: format!("http://127.0.0.1:{port}"), log: log.to_path_buf() })
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits up to `deadline` for the exit; its status.
    pub fn terminate(mut self, deadline: std::time::Duration) -> std::process::ExitStatus {
        // SAFETY: signalling the child this handle owns and has not reaped.
        unsafe { libc::kill(self.child.0.id() as libc::pid_t, libc::SIGTERM) };
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.0.try_wait().expect("waiting for the operator") {
                return status;
            }
            assert!(start.elapsed() < deadline, "the operator did not stop within {deadline:?} of SIGTERM");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
