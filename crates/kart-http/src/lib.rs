//! What every kart HTTP service shares: JSON errors that name the offending field, bounded JSON
//! bodies, the operational endpoints (`/healthz`, `/readyz`, `/metrics`), the listen address and
//! graceful shutdown; [`metrics`] registers the `kart_` Prometheus metrics they export, [`token`]
//! checks the token kart's processes share, [`panics`] answers a panicked handler with a 500,
//! [`port`] chooses loopback ports for servers started in another process, [`process`] reads
//! such a server's resident memory.

pub mod metrics;
pub mod panics;
pub mod port;
pub mod process;
pub mod token;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A request error answered with a 4xx (or 5xx) status and `{"error": {"field", "message"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// The request field at fault (`body` for the body as a whole).
    pub field: String,
    pub message: String,
}

impl ApiError {
    /// A 400 naming `field`.
    pub fn bad_request(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, field: field.into(), message: message.into() }
    }

    /// A 422: well-formed JSON whose field has the wrong type or value.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, field: field.into(), message: message.into() }
    }
}

impl From<kart_core::wire::InvalidField> for ApiError {
    /// A 422 naming the field.
    fn from(error: kart_core::wire::InvalidField) -> Self {
        ApiError::invalid(error.field, error.reason)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"field": self.field, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

/// Reads a request body of at most `limit` bytes as JSON.
pub async fn read_json(body: Body, limit: usize) -> Result<Value, ApiError> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        field: "body".into(),
        message: format!("request body exceeds the limit of {limit} bytes"),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request("body", format!("malformed JSON: {e}")))
}

/// A request body parsed as `T`; a mismatch is a 422 naming the field at fault by its path
/// (`n`, `prompts[0].messages[1].content`, an unknown field's own name), or `body` when the body
/// as a whole is.
pub fn from_json<T: serde::de::DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "body".to_string() } else { path };
        ApiError::invalid(field, e.into_inner().to_string())
    })
}

/// Whether a service is ready to take traffic (e.g. its index is loaded).
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the service ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the service is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// `/healthz` (the process answers), `/readyz` (503 until ready) and `/metrics` (Prometheus text).
pub fn ops_routes(registry: Registry, ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.get();
                async move {
                    match ready {
                        true => (StatusCode::OK, "ready"),
                        false => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let text = crate::metrics::encode(&registry);
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
            }),
        )
}

/// Names the one address of a pod whose network it shares with other pods. Kubernetes gives every
/// pod its own network namespace, where a server's wildcard host (`0.0.0.0`, `::`) is right and
/// nothing sets this variable; where pods share the host's network instead (kart's end-to-end
/// harness runs each simulated pod as a local process with its own loopback address), it keeps
/// pods whose configs name the same port apart.
pub const BIND_ADDRESS_ENV: &str = "KART_BIND_ADDRESS";

/// The address a server configured for `host:port` listens on: `bind_address` (see
/// [`BIND_ADDRESS_ENV`]) in place of a wildcard `host`, else `host` as configured.
pub fn listen_address(host: &str, port: u16, bind_address: Option<&str>) -> String {
    let wildcard = matches!(host, "0.0.0.0" | "::" | "[::]");
    match bind_address.filter(|a| wildcard && !a.is_empty()) {
        Some(address) => format!("{address}:{port}"),
        None => format!("{host}:{port}"),
    }
}

/// The address a server configured for `host:port` listens on, with [`BIND_ADDRESS_ENV`] applied.
pub fn bind_address(host: &str, port: u16) -> String {
    listen_address(host, port, std::env::var(BIND_ADDRESS_ENV).ok().as_deref())
}

/// Serves `router` on `listener` until SIGINT or SIGTERM, then finishes in-flight requests.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown_signal()).await
}

/// Resolves on SIGINT or SIGTERM (what a pod gets when it is deleted, suspended or evicted).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_field_by_its_path() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Request {
            n: usize,
            items: Vec<Item>,
        }
        #[derive(Debug, serde::Deserialize)]
        struct Item {
            content: String,
        }
        let ok: Request = from_json(json!({"n": 1, "items": [{"content": "a"}]})).unwrap();
        assert_eq!((ok.n, ok.items[0].content.as_str()), (1, "a"));
        let field = |v: Value| from_json::<Request>(v).unwrap_err().field;
        assert_eq!(field(json!({"n": -1, "items": []})), "n");
        assert_eq!(field(json!({"n": "2", "items": []})), "n");
        assert_eq!(field(json!({"n": 1, "items": "x"})), "items");
        assert_eq!(
            field(json!({"n": 1, "items": [{"content": "a"}, {"content": null}]})),
            "items[1].content"
        );
        assert_eq!(field(json!([1])), "body");
        let error = from_json::<Request>(json!({"n": 1, "items": [], "extra": 1})).unwrap_err();
        assert_eq!((error.status, error.field.as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "extra"));
    }
    use axum::http::Request;
    use tower::ServiceExt;

    async fn call(router: Router, uri: &str) -> (StatusCode, String) {
        let response = router.oneshot(Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readiness_follows_the_flag() {
        let ready = Readiness::default();
        let router = ops_routes(Registry::new(), ready.clone());
        assert_eq!(call(router.clone(), "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        ready.set(true);
        assert_eq!(call(router.clone(), "/readyz").await.0, StatusCode::OK);
        assert_eq!(call(router, "/healthz").await, (StatusCode::OK, "ok".into()));
    }

    #[test]
    fn only_a_wildcard_host_gives_way_to_the_bind_address() {
        assert_eq!(listen_address("0.0.0.0", 8000, None), "0.0.0.0:8000");
        assert_eq!(listen_address("0.0.0.0", 8000, Some("127.0.3.7")), "127.0.3.7:8000");
        assert_eq!(listen_address("::", 8001, Some("127.0.3.7")), "127.0.3.7:8001");
        assert_eq!(listen_address("0.0.0.0", 8000, Some("")), "0.0.0.0:8000");
        assert_eq!(
            listen_address("127.0.0.1", 8002, Some("127.0.3.7")),
            "127.0.0.1:8002",
            "a server configured for one address keeps it"
        );
    }

    #[tokio::test]
    async fn bodies_over_the_limit_and_bad_json_name_the_body() {
        let err = read_json(Body::from(vec![b' '; 100]), 10).await.unwrap_err();
        assert_eq!((err.status, err.field.as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "body"));
        let err = read_json(Body::from("{oops"), 100).await.unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("malformed JSON"), "{}", err.message);
    }
}
