//! Online backends: web search through Serper ([`OnlineSearch`], answering Search-R1's `/retrieve`)
//! and page reading for ASearcher's `<access>` tool ([`PageReader`]: the Jina reader when a key is
//! set, else a direct fetch converted from HTML to text).
//!
//! Both cache their answers (LRU, at most `cache_entries` and `cache_bytes` each), limit the
//! requests in flight toward each upstream service (`concurrency`; page reads also toward each
//! host, `per_host_concurrency`), time out each request (`timeout_secs`) and retry transport
//! errors, 429 and 5xx with exponential backoff (`retries`, `backoff_ms`). They export
//! - `kart_retriever_cache_requests_total{backend="serper"|"page", result="hit"|"miss"}`,
//! - `kart_retriever_upstream_requests_total{service="serper"|"jina"|"web", outcome="ok"|"error"|"retry"}`,
//! - `kart_retriever_upstream_latency_seconds{service}` (one observation per attempt).
//!
//! API keys are held in a redacting type: they appear in no log, error or `Debug` output. Direct
//! page reads reach public addresses only ([`address`]), and one `/access` request reads each
//! distinct URL once and returns at most `access_budget_bytes` of text.

mod address;
mod cache;
#[cfg(test)]
mod fake;
mod hosts;
mod page;
mod serper;
mod upstream;

pub use page::PageReader;
pub use serper::OnlineSearch;

use crate::RetrieverError;
use prometheus::Registry;
use prometheus::core::Collector;

/// Registers `collector` (the metric `name` for `label`) into `registry`; registering the same
/// series twice is an error naming it.
fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: &C,
    name: &str,
    label: &str,
) -> Result<(), RetrieverError> {
    registry.register(Box::new(collector.clone())).map_err(|e| RetrieverError::BadRequest {
        field: "registry",
        reason: format!("registering {name} for {label}: {e}"),
    })
}
