//! One upstream HTTP service (Serper, the Jina reader, or the web at large): a client with a
//! per-request timeout, a limit on requests in flight, retries with exponential backoff, a cap on
//! body sizes, and the `kart_retriever_upstream_*` metrics.

use super::address::{AddressPolicy, Refused};
use super::register;
use crate::RetrieverError;
use kart_core::config::retriever::OnlineConfig;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use reqwest::{Client, RequestBuilder};
use std::error::Error as _;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Largest response body read from any upstream.
pub(super) const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;

/// An API key, kept as a header value marked sensitive. It has no `Display` and its `Debug` is
/// redacted, so it cannot end up in logs, errors or debug output.
#[derive(Clone)]
pub(super) struct ApiKey(HeaderValue);

impl ApiKey {
    /// The key itself as a header value (Serper's `X-API-KEY`). Surrounding whitespace (a trailing
    /// newline of a mounted secret) is dropped; a blank key is no key. `field` names the key in
    /// errors.
    pub(super) fn plain(field: &'static str, key: Option<String>) -> Result<Option<Self>, RetrieverError> {
        Self::with_scheme(field, "", key)
    }

    /// `Bearer KEY` (an `Authorization` header value), with the key handled as in [`Self::plain`].
    pub(super) fn bearer(field: &'static str, key: Option<String>) -> Result<Option<Self>, RetrieverError> {
        Self::with_scheme(field, "Bearer ", key)
    }

    fn with_scheme(
        field: &'static str,
        scheme: &str,
        key: Option<String>,
    ) -> Result<Option<Self>, RetrieverError> {
        let Some(key) = key.as_deref().map(str::trim).filter(|k| !k.is_empty()) else {
            return Ok(None);
        };
        let mut value =
            HeaderValue::from_str(&format!("{scheme}{key}")).map_err(|_| RetrieverError::BadRequest {
                field,
                reason: "contains characters not allowed in an HTTP header".into(),
            })?;
        value.set_sensitive(true);
        Ok(Some(ApiKey(value)))
    }

    /// The header value to send.
    pub(super) fn header(&self) -> HeaderValue {
        self.0.clone()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A client for one upstream service. Errors and metrics carry the service's name.
pub(super) struct Upstream {
    service: &'static str,
    client: Client,
    in_flight: Semaphore,
    concurrency: usize,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
    requests: IntCounterVec,
    latency: Histogram,
}

/// Why one attempt failed, and whether trying again may help.
struct Failure {
    retryable: bool,
    reason: String,
}

impl Failure {
    fn fatal(reason: String) -> Self {
        Failure { retryable: false, reason }
    }

    /// A transport error: the request could not be sent (connect error, reset, timeout) or its
    /// response not read. Those are retried; errors building the request or following redirects,
    /// and addresses the [`AddressPolicy`] refused, are not.
    fn transport(error: reqwest::Error) -> Self {
        let retryable = error.is_timeout() || error.is_connect() || error.is_request() || error.is_body();
        // The URL is named by the caller; the chain of sources says what went wrong.
        let error = error.without_url();
        let mut reason = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            if let Some(refused) = cause.downcast_ref::<Refused>() {
                return Failure { retryable: false, reason: refused.to_string() };
            }
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        Failure { retryable, reason }
    }
}

impl Upstream {
    /// A client for `service` with the limits of `config`, reaching only the addresses `policy`
    /// allows when there is one, its metrics registered into `registry`.
    pub(super) fn new(
        service: &'static str,
        config: &OnlineConfig,
        policy: Option<&Arc<AddressPolicy>>,
        registry: &Registry,
    ) -> Result<Self, RetrieverError> {
        if config.concurrency == 0 {
            return Err(RetrieverError::BadRequest {
                field: "online.concurrency",
                reason: "must be at least 1, got 0".into(),
            });
        }
        let timeout = Duration::try_from_secs_f64(config.timeout_secs)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| RetrieverError::BadRequest {
                field: "online.timeout_secs",
                reason: format!("must be a positive number of seconds, got {}", config.timeout_secs),
            })?;
        let builder = Client::builder().timeout(timeout).user_agent(concat!(
            "Mozilla/5.0 (compatible; kart/",
            env!("CARGO_PKG_VERSION"),
            ")"
        ));
        let client = match policy {
            Some(policy) => policy.guard(builder),
            None => builder,
        }
        .build()
        .map_err(|e| RetrieverError::Upstream {
            service,
            reason: format!("building the HTTP client: {e}"),
        })?;

        let requests = IntCounterVec::new(
            Opts::new(
                "kart_retriever_upstream_requests_total",
                "Requests to upstream services of the online retriever, by outcome (ok, error, retry).",
            )
            .const_label("service", service),
            &["outcome"],
        )
        .expect("valid metric options");
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "kart_retriever_upstream_latency_seconds",
                "Latency of one request to an upstream service of the online retriever.",
            )
            .const_label("service", service)
            .buckets(prometheus::exponential_buckets(0.01, 2.0, 12).expect("valid buckets")),
        )
        .expect("valid metric options");
        register(registry, &requests, "kart_retriever_upstream_requests_total", service)?;
        register(registry, &latency, "kart_retriever_upstream_latency_seconds", service)?;

        Ok(Upstream {
            service,
            client,
            in_flight: Semaphore::new(config.concurrency),
            concurrency: config.concurrency,
            timeout,
            retries: config.retries,
            backoff: Duration::from_millis(config.backoff_ms),
            requests,
            latency,
        })
    }

    /// The service's name, as in errors and metrics.
    pub(super) fn service(&self) -> &'static str {
        self.service
    }

    /// The HTTP client, to build requests for [`Self::fetch`].
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// Sends the request made by `request` (once per attempt) and reads the body, retrying on
    /// transport errors, 429 and 5xx with a backoff doubling from `backoff_ms`. Before the body is
    /// read, `accept` decides from the response's media type (lowercase, without parameters)
    /// whether and as what the body is taken; refusals are not retried. `what` names the request
    /// in errors and logs.
    pub(super) async fn fetch<K>(
        &self,
        what: &str,
        request: impl Fn() -> RequestBuilder,
        accept: impl Fn(Option<&str>) -> Result<K, String>,
    ) -> Result<(K, Vec<u8>), RetrieverError> {
        let mut attempt = 0;
        loop {
            match self.attempt(&request, &accept).await {
                Ok(reply) => {
                    self.requests.with_label_values(&["ok"]).inc();
                    return Ok(reply);
                }
                Err(failure) if failure.retryable && attempt < self.retries => {
                    self.requests.with_label_values(&["retry"]).inc();
                    let delay = self.backoff.saturating_mul(2u32.saturating_pow(attempt));
                    tracing::debug!(service = self.service, what, reason = %failure.reason, ?delay, "retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(failure) => {
                    self.requests.with_label_values(&["error"]).inc();
                    let attempts = attempt + 1;
                    tracing::warn!(service = self.service, what, reason = %failure.reason, attempts, "upstream failed");
                    let tries =
                        if attempts == 1 { "1 attempt".into() } else { format!("{attempts} attempts") };
                    return Err(RetrieverError::Upstream {
                        service: self.service,
                        reason: format!("{what}: {} ({tries})", failure.reason),
                    });
                }
            }
        }
    }

    /// One attempt, holding one of the service's permits while in flight (not while backing off).
    async fn attempt<K>(
        &self,
        request: &impl Fn() -> RequestBuilder,
        accept: &impl Fn(Option<&str>) -> Result<K, String>,
    ) -> Result<(K, Vec<u8>), Failure> {
        let _permit = self.in_flight.acquire().await.expect("the semaphore is never closed");
        let _timer = self.latency.start_timer();
        let mut response = request().send().await.map_err(Failure::transport)?;
        let status = response.status();
        if !status.is_success() {
            let retryable = status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
            return Err(Failure { retryable, reason: format!("HTTP {status}") });
        }
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
        let kind = accept(media_type.as_deref()).map_err(Failure::fatal)?;

        let too_large = || Failure::fatal(format!("body larger than the {MAX_BODY_BYTES}-byte limit"));
        if response.content_length().is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(Failure::transport)? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((kind, body))
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("service", &self.service)
            .field("concurrency", &self.concurrency)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}
