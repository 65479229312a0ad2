//! The trainer's HTTP server: `/status` (JSON the operator reads), `/weights/{version}` (the
//! newest policy versions as safetensors, for workers that pull), `/healthz`, `/readyz`, `/metrics`.

use super::weights::WeightStore;
use crate::http::{self, ApiError, Readiness};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use prometheus::Registry;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, RwLock};

/// What the trainer is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Starting,
    Evaluating,
    Training,
    Checkpointing,
    Finished,
    Failed,
    /// Stopped by SIGTERM or SIGINT before the end (its pod was deleted, suspended or evicted); a
    /// resumed run continues from the newest checkpoint.
    Stopped,
}

/// The trainer's state as `/status` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub phase: Phase,
    /// Steps completed.
    pub step: u64,
    pub total_steps: u64,
    pub policy_version: i64,
    /// Mean reward of the last step.
    pub reward: Option<f64>,
    /// Exact match of the last evaluation.
    pub eval_em: Option<f64>,
    /// The newest checkpoint folder.
    pub checkpoint: Option<String>,
    /// Why the run failed.
    pub error: Option<String>,
}

/// A shared, updatable [`Status`].
#[derive(Debug, Clone, Default)]
pub struct StatusHandle(Arc<RwLock<Status>>);

impl StatusHandle {
    /// Applies `f` to the status.
    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.0.write().expect("status lock"));
    }

    /// A copy of the status.
    pub fn get(&self) -> Status {
        self.0.read().expect("status lock").clone()
    }
}

#[derive(Clone)]
struct AppState {
    status: StatusHandle,
    weights: WeightStore,
}

/// The trainer's routes.
pub fn router(status: StatusHandle, weights: WeightStore, registry: Registry, ready: Readiness) -> Router {
    Router::new()
        .route("/status", get(|State(s): State<AppState>| async move { Json(s.status.get()) }))
        .route("/weights/{version}", get(weights_file))
        .with_state(AppState { status, weights })
        .merge(http::ops_routes(registry, ready))
}

async fn weights_file(State(s): State<AppState>, Path(version): Path<String>) -> Response {
    let Ok(version) = version.parse::<i64>() else {
        return ApiError::invalid("version", format!("`{version}` is not an integer")).into_response();
    };
    let Some(file) = s.weights.file(version) else {
        let message = format!("version {version} is not among the published versions served");
        return ApiError { status: StatusCode::NOT_FOUND, field: "version".into(), message }.into_response();
    };
    match tokio::fs::read(&file).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => {
            let message = format!("{}: {e}", file.display());
            ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: "version".into(), message }
                .into_response()
        }
    }
}
