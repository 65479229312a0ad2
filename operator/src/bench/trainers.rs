//! Simulated trainers, as KWOK's Pods are simulated: the operator's reads of a running trainer's
//! `/status` go through this HTTP proxy (its `HTTP_PROXY`), which answers each as a trainer that
//! has not finished a step yet. The operator's path is the one a real trainer meets (a request
//! per poll, a report parsed, a status derived), without DNS names no host here resolves.

use axum::Json;
use axum::Router;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The proxy, serving until dropped.
pub struct Trainers {
    /// `http://127.0.0.1:PORT`, for `HTTP_PROXY`.
    pub url: String,
    answered: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<()>,
}

impl Trainers {
    pub async fn start() -> anyhow::Result<Trainers> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let answered = Arc::new(AtomicU64::new(0));
        let count = answered.clone();
        let app = Router::new().fallback(move || {
            count.fetch_add(1, Ordering::Relaxed);
            async { Json(json!({"phase": "training", "step": 0, "policy_version": 0, "world_size": 1})) }
        });
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the simulated trainers' proxy stopped");
            }
        });
        Ok(Trainers { url, answered, server })
    }

    /// Status reads answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for Trainers {
    fn drop(&mut self) {
        self.server.abort();
    }
}
