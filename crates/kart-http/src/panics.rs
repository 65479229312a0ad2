//! Handler panics answered, not dropped: [`contain`] turns a panic in a request handler into a
//! 500 whose body says only that the service's log has the cause, logs the panic's message, and
//! marks the response with [`Panicked`] so a service can count it.

use crate::ApiError;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;

/// The mark on a response answered for a panicked handler.
#[derive(Debug, Clone, Copy)]
pub struct Panicked;

/// Middleware (`axum::middleware::from_fn(contain)`): runs the handler, answering a panic with a
/// 500 marked [`Panicked`].
pub async fn contain(request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(payload) => {
            tracing::error!(path, cause = message(payload.as_ref()), "a request handler panicked");
            let error = ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                field: "body".into(),
                message: "internal error; the service's log has the cause".into(),
            };
            let mut response = error.into_response();
            response.extensions_mut().insert(Panicked);
            response
        }
    }
}

/// The message of a panic's payload (`panic!` gives a `&str` or a `String`).
pub fn message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(message), _) => message.to_string(),
        (_, Some(message)) => message.clone(),
        _ => "a panic without a message".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use tower::ServiceExt;

    async fn explode() -> &'static str {
        panic!("handler bug {}", 42)
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_marked_500_without_its_message() {
        let router = Router::new()
            .route("/explode", axum::routing::post(explode))
            .route("/fine", axum::routing::post(|| async { "ok" }))
            .route_layer(axum::middleware::from_fn(contain));
        let call =
            |uri: &'static str| router.clone().oneshot(Request::post(uri).body(Body::empty()).unwrap());
        let response = call("/explode").await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.extensions().get::<Panicked>().is_some());
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("the service's log has the cause") && !body.contains("42"), "{body}");
        let response = call("/fine").await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.extensions().get::<Panicked>().is_none());
    }

    #[test]
    fn messages_of_str_and_string_panics() {
        assert_eq!(message(&"static"), "static");
        assert_eq!(message(&String::from("owned")), "owned");
        assert_eq!(message(&7_u8), "a panic without a message");
    }
}
