//! An HTTP server a benchmark measures against (a stand-in, or a real vLLM): started on a port
//! claimed for it ([`kart_http::port`]: another kart process, or a `bind(0)` while the server
//! imports PyTorch, cannot be handed the same) in a process group of its own, polled until it
//! answers `/health`, stopped with its whole group (vLLM's engine core is a second process) when
//! dropped.

use anyhow::{Context, bail};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A running server and its base URL.
pub struct Server {
    child: Child,
    /// What it is, for errors (`vLLM`, `the SGLang stand-in`).
    name: String,
    /// `http://127.0.0.1:{port}`.
    pub url: String,
}

impl Server {
    /// A free port for a server to listen on.
    pub fn free_port() -> anyhow::Result<u16> {
        kart_http::port::free_port().context("a port for a benchmark's server")
    }

    /// Starts `command`, which listens on `port`, as the server `name`; what it prints goes to
    /// standard error, leaving standard output to the report.
    pub fn spawn(name: &str, mut command: Command, port: u16) -> anyhow::Result<Server> {
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.stdout(std::io::stderr());
        let child = command.spawn().with_context(|| format!("starting {name} ({command:?})"))?;
        Ok(Server { child, name: name.to_owned(), url: format!("http://127.0.0.1:{port}") })
    }

    /// The server's resident memory now, in MB.
    pub fn rss_mb(&self) -> f64 {
        kart_http::process::resident_mb(self.child.id())
    }

    /// Polls `/health` until it answers, failing when the server exits first or `limit` passes
    /// (a deadline for a loaded machine, not an expected time). An answer counts only while the
    /// server still runs: one that failed to bind its port must not pass for whatever holds it.
    pub async fn ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        self.ready_at("/health", limit).await
    }

    /// [`Server::ready`] for a server whose readiness is at `path` (kart's `/readyz`).
    pub async fn ready_at(&mut self, path: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        let client = reqwest::Client::new();
        let health = format!("{}{path}", self.url);
        loop {
            let answered = client.get(&health).send().await.is_ok_and(|r| r.status().is_success());
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited ({status}) before answering {health}; its error is above", self.name);
            }
            if answered {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not answer {health} within {} s", self.name, limit.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The group: a server's workers are processes of their own.
        if let Ok(group) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: a signal to the process group this server leads; no memory is shared.
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}
