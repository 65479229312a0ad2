//! The token kart's own processes share. Rollout workers accept `POST /rollout` and `POST
//! /weights`, and the trainer serves `GET /weights/{version}`, only to a request bearing it
//! (`Authorization: Bearer <token>`, compared in constant time); probes and `/metrics` stay open.
//! The operator keeps one token per RolloutPool in a Secret and gives it to the pool's workers and
//! to the trainers of the TrainingJobs that use the pool. Outside the operator, `KART_TOKEN` (the
//! token) or `KART_TOKEN_FILE` (a file holding it) sets it; without either nothing is checked,
//! which the servers log at start.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::path::PathBuf;
use std::sync::Arc;
use subtle::ConstantTimeEq;

pub use kart_core::wire::{TOKEN_ENV, TOKEN_FILE_ENV};

/// A shared secret; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Why no token could be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read.
    #[error("{TOKEN_FILE_ENV}={path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Both variables are set.
    #[error("both {TOKEN_ENV} and {TOKEN_FILE_ENV} are set: set one")]
    Both,
    /// The token is unusable.
    #[error("{from}: {reason}")]
    Invalid {
        /// Where it came from.
        from: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Token {
    /// `value` without surrounding white space (a file's final newline), read from `from`.
    pub fn new(value: &str, from: &str) -> Result<Token, TokenError> {
        let value = value.trim();
        let invalid = |reason| Err(TokenError::Invalid { from: from.to_owned(), reason });
        if value.is_empty() {
            return invalid("the token is empty");
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return invalid(
                "the token must be printable ASCII without spaces (it travels in an HTTP header)",
            );
        }
        Ok(Token(value.into()))
    }

    /// The token of this process's environment ([`TOKEN_ENV`] or [`TOKEN_FILE_ENV`]), if any.
    pub fn from_env() -> Result<Option<Token>, TokenError> {
        match (std::env::var(TOKEN_ENV).ok(), std::env::var_os(TOKEN_FILE_ENV)) {
            (Some(_), Some(_)) => Err(TokenError::Both),
            (Some(value), None) => Token::new(&value, TOKEN_ENV).map(Some),
            (None, Some(path)) => {
                let path = PathBuf::from(path);
                let value = std::fs::read_to_string(&path)
                    .map_err(|source| TokenError::File { path: path.clone(), source })?;
                Token::new(&value, &format!("{TOKEN_FILE_ENV}={}", path.display())).map(Some)
            }
            (None, None) => Ok(None),
        }
    }

    /// The `Authorization` header value that bears this token, marked sensitive.
    pub fn authorization(&self) -> HeaderValue {
        let mut value = HeaderValue::try_from(format!("Bearer {}", self.0)).expect("checked printable ASCII");
        value.set_sensitive(true);
        value
    }

    /// Default headers for a client of kart's servers: the token's `Authorization`, if any.
    pub fn client_headers(token: Option<&Token>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            headers.insert(header::AUTHORIZATION, token.authorization());
        }
        headers
    }

    /// Whether `headers` bear this token.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let presented = headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes).unwrap_or_default();
        let presented = presented.strip_prefix(b"Bearer ").unwrap_or_default();
        presented.ct_eq(self.0.as_bytes()).into()
    }
}

/// Middleware (`axum::middleware::from_fn_with_state`): a 401 naming `authorization` unless the
/// request bears the token; every request passes when there is none.
pub async fn require(State(token): State<Option<Token>>, request: Request, next: Next) -> Response {
    match &token {
        Some(token) if !token.admits(request.headers()) => {
            let error = crate::ApiError {
                status: StatusCode::UNAUTHORIZED,
                field: "authorization".into(),
                message: format!(
                    "this endpoint needs `Authorization: Bearer <token>`, the token of {TOKEN_ENV}"
                ),
            };
            let mut response = error.into_response();
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        _ => next.run(request).await,
    }
}

/// Logs, at start, whether `server` checks a token.
pub fn log_state(server: &str, token: Option<&Token>) {
    if token.is_none() {
        tracing::warn!(
            "{server}: no {TOKEN_ENV} or {TOKEN_FILE_ENV}: anyone who reaches this server may send it weights and requests"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::{get, post};
    use tower::ServiceExt;

    fn app(token: Option<Token>) -> Router {
        Router::new()
            .route("/guarded", post(|| async { "ok" }))
            .route_layer(axum::middleware::from_fn_with_state(token, require))
            .route("/healthz", get(|| async { "ok" }))
    }

    async fn status(app: &Router, uri: &str, authorization: Option<&str>) -> StatusCode {
        let method = if uri == "/healthz" { "GET" } else { "POST" };
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        app.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap().status()
    }

    #[tokio::test]
    async fn only_the_bearer_of_the_token_passes() {
        let token = Token::new("s3cret-token\n", "test").unwrap();
        let app = app(Some(token.clone()));
        assert_eq!(status(&app, "/guarded", Some("Bearer s3cret-token")).await, StatusCode::OK);
        let authorization = token.authorization();
        assert!(authorization.is_sensitive());
        assert_eq!(status(&app, "/guarded", authorization.to_str().ok()).await, StatusCode::OK);
        for refused in [
            None,
            Some("Bearer s3cret-toke"),
            Some("Bearer s3cret-token2"),
            Some("s3cret-token"),
            Some("Basic s3cret-token"),
        ] {
            assert_eq!(status(&app, "/guarded", refused).await, StatusCode::UNAUTHORIZED, "{refused:?}");
        }
        assert_eq!(status(&app, "/healthz", None).await, StatusCode::OK, "probes stay open");
        let open = self::app(None);
        assert_eq!(status(&open, "/guarded", None).await, StatusCode::OK, "no token, no check");
    }

    #[test]
    fn bad_tokens_are_refused_naming_their_source() {
        assert_eq!(
            Token::new(" \n", "KART_TOKEN").unwrap_err().to_string(),
            "KART_TOKEN: the token is empty"
        );
        let error = Token::new("two words", "KART_TOKEN").unwrap_err().to_string();
        assert!(error.starts_with("KART_TOKEN: the token must be printable ASCII"), "{error}");
        assert_eq!(format!("{:?}", Token::new("abc", "x").unwrap()), "Token(<redacted>)");
    }
}
