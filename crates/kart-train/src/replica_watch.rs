//! Replicas left behind between publishes: a task asks every SGLang or vLLM replica for its
//! `weight_version` every [`INTERVAL`], sets each one's lag behind the published version
//! (`kart_trainer_replica_version_lag`), and names the replicas behind it (restarted, or started
//! after the last publish), so that the trainer brings them to the published version at once
//! rather than at its next publish. A version that is not a number (SGLang's `default`, vLLM's
//! `null`: the weights a server started with) counts as version 0.

use crate::replicas;
use kart_core::config::train::InferenceServer;
use kart_rollout::engines::sglang::SglangEngine;
use kart_rollout::engines::vllm::VllmEngine;
use prometheus::GaugeVec;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// How often the replicas are asked.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The watching task, stopped when dropped.
pub struct ReplicaWatch {
    published: Arc<AtomicI64>,
    behind: watch::Receiver<Vec<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReplicaWatch {
    /// Watches the `server` replicas behind `urls` (resolved at every look), setting `lag` by
    /// replica.
    pub fn spawn(server: InferenceServer, urls: Vec<String>, lag: GaugeVec) -> Self {
        let published = Arc::new(AtomicI64::new(-1));
        let (tell, behind) = watch::channel(Vec::new());
        let task = tokio::spawn(watch_replicas(server, urls, lag, published.clone(), tell));
        ReplicaWatch { published, behind, task }
    }

    /// Records that every replica took `version`.
    pub fn published(&self, version: i64) {
        self.published.store(version, Ordering::SeqCst);
    }

    /// Waits until a look finds replicas behind the published version; returns them.
    pub async fn behind(&mut self) -> Vec<String> {
        loop {
            if self.behind.changed().await.is_err() {
                return std::future::pending().await;
            }
            let behind = self.behind.borrow_and_update().clone();
            if !behind.is_empty() {
                return behind;
            }
        }
    }
}

impl Drop for ReplicaWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch_replicas(
    server: InferenceServer,
    urls: Vec<String>,
    lag: GaugeVec,
    published: Arc<AtomicI64>,
    tell: watch::Sender<Vec<String>>,
) {
    let mut known = BTreeSet::new();
    loop {
        tokio::time::sleep(INTERVAL).await;
        let version = published.load(Ordering::SeqCst);
        if version < 0 {
            continue;
        }
        let found = match replicas::resolve(&urls).await {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%error, server = server.name(), "watching the replicas");
                continue;
            }
        };
        let asks = found.iter().map(|r| async move {
            match server {
                InferenceServer::Sglang => SglangEngine::new(r, INTERVAL).weight_version().await,
                InferenceServer::Vllm => VllmEngine::control(r, INTERVAL).weight_version().await,
            }
        });
        let held = futures::future::join_all(asks).await;
        let mut behind = Vec::new();
        for (replica, held) in found.iter().zip(held) {
            // A replica that does not answer is starting, or gone: the next look tells.
            let Ok(held) = held else { continue };
            let held = held.unwrap_or(0);
            // A replica ahead is taking a publish in progress.
            lag.with_label_values(&[replica.as_str()]).set((version - held).max(0) as f64);
            if held < version {
                behind.push(replica.clone());
            }
        }
        let current: BTreeSet<String> = found.into_iter().collect();
        for gone in known.difference(&current) {
            let _ = lag.remove_label_values(&[gone.as_str()]);
        }
        known = current;
        if !behind.is_empty() {
            tracing::info!(?behind, version, server = server.name(), "replicas behind the published version");
        }
        tell.send_replace(behind);
    }
}
