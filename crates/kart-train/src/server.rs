//! The trainer's HTTP server: `/status` (JSON the operator reads), `/weights/{version}` (the
//! newest policy versions as safetensors, for workers that pull, bearing the token when there is
//! one), `/healthz`, `/readyz`, `/metrics`.

use super::weights::WeightStore;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use kart_http::token::Token;
use kart_http::{ApiError, Readiness};
use prometheus::Registry;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, RwLock};
use tokio_util::io::ReaderStream;

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
    /// Trainer processes (ranks) of the run.
    #[serde(default)]
    pub world_size: usize,
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
pub fn router(
    status: StatusHandle,
    weights: WeightStore,
    registry: Registry,
    ready: Readiness,
    token: Option<Token>,
) -> Router {
    Router::new()
        .route("/weights/{version}", get(weights_file))
        .route_layer(axum::middleware::from_fn_with_state(token, kart_http::token::require))
        .route("/status", get(|State(s): State<AppState>| async move { Json(s.status.get()) }))
        .route_layer(axum::middleware::from_fn(kart_http::panics::contain))
        .with_state(AppState { status, weights })
        .merge(kart_http::ops_routes(registry, ready))
}

async fn weights_file(State(s): State<AppState>, Path(version): Path<String>) -> Response {
    let Ok(version) = version.parse::<i64>() else {
        return ApiError::invalid("version", format!("`{version}` is not an integer")).into_response();
    };
    let Some(file) = s.weights.file(version) else {
        let message = format!("version {version} is not among the published versions served");
        return ApiError { status: StatusCode::NOT_FOUND, field: "version".into(), message }.into_response();
    };
    // Streamed from the open file: a large policy never sits in memory, and a version let go
    // while it is sent stays readable until the end.
    let opened = async {
        let opened = tokio::fs::File::open(&file).await?;
        let len = opened.metadata().await?.len();
        std::io::Result::Ok((opened, len))
    };
    match opened.await {
        Ok((opened, len)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_LENGTH, len.to_string()),
            ],
            Body::from_stream(ReaderStream::with_capacity(opened, STREAM_CHUNK)),
        )
            .into_response(),
        Err(e) => {
            let message = format!("{}: {e}", file.display());
            ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: "version".into(), message }
                .into_response()
        }
    }
}

/// Bytes read from a weights file at a time.
const STREAM_CHUNK: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(app: Router, uri: &str) -> (StatusCode, Option<String>, Vec<u8>) {
        let response = app.oneshot(Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let len = response.headers().get(header::CONTENT_LENGTH).map(|v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, len, body.to_vec())
    }

    #[tokio::test]
    async fn weights_are_streamed_whole_and_unknown_versions_are_named() {
        let dir = tempfile::tempdir().unwrap();
        // Several chunks and a partial last one.
        let bytes: Vec<u8> = (0..STREAM_CHUNK * 2 + 12_345).map(|i| (i * 7 % 251) as u8).collect();
        let file = dir.path().join("v3.safetensors");
        std::fs::write(&file, &bytes).unwrap();
        let weights = WeightStore::default();
        assert!(weights.publish(3, file, 2).is_empty());
        let app = router(StatusHandle::default(), weights, Registry::new(), Readiness::default(), None);

        let (status, len, body) = get(app.clone(), "/weights/3").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(len, Some(bytes.len().to_string()));
        assert!(body == bytes, "the body differs from the file ({} of {} bytes)", body.len(), bytes.len());

        let (status, _, body) = get(app.clone(), "/weights/4").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(error.to_string().contains("version 4 is not among"), "{error}");

        let (status, _, body) = get(app, "/weights/latest").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(String::from_utf8_lossy(&body).contains("`latest` is not an integer"));
    }

    #[tokio::test]
    async fn weights_are_served_only_to_the_bearer_of_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("v1.safetensors");
        std::fs::write(&file, b"weights").unwrap();
        let weights = WeightStore::default();
        weights.publish(1, file, 2);
        let token = Token::new("trainer-token", "test").unwrap();
        let app = router(
            StatusHandle::default(),
            weights,
            Registry::new(),
            Readiness::default(),
            Some(token.clone()),
        );
        assert_eq!(get(app.clone(), "/weights/1").await.0, StatusCode::UNAUTHORIZED);
        let request = Request::get("/weights/1")
            .header(header::AUTHORIZATION, token.authorization())
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(get(app, "/status").await.0, StatusCode::OK, "the operator reads /status without it");
    }
}
