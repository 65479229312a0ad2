//! The trajectory viewer: a run's `rollouts.jsonl` in the browser, as the trainer serves it at
//! `/ui` while it trains and `kart view DIR` serves it after.
//!
//! The page (plain HTML, CSS and JavaScript built into the binary; nothing is loaded from
//! elsewhere) lists the steps with their reward and tool calls, and the trajectories, filtered
//! by step, reward, environment, role and tool; a trajectory reads as the conversation it was
//! (the prompt, each model turn with its tool calls, each tool response, the answer) with the
//! tokens that carry loss set apart from those that do not, its reward and the reward's parts,
//! and its staleness; a GRPO group is shown side by side. The page reads the JSON API below it:
//!
//! - `GET /ui/api/summary`: the steps' figures and the values of each filter ([`Summary`]);
//! - `GET /ui/api/trajectories?step=&min_reward=&max_reward=&env=&role=&tool=&prompt_id=&offset=&limit=`:
//!   a page of the list ([`Page`]);
//! - `GET /ui/api/trajectories/{line}`: one trajectory whole, as the trainer wrote it.

pub mod rollouts;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use kart_http::ApiError;
pub use rollouts::{Filter, Page, Rollouts, Summary};
use std::collections::HashMap;
use std::sync::Arc;

/// The most trajectories one page of the list holds.
pub const MAX_LIMIT: usize = 1000;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/viewer.js");
const STYLE: &str = include_str!("assets/viewer.css");

/// The viewer's routes (`/ui`, its assets and its API) over `rollouts`.
pub fn router(rollouts: Arc<Rollouts>) -> Router {
    let asset = |body: &'static str, kind: &'static str| {
        get(
            move || async move { ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body) },
        )
    };
    Router::new()
        .route("/ui", get(|| async { axum::response::Redirect::permanent("/ui/") }))
        .route("/ui/", asset(INDEX, "text/html; charset=utf-8"))
        .route("/ui/viewer.js", asset(SCRIPT, "text/javascript; charset=utf-8"))
        .route("/ui/viewer.css", asset(STYLE, "text/css; charset=utf-8"))
        .route("/ui/api/summary", get(summary))
        .route("/ui/api/trajectories", get(list))
        .route("/ui/api/trajectories/{line}", get(trajectory))
        .route_layer(axum::middleware::from_fn(kart_http::panics::contain))
        .with_state(rollouts)
}

/// Runs `f` on the blocking pool (the index reads the file).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Response> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        let message = format!("the viewer's read failed: {e}");
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, field: "file".into(), message }.into_response()
    })
}

fn read_error(e: rollouts::ReadError) -> Response {
    let status = match e {
        rollouts::ReadError::NoSuchLine(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError { status, field: "file".into(), message: e.to_string() }.into_response()
}

async fn summary(State(r): State<Arc<Rollouts>>) -> Response {
    match blocking(move || r.summary()).await {
        Ok(Ok(s)) => Json(s).into_response(),
        Ok(Err(e)) => read_error(e),
        Err(response) => response,
    }
}

async fn list(State(r): State<Arc<Rollouts>>, Query(query): Query<HashMap<String, String>>) -> Response {
    let (filter, offset, limit) = match parse_query(&query) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    match blocking(move || r.list(&filter, offset, limit)).await {
        Ok(Ok(page)) => Json(page).into_response(),
        Ok(Err(e)) => read_error(e),
        Err(response) => response,
    }
}

async fn trajectory(State(r): State<Arc<Rollouts>>, Path(line): Path<String>) -> Response {
    let Ok(line) = line.parse::<usize>() else {
        return ApiError::invalid("line", format!("`{line}` is not a line number")).into_response();
    };
    match blocking(move || r.get(line)).await {
        Ok(Ok(t)) => Json(t).into_response(),
        Ok(Err(e)) => read_error(e),
        Err(response) => response,
    }
}

/// The list's filter and window from the query string; an empty value is no filter.
fn parse_query(q: &HashMap<String, String>) -> Result<(Filter, usize, usize), ApiError> {
    const KNOWN: [&str; 9] =
        ["step", "min_reward", "max_reward", "env", "role", "tool", "prompt_id", "offset", "limit"];
    if let Some(unknown) = q.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            unknown.clone(),
            format!("unknown parameter; known: {}", KNOWN.join(", ")),
        ));
    }
    let text = |name: &str| q.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    fn number<T: std::str::FromStr>(name: &str, value: Option<&str>) -> Result<Option<T>, ApiError> {
        value
            .map(|v| v.parse::<T>().map_err(|_| ApiError::invalid(name, format!("`{v}` is not a number"))))
            .transpose()
    }
    let reward = |name: &str| -> Result<Option<f64>, ApiError> {
        let r = number::<f64>(name, text(name))?;
        match r {
            Some(r) if !r.is_finite() => {
                Err(ApiError::invalid(name, format!("`{r}` is not a finite number")))
            }
            r => Ok(r),
        }
    };
    let filter = Filter {
        step: number("step", text("step"))?,
        min_reward: reward("min_reward")?,
        max_reward: reward("max_reward")?,
        env: text("env").map(str::to_string),
        role: text("role").map(str::to_string),
        tool: text("tool").map(str::to_string),
        prompt_id: text("prompt_id").map(str::to_string),
    };
    let offset = number("offset", text("offset"))?.unwrap_or(0);
    let limit = number("limit", text("limit"))?.unwrap_or(100);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid("limit", format!("{limit} is not within 1..={MAX_LIMIT}")));
    }
    Ok((filter, offset, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
        let response = app.clone().oneshot(Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_page_its_assets_and_bad_queries_named_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let app = router(Arc::new(Rollouts::new(&dir.path().join("rollouts.jsonl"))));
        let (status, page) = get(&app, "/ui/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains("viewer.js") && page.contains("viewer.css"), "{page}");
        // Nothing is loaded from another origin.
        for asset in [INDEX, SCRIPT, STYLE] {
            assert!(!asset.contains("http://") && !asset.contains("https://") && !asset.contains("//cdn"));
        }
        assert_eq!(get(&app, "/ui/viewer.js").await.0, StatusCode::OK);
        assert_eq!(get(&app, "/ui").await.0, StatusCode::PERMANENT_REDIRECT);
        let (status, body) = get(&app, "/ui/api/summary").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(r#""trajectories":0"#), "{body}");
        for (query, field) in [
            ("step=x", "step"),
            ("min_reward=nan", "min_reward"),
            ("limit=0", "limit"),
            ("limit=100000", "limit"),
            ("offset=-1", "offset"),
            ("colour=red", "colour"),
        ] {
            let (status, body) = get(&app, &format!("/ui/api/trajectories?{query}")).await;
            assert!(status.is_client_error(), "{query}: {status}");
            assert!(body.contains(&format!(r#""field":"{field}""#)), "{query}: {body}");
        }
        assert_eq!(
            get(&app, "/ui/api/trajectories?step=&env=").await.0,
            StatusCode::OK,
            "empty is no filter"
        );
        assert_eq!(get(&app, "/ui/api/trajectories/7").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get(&app, "/ui/api/trajectories/x").await.0, StatusCode::UNPROCESSABLE_ENTITY);
    }
}
