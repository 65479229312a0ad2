//! Test helpers: local fake upstreams and metric readings.

use axum::Router;
use kart_core::config::retriever::OnlineConfig;
use prometheus::{Registry, TextEncoder};

/// Serves `router` on a free local port and returns its base URL (`http://127.0.0.1:PORT`). The
/// listener is bound before this returns, so it is ready: connections queue until it accepts them.
pub(super) async fn serve(router: Router) -> String {
    serve_on("127.0.0.1", router).await
}

/// Serves `router` on a free port of the loopback address `ip` (`127.0.0.2`: another host than
/// [`serve`]'s) and returns its base URL.
pub(super) async fn serve_on(ip: &str, router: Router) -> String {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

/// Limits for tests: short backoff, a few retries, a generous timeout, the fakes' loopback address
/// allowed; the URLs are set by each test.
pub(super) fn config() -> OnlineConfig {
    OnlineConfig {
        serper_url: String::new(),
        jina_url: String::new(),
        cache_entries: 16,
        cache_bytes: 1 << 20,
        concurrency: 4,
        per_host_concurrency: 4,
        timeout_secs: 60.0,
        retries: 2,
        backoff_ms: 1,
        allow_internal: vec!["127.0.0.1".into()],
        access_budget_bytes: 8 << 20,
    }
}

/// The value of one series (`name{label="value",...}`, labels sorted) as exported, 0 when absent.
pub(super) fn sample(registry: &Registry, series: &str) -> f64 {
    let text = TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}
