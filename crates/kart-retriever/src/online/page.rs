//! Page reading for ASearcher's `<access>` tool: the Jina reader (`GET {jina_url}/{url}` with
//! `Authorization: Bearer KEY`) when a key is set, as in ASearcher's `OnlineSearchClient.access`,
//! else a direct `GET` of the page, HTML converted to text and other text passed through. Direct
//! reads reach public addresses only (see [`super::address`]). At most `per_host_concurrency` reads
//! of one host are in flight (waiting ones hold none of the `concurrency` slots), so a host that
//! answers slowly or never cannot take every slot.

use super::address::AddressPolicy;
use super::cache::Cache;
use super::hosts::HostLimits;
use super::upstream::{ApiKey, Upstream};
use crate::RetrieverError;
use futures::future::join_all;
use kart_core::config::retriever::OnlineConfig;
use prometheus::Registry;
use reqwest::Url;
use reqwest::header::AUTHORIZATION;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Lines of converted HTML are wrapped at this many columns: wide enough to leave paragraphs whole.
const TEXT_WIDTH: usize = 10_000;

/// Reads web pages as text, with caching, a concurrency limit, timeouts and retries.
pub struct PageReader {
    via: Via,
    upstream: Upstream,
    hosts: HostLimits,
    cache: Cache<String, Arc<str>>,
    /// Bytes of text one request returns at most.
    budget: usize,
}

/// How pages are read.
#[derive(Debug)]
enum Via {
    /// Through the Jina reader at this base URL (without a trailing slash).
    Jina { base: String, api_key: ApiKey },
    /// Directly from the page's server, at the addresses the policy allows.
    Web(Arc<AddressPolicy>),
}

/// How a directly fetched body becomes text, by its media type.
enum Format {
    Html,
    Text,
}

impl PageReader {
    /// A reader through the Jina reader at `config.jina_url` when `jina_key` (`JINA_API_KEY`) is
    /// set and not blank, else by direct fetches; its metrics registered into `registry`.
    pub fn new(
        config: &OnlineConfig,
        jina_key: Option<String>,
        registry: &Registry,
    ) -> Result<Self, RetrieverError> {
        let (via, service) = match ApiKey::bearer("JINA_API_KEY", jina_key)? {
            Some(api_key) => {
                Url::parse(&config.jina_url).map_err(|e| RetrieverError::BadRequest {
                    field: "online.jina_url",
                    reason: format!("{:?}: {e}", config.jina_url),
                })?;
                (Via::Jina { base: config.jina_url.trim_end_matches('/').to_string(), api_key }, "jina")
            }
            None => (Via::Web(Arc::new(AddressPolicy::new(&config.allow_internal)?)), "web"),
        };
        let policy = match &via {
            Via::Web(policy) => Some(policy),
            Via::Jina { .. } => None,
        };
        Ok(PageReader {
            upstream: Upstream::new(service, config, policy, registry)?,
            hosts: HostLimits::new(config.per_host_concurrency)?,
            via,
            cache: Cache::new(
                "page",
                config.cache_entries,
                config.cache_bytes,
                |url: &String, text: &Arc<str>| url.len() + text.len(),
                registry,
            )?,
            budget: config.access_budget_bytes,
        })
    }

    /// The text of each page, one result per URL: each distinct URL read once, concurrently, and
    /// pages past the request's byte budget (`online.access_budget_bytes`, counted in the order
    /// of `urls`) replaced by an error. Only http and https URLs are accepted.
    pub async fn access(&self, urls: &[String]) -> Vec<Result<Arc<str>, Arc<RetrieverError>>> {
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut distinct = Vec::new();
        for url in urls {
            first.entry(url.as_str()).or_insert_with(|| {
                distinct.push(url.as_str());
                distinct.len() - 1
            });
        }
        let pages: Vec<Result<Arc<str>, Arc<RetrieverError>>> =
            join_all(distinct.iter().map(|url| self.read(url)))
                .await
                .into_iter()
                .map(|page| page.map_err(Arc::new))
                .collect();
        let mut spent = 0usize;
        urls.iter()
            .map(|url| {
                let page = pages[first[url.as_str()]].clone()?;
                spent = spent.saturating_add(page.len());
                if spent > self.budget {
                    return Err(Arc::new(RetrieverError::BadRequest {
                        field: "urls",
                        reason: format!(
                            "{url}: this request's pages exceed online.access_budget_bytes ({} bytes)",
                            self.budget
                        ),
                    }));
                }
                Ok(page)
            })
            .collect()
    }

    /// One page, from the cache or from upstream.
    async fn read(&self, url: &str) -> Result<Arc<str>, RetrieverError> {
        let parsed =
            Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https")).ok_or_else(|| {
                RetrieverError::BadRequest { field: "urls", reason: format!("{url:?} is not an http(s) URL") }
            })?;
        if let Via::Web(policy) = &self.via {
            policy.check_url(&parsed).map_err(|refused| RetrieverError::BadRequest {
                field: "urls",
                reason: format!("{url}: {refused}"),
            })?;
        }
        if let Some(text) = self.cache.get(url) {
            return Ok(text);
        }
        // Held through retries and backoff: a host that keeps failing is not tried more often.
        let _slot = self.hosts.acquire(parsed.host_str().unwrap_or_default()).await;
        let text: Arc<str> = match &self.via {
            Via::Jina { base, api_key } => {
                let request = || {
                    self.upstream
                        .client()
                        .get(format!("{base}/{url}"))
                        .header(AUTHORIZATION, api_key.header())
                };
                let ((), body) = self.upstream.fetch(url, request, |_| Ok(())).await?;
                String::from_utf8_lossy(&body).into()
            }
            Via::Web(_) => {
                let request = || self.upstream.client().get(parsed.clone());
                let (format, body) = self.upstream.fetch(url, request, format_of).await?;
                match format {
                    Format::Text => String::from_utf8_lossy(&body).into(),
                    Format::Html => self.html_to_text(url, body).await?.into(),
                }
            }
        };
        self.cache.put(url.to_string(), text.clone());
        Ok(text)
    }

    /// Converts a page off the async runtime (large pages take a while); a failure or a panic of
    /// the converter is an error naming the URL (a panic's message is logged, not returned).
    async fn html_to_text(&self, url: &str, html: Vec<u8>) -> Result<String, RetrieverError> {
        let converted = tokio::task::spawn_blocking(move || {
            html2text::config::plain().string_from_read(html.as_slice(), TEXT_WIDTH)
        })
        .await;
        let reason = match converted {
            Ok(Ok(text)) => return Ok(text),
            Ok(Err(e)) => e.to_string(),
            Err(e) => {
                // Logged, not returned: a panic's message is not the page's.
                tracing::error!(url, error = %RetrieverError::task_failed("converting HTML", e));
                "the converter failed unexpectedly".to_string()
            }
        };
        Err(RetrieverError::Upstream {
            service: self.upstream.service(),
            reason: format!("{url}: converting HTML to text: {reason}"),
        })
    }
}

/// The format of a body of media type `media_type`: HTML (also when the server sends no type, as
/// browsers assume), or text (`text/*`, JSON, XML); anything else is refused.
fn format_of(media_type: Option<&str>) -> Result<Format, String> {
    match media_type {
        None | Some("text/html" | "application/xhtml+xml") => Ok(Format::Html),
        Some(t)
            if t.starts_with("text/")
                || matches!(t, "application/json" | "application/xml")
                || t.ends_with("+json")
                || t.ends_with("+xml") =>
        {
            Ok(Format::Text)
        }
        Some(t) => Err(format!("content type {t} is not text")),
    }
}

impl fmt::Debug for PageReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageReader")
            .field("via", &self.via)
            .field("upstream", &self.upstream)
            .field("hosts", &self.hosts)
            .field("cache", &self.cache)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::online::fake::{config, sample, serve, serve_on};
    use crate::online::upstream::MAX_BODY_BYTES;
    use axum::http::header::CONTENT_TYPE;
    use axum::http::{HeaderMap, StatusCode, Uri};
    use axum::response::IntoResponse;
    use axum::{Router, routing::get};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const KEY: &str = "jina-secret-9c1e";
    /// A page URL handed to the Jina fake; nothing ever connects to it (`.invalid` never resolves).
    const PAGE: &str = "https://docs.example.invalid/page?x=1";
    const HTML: &str = "<html><head><title>T</title><style>p { color: red }</style></head>\
        <body><h1>Hello</h1><p>World, <b>bold</b> text.</p><script>var hidden = 1;</script></body></html>";

    /// A fake web server: `/page.html`, `/notes.txt`, `/file.pdf` and `/huge.html`; counts requests.
    async fn fake_web() -> (String, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let router = Router::new()
            .route("/page.html", get(|| async { ([(CONTENT_TYPE, "text/html; charset=utf-8")], HTML) }))
            .route("/notes.txt", get(|| async { ([(CONTENT_TYPE, "text/plain")], "line 1\n  <not html>\n") }))
            .route("/file.pdf", get(|| async { ([(CONTENT_TYPE, "application/pdf")], "%PDF-1.7") }))
            .route(
                "/huge.html",
                get(|| async { ([(CONTENT_TYPE, "text/html")], "a".repeat(MAX_BODY_BYTES + 1)) }),
            )
            .layer(axum::middleware::from_fn(move |request, next: axum::middleware::Next| {
                counter.fetch_add(1, Ordering::SeqCst);
                next.run(request)
            }));
        (serve(router).await, calls)
    }

    /// The path and query, and the `Authorization` header, of each request to the fake Jina.
    type JinaRequests = Arc<Mutex<Vec<(String, String)>>>;

    /// A fake Jina reader answering `GET /{url}` with `status` and the page as text.
    async fn fake_jina(status: StatusCode) -> (String, JinaRequests) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let requests = seen.clone();
        let router = Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
            let authorization = headers.get("authorization").map_or("", |v| v.to_str().unwrap()).to_string();
            requests.lock().unwrap().push((uri.to_string(), authorization));
            std::future::ready((status, "Title: Page\n\nMarkdown content").into_response())
        });
        (serve(router).await, seen)
    }

    #[tokio::test]
    async fn the_jina_reader_is_used_when_a_key_is_set() {
        let (jina_url, seen) = fake_jina(StatusCode::OK).await;
        let config = OnlineConfig { jina_url: format!("{jina_url}/"), ..config() };
        let registry = Registry::new();
        let reader = PageReader::new(&config, Some(format!("{KEY}\n")), &registry).unwrap();

        let pages = reader.access(&[PAGE.to_string()]).await;

        assert_eq!(pages[0].as_deref().unwrap(), "Title: Page\n\nMarkdown content");
        let seen = seen.lock().unwrap();
        assert_eq!(*seen, [(format!("/{PAGE}"), format!("Bearer {KEY}"))]);
        let series = r#"kart_retriever_upstream_requests_total{outcome="ok",service="jina"}"#;
        assert_eq!(sample(&registry, series), 1.0);
    }

    #[tokio::test]
    async fn the_jina_key_never_shows_in_errors_or_debug_output() {
        let (jina_url, _) = fake_jina(StatusCode::FORBIDDEN).await;
        let reader =
            PageReader::new(&OnlineConfig { jina_url, ..config() }, Some(KEY.into()), &Registry::new())
                .unwrap();

        let error = reader.access(&[PAGE.to_string()]).await.remove(0).unwrap_err().to_string();

        assert_eq!(error, format!("jina: {PAGE}: HTTP 403 Forbidden (1 attempt)"));
        let debug = format!("{reader:?}");
        assert!(!debug.contains(KEY) && debug.contains("redacted"), "{debug}");
    }

    #[tokio::test]
    async fn direct_fetches_convert_html_and_pass_text_through() {
        let (web, calls) = fake_web().await;
        let registry = Registry::new();
        let reader = PageReader::new(&config(), None, &registry).unwrap();
        let urls = [format!("{web}/page.html"), format!("{web}/notes.txt"), format!("{web}/page.html")];

        let pages: Vec<Arc<str>> = reader.access(&urls[..2]).await.into_iter().map(Result::unwrap).collect();
        let again = reader.access(&urls[2..]).await.remove(0).unwrap();

        assert!(pages[0].contains("Hello") && pages[0].contains("World, bold text."), "{}", pages[0]);
        assert!(!pages[0].contains('<') && !pages[0].contains("hidden"), "{}", pages[0]);
        assert_eq!(&*pages[1], "line 1\n  <not html>\n");
        assert_eq!(again, pages[0]);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the repeat is served from the cache");
        assert_eq!(
            sample(&registry, r#"kart_retriever_cache_requests_total{backend="page",result="hit"}"#),
            1.0
        );
        let series = r#"kart_retriever_upstream_requests_total{outcome="ok",service="web"}"#;
        assert_eq!(sample(&registry, series), 2.0);
    }

    #[tokio::test]
    async fn non_text_and_oversized_pages_are_errors_naming_the_url() {
        let (web, calls) = fake_web().await;
        let reader = PageReader::new(&config(), None, &Registry::new()).unwrap();
        let urls = [format!("{web}/file.pdf"), format!("{web}/huge.html")];

        let errors: Vec<String> =
            reader.access(&urls).await.into_iter().map(|page| page.unwrap_err().to_string()).collect();

        assert_eq!(
            errors[0],
            format!("web: {}: content type application/pdf is not text (1 attempt)", urls[0])
        );
        assert!(errors[1].starts_with(&format!("web: {}: body larger than", urls[1])), "{}", errors[1]);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "refusals are not retried");
    }

    #[tokio::test]
    async fn only_http_urls_are_accepted() {
        let reader = PageReader::new(&config(), None, &Registry::new()).unwrap();

        let pages = reader.access(&["ftp://files.example/a".into(), "not a url".into()]).await;

        for (page, url) in pages.into_iter().zip(["ftp://files.example/a", "not a url"]) {
            match &*page.unwrap_err() {
                RetrieverError::BadRequest { field: "urls", reason } => {
                    assert!(reason.contains(url), "{reason}")
                }
                other => panic!("{other}"),
            }
        }
    }

    /// A server on `ip` (a loopback address) that redirects every request to `to`.
    async fn redirector(ip: &str, to: String) -> String {
        let router = Router::new().fallback(move || {
            let to = to.clone();
            async move { (StatusCode::FOUND, [(axum::http::header::LOCATION, to)]) }
        });
        serve_on(ip, router).await
    }

    #[tokio::test]
    async fn internal_addresses_are_refused_in_every_spelling_and_after_redirects() {
        let (web, calls) = fake_web().await;
        let port = web.rsplit(':').next().unwrap();
        // Only the redirector's own address is allowed; the page server behind it is not.
        let redirect = redirector("127.0.0.2", format!("{web}/page.html")).await;
        let config = OnlineConfig { allow_internal: vec!["127.0.0.2/32".into()], ..config() };
        let reader = PageReader::new(&config, None, &Registry::new()).unwrap();
        let urls: Vec<String> = [
            format!("{web}/page.html"),
            format!("http://localhost:{port}/page.html"),
            format!("http://[::ffff:127.0.0.1]:{port}/page.html"),
            format!("http://2130706433:{port}/page.html"),
            format!("http://127.1:{port}/page.html"),
            format!("http://0.0.0.0:{port}/page.html"),
            "http://169.254.169.254/latest/meta-data/".into(),
            format!("{redirect}/go"),
        ]
        .into();

        let pages = reader.access(&urls).await;

        for (i, (url, page)) in urls.iter().zip(pages).enumerate() {
            let error = page.unwrap_err().to_string();
            assert!(error.contains("internal address") && error.contains(url), "{url}: {error}");
            if matches!(i, 1 | 7) {
                assert!(error.ends_with("(1 attempt)"), "a refusal is not retried: {error}");
            }
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing reached the internal page server");
    }

    /// A server of pages of `size` bytes of text at every path, counting requests.
    async fn pages_of(size: usize) -> (String, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let router = Router::new().fallback(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(([(CONTENT_TYPE, "text/plain")], "x".repeat(size)))
        });
        (serve(router).await, calls)
    }

    #[tokio::test]
    async fn the_page_cache_stays_within_cache_bytes_and_still_hits() {
        let (web, calls) = pages_of(10_000).await;
        let url = |i: usize| format!("{web}/page/{i:03}");
        let entry = url(0).len() + 10_000 + size_of::<(String, Arc<str>)>();
        // Room for 3 pages, not 4; plenty of entries.
        let config: OnlineConfig = serde_json::from_value(serde_json::json!({
            "cache_entries": 10_000,
            "cache_bytes": 4 * entry - 1,
            "allow_internal": ["127.0.0.1"],
        }))
        .unwrap();
        let reader = PageReader::new(&config, None, &Registry::new()).unwrap();

        for i in 0..150 {
            reader.access(&[url(i)]).await.remove(0).unwrap();
            let (entries, bytes) = reader.cache.usage();
            assert!(
                bytes < 4 * entry && entries == (i + 1).min(3),
                "{entries} pages, {bytes} bytes after {i}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 150);
        // The last three pages are served from the cache, an older one is read again.
        let again: Vec<String> = (147..150).map(url).collect();
        assert!(
            reader.access(&again).await.iter().all(|page| page.as_ref().is_ok_and(|p| p.len() == 10_000))
        );
        assert_eq!(calls.load(Ordering::SeqCst), 150);
        reader.access(&[url(146)]).await.remove(0).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 151);
    }

    #[tokio::test]
    async fn a_slow_host_holds_only_its_own_slots() {
        // 127.0.0.2 takes requests and never answers; the fake web on 127.0.0.1 answers at once.
        let (seen, mut slow_requests) = tokio::sync::watch::channel(0usize);
        let seen = Arc::new(seen);
        let hanging = Router::new().fallback(move || {
            seen.send_modify(|n| *n += 1);
            std::future::pending::<&'static str>()
        });
        let slow = serve_on("127.0.0.2", hanging).await;
        let (fast, fast_calls) = fake_web().await;
        let config: OnlineConfig = serde_json::from_value(serde_json::json!({
            "concurrency": 4,
            "per_host_concurrency": 2,
            "timeout_secs": 300.0,
            "allow_internal": ["127.0.0.0/8"],
        }))
        .unwrap();
        let reader = Arc::new(PageReader::new(&config, None, &Registry::new()).unwrap());

        // Twice as many reads of the slow host as the reader has slots in all.
        let stuck: Vec<String> = (0..8).map(|i| format!("{slow}/page/{i}")).collect();
        let waiting = tokio::spawn({
            let reader = reader.clone();
            async move { reader.access(&stuck).await }
        });
        let limit = Duration::from_secs(300);
        tokio::time::timeout(limit, slow_requests.wait_for(|&n| n >= 2)).await.unwrap().unwrap();

        let urls = [format!("{fast}/page.html"), format!("{fast}/notes.txt")];
        let pages = tokio::time::timeout(limit, reader.access(&urls)).await;
        let pages = pages.expect("the fast host's pages wait behind the slow host's");

        assert!(pages.iter().all(Result::is_ok), "{pages:?}");
        assert_eq!(fast_calls.load(Ordering::SeqCst), 2);
        assert_eq!(*slow_requests.borrow(), 2, "per_host_concurrency bounds the slow host's reads");
        assert!(!waiting.is_finished());
        waiting.abort();
    }

    #[test]
    fn a_per_host_concurrency_of_zero_is_refused_naming_it() {
        let config = OnlineConfig { per_host_concurrency: 0, ..config() };
        let error = PageReader::new(&config, None, &Registry::new()).unwrap_err().to_string();
        assert_eq!(error, "online.per_host_concurrency: must be at least 1, got 0");
    }

    #[tokio::test]
    async fn a_request_reads_each_page_once_and_within_its_byte_budget() {
        let (web, calls) = fake_web().await;
        let page = format!("{web}/notes.txt");
        let size = "line 1\n  <not html>\n".len();
        let config = OnlineConfig { access_budget_bytes: 3 * size, cache_entries: 0, ..config() };
        let reader = PageReader::new(&config, None, &Registry::new()).unwrap();

        let pages = reader.access(&vec![page.clone(); 5]).await;

        assert_eq!(calls.load(Ordering::SeqCst), 1, "the same URL is fetched once per request");
        assert!(pages[..3].iter().all(|p| p.as_ref().is_ok_and(|p| p.len() == size)));
        for error in pages[3..].iter().map(|p| p.as_ref().unwrap_err().to_string()) {
            assert!(error.contains("online.access_budget_bytes") && error.contains(&page), "{error}");
        }
    }
}
