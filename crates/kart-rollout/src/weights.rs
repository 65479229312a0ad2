//! How a worker's engine gets new policy weights (the embedded engine; SGLang and vLLM load
//! their own): pushed (`POST /weights`) or pulled (a
//! `/rollout` request naming weights the engine does not hold), one load at a time.
//!
//! - A pull loads only when the engine is behind the version asked for, or holds weights another
//!   trainer attempt published (a run resumed from a checkpoint numbers its versions again, so
//!   workers a push did not reach would keep the lost attempt's newer-numbered weights). A
//!   request for an older version of the same attempt (a late retry) runs on the newer weights:
//!   its tokens carry the version that produced them, so the trainer still measures the
//!   staleness.
//! - A push loads the version it names, even an older one: the trainer is authoritative (a run
//!   resumed from an earlier checkpoint rolls the worker back).
//! - Loads are single-flight: requests behind the same version wait for one load and share its
//!   failure; a later request tries again. A load runs in a task of its own, so a requester that
//!   goes away does not abandon it halfway. Requests the engine's weights already serve never
//!   wait for a load.
//! - Downloads keep to the worker's `weight_download` limits ([`Downloader`]): a server that does
//!   not connect, goes quiet or sends too much fails the load of that version only; requests for
//!   another version load it once the failed download has given up.

use futures::StreamExt;
use kart_core::config::ConfigError;
use kart_core::config::rollout::WeightDownloadConfig;
use kart_core::engine::{LoadWeights, LoadWeightsError};
use kart_core::wire::{InvalidField, WeightSource};
use kart_http::token::Token;
use prometheus::IntCounterVec;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// A failed load.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error("{url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("{path}: not a safetensors file: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("weights v{version}: {reason}")]
    Engine { version: i64, reason: String },
}

/// What made a worker load weights (the `trigger` label of `kart_rollout_weight_loads_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `POST /weights`.
    Push,
    /// A `/rollout` request naming a newer version.
    Pull,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Push => "push",
            Trigger::Pull => "pull",
        }
    }
}

/// A finished load that failed, remembered for the requests that waited for it.
struct Failure {
    /// Loads finished before it.
    attempt: u64,
    version: i64,
    error: LoadError,
}

/// An engine's weights: which version it holds and how that changes.
pub struct WeightLoader {
    engine: Arc<dyn LoadWeights>,
    downloader: Downloader,
    version: AtomicI64,
    /// The attempt that published the weights held (`None`: the model the worker started with).
    run: std::sync::RwLock<Option<String>>,
    /// Held while a load runs; the last load's failure.
    flight: Mutex<Option<Failure>>,
    /// Loads finished so far.
    finished: AtomicU64,
    /// Loads by trigger and outcome.
    loads: IntCounterVec,
}

impl WeightLoader {
    /// A loader for `engine`, which holds `version`, downloading with `downloader`; counts loads
    /// in `loads` (labels trigger, outcome).
    pub fn new(
        engine: Arc<dyn LoadWeights>,
        version: i64,
        downloader: Downloader,
        loads: IntCounterVec,
    ) -> Arc<Self> {
        Arc::new(WeightLoader {
            engine,
            downloader,
            version: AtomicI64::new(version),
            run: std::sync::RwLock::new(None),
            flight: Mutex::new(None),
            finished: AtomicU64::new(0),
            loads,
        })
    }

    /// The policy version the engine holds.
    pub fn version(&self) -> i64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether the engine holds `source.version` or a newer version of the same attempt.
    fn holds(&self, source: &WeightSource) -> bool {
        let run = self.run.read().expect("weights run lock");
        self.version() >= source.version && source.run.as_ref().is_none_or(|r| run.as_ref() == Some(r))
    }

    /// Makes the engine hold at least `source.version` of `source.run` (a pull): returns at once
    /// when it does, else after the one load of that version, shared with the requests waiting
    /// for it.
    pub async fn ensure(self: &Arc<Self>, source: &WeightSource) -> Result<(), LoadError> {
        if self.holds(source) {
            return Ok(());
        }
        self.spawn(source.clone(), Trigger::Pull).await
    }

    /// Loads `source` whatever version the engine holds (a push).
    pub async fn load(self: &Arc<Self>, source: &WeightSource) -> Result<(), LoadError> {
        self.spawn(source.clone(), Trigger::Push).await
    }

    async fn spawn(self: &Arc<Self>, source: WeightSource, trigger: Trigger) -> Result<(), LoadError> {
        let (this, version) = (self.clone(), source.version);
        tokio::spawn(async move { this.single_flight(source, trigger).await })
            .await
            .unwrap_or_else(|e| Err(LoadError::Engine { version, reason: e.to_string() }))
    }

    async fn single_flight(&self, source: WeightSource, trigger: Trigger) -> Result<(), LoadError> {
        let queued = self.finished.load(Ordering::Acquire);
        let mut last_failure = self.flight.lock().await;
        if trigger == Trigger::Pull {
            if self.holds(&source) {
                return Ok(());
            }
            // A load of this version failed while this request waited: its answer is this one's.
            if let Some(f) =
                last_failure.as_ref().filter(|f| f.version == source.version && f.attempt >= queued)
            {
                return Err(f.error.clone());
            }
        }
        let result = fetch_and_load(self.engine.as_ref(), &self.downloader, &source).await;
        let attempt = self.finished.fetch_add(1, Ordering::AcqRel);
        let outcome = match &result {
            Ok(()) => {
                *self.run.write().expect("weights run lock") = source.run.clone();
                self.version.store(source.version, Ordering::Release);
                *last_failure = None;
                tracing::info!(version = source.version, trigger = trigger.label(), "loaded new weights");
                "ok"
            }
            Err(error) => {
                tracing::warn!(version = source.version, trigger = trigger.label(), %error, "loading weights failed");
                *last_failure = Some(Failure { attempt, version: source.version, error: error.clone() });
                "error"
            }
        };
        self.loads.with_label_values(&[trigger.label(), outcome]).inc();
        result
    }
}

/// Reads the safetensors file of `source` (downloading it first when it is a URL) into the engine:
/// a whole model, or with `source.lora` the adapters alone.
async fn fetch_and_load(
    engine: &dyn LoadWeights,
    downloader: &Downloader,
    source: &WeightSource,
) -> Result<(), LoadError> {
    source.validate()?;
    let (file, downloaded) = match (&source.url, &source.path) {
        (Some(url), _) => (downloader.download(url).await?, true),
        (None, Some(path)) if path.is_dir() => (path.join("model.safetensors"), false),
        (None, Some(path)) => (path.clone(), false),
        (None, None) => unreachable!("a valid source has a url or a path"),
    };
    let result = engine.load_weights(file.clone(), source.version, source.lora.clone()).await;
    if downloaded {
        let _ = tokio::fs::remove_file(&file).await;
    }
    result.map_err(|error| match (error, &source.url) {
        (LoadWeightsError::Read(reason), Some(url)) => {
            LoadError::Fetch { url: url.clone(), reason: format!("not a safetensors file: {reason}") }
        }
        (LoadWeightsError::Read(reason), None) => LoadError::Read { path: file, reason },
        (LoadWeightsError::Rejected(reason), _) => LoadError::Engine { version: source.version, reason },
    })
}

/// Fetches weights files over HTTP within a worker's [`WeightDownloadConfig`].
pub struct Downloader {
    client: reqwest::Client,
    limits: WeightDownloadConfig,
}

impl Downloader {
    /// A downloader keeping to `limits`, bearing `token` (the trainer serves weights to its
    /// bearer only); a limit out of range is an error naming its field (`weight_download.*`).
    pub fn new(limits: WeightDownloadConfig, token: Option<&Token>) -> Result<Self, ConfigError> {
        limits.validate().map_err(|e| e.within("weight_download"))?;
        let client = reqwest::Client::builder()
            .default_headers(Token::client_headers(token))
            .connect_timeout(Duration::from_secs_f64(limits.connect_timeout_secs))
            .read_timeout(Duration::from_secs_f64(limits.idle_timeout_secs))
            .build()
            .expect("an HTTP client");
        Ok(Downloader { client, limits })
    }

    /// Fetches the safetensors file at `url` into a temporary file, streamed (a large policy
    /// never sits in memory); the file is gone again when the download fails.
    async fn download(&self, url: &str) -> Result<PathBuf, LoadError> {
        let error = |reason: String| LoadError::Fetch { url: url.to_string(), reason };
        let response = self.client.get(url).send().await.map_err(|e| error(self.reason(&e)))?;
        if !response.status().is_success() {
            return Err(error(format!("answered {}", response.status())));
        }
        let max = self.limits.max_bytes;
        if let Some(announced) = response.content_length().filter(|&n| n > max) {
            return Err(error(format!(
                "weight_download.max_bytes = {max}: the server announces {announced} bytes"
            )));
        }
        let file = std::env::temp_dir().join(format!(
            "kart-weights-{}-{}.safetensors",
            std::process::id(),
            rand::random::<u64>()
        ));
        let written = async {
            let mut out = tokio::fs::File::create(&file).await.map_err(|e| e.to_string())?;
            let mut chunks = response.bytes_stream();
            let mut received = 0u64;
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk.map_err(|e| self.reason(&e))?;
                received = received.saturating_add(chunk.len() as u64);
                if received > max {
                    return Err(format!("weight_download.max_bytes = {max}: the body grew past it"));
                }
                out.write_all(&chunk).await.map_err(|e| e.to_string())?;
            }
            out.flush().await.map_err(|e| e.to_string())
        };
        if let Err(reason) = written.await {
            let _ = tokio::fs::remove_file(&file).await;
            return Err(error(reason));
        }
        Ok(file)
    }

    /// Why a request failed, naming the limit that failed it.
    fn reason(&self, e: &reqwest::Error) -> String {
        let limits = &self.limits;
        match (e.is_timeout(), e.is_connect()) {
            (true, true) => format!(
                "weight_download.connect_timeout_secs = {}: no connection within it",
                limits.connect_timeout_secs
            ),
            (true, false) => format!(
                "weight_download.idle_timeout_secs = {}: no data received for that long",
                limits.idle_timeout_secs
            ),
            (false, _) => e.to_string(),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Weights servers and a scripted engine that loads weights, for the tests of loading.

    use super::*;
    use crate::fake::{Reply, ScriptedEngine};
    use axum::http::StatusCode;
    use kart_tokenizer::Tokenizer;
    use std::sync::atomic::AtomicUsize;

    /// A scripted engine on the fixture model's tokenizer that answers every call, at version 0.
    pub fn engine() -> Arc<ScriptedEngine> {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        Arc::new(ScriptedEngine::new(tokenizer, |_, _| Reply::Text("<answer> Paris </answer>".into())))
    }

    /// The fixture model's weights file.
    pub fn fixture_weights() -> Vec<u8> {
        std::fs::read(kart_testing::model("tiny-qwen2").join("model.safetensors")).unwrap()
    }

    /// Serves `app` on loopback; returns its base URL.
    pub async fn serve_app(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// Serves the fixture's weights at every path (or answers `status` without them when it is
    /// not 200) on loopback; returns the base URL and the count of requests.
    pub async fn serve(status: StatusCode) -> (String, Arc<AtomicUsize>) {
        let bytes = fixture_weights();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let app = axum::Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let body = if status == StatusCode::OK { bytes.clone() } else { Vec::new() };
            async move { (status, body) }
        });
        (serve_app(app).await, requests)
    }

    /// A server that takes every request and never answers; returns the base URL and the count
    /// of requests.
    pub async fn serve_silence() -> (String, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let app = axum::Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            futures::future::pending::<()>()
        });
        (serve_app(app).await, requests)
    }

    /// Waits until `count` reaches `n`, failing after 300 s.
    pub async fn until_count(count: &AtomicUsize, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while count.load(Ordering::SeqCst) < n {
            assert!(std::time::Instant::now() < deadline, "{n} requests did not arrive within 300 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{engine, fixture_weights, serve, serve_app, serve_silence, until_count};
    use super::*;
    use crate::metrics::RolloutMetrics;
    use axum::body::{Body, Bytes};
    use axum::http::StatusCode;
    use prometheus::Registry;
    use std::time::Instant;

    fn loader() -> Arc<WeightLoader> {
        loader_within(WeightDownloadConfig::default())
    }

    fn loader_within(limits: WeightDownloadConfig) -> Arc<WeightLoader> {
        let loads = RolloutMetrics::new(&Registry::new()).weight_loads;
        WeightLoader::new(engine(), 0, Downloader::new(limits, None).unwrap(), loads)
    }

    fn idle_after(secs: f64) -> WeightDownloadConfig {
        WeightDownloadConfig { idle_timeout_secs: secs, ..WeightDownloadConfig::default() }
    }

    fn source(url: &str, version: i64) -> WeightSource {
        WeightSource {
            version,
            url: Some(format!("{url}/weights/{version}")),
            path: None,
            run: None,
            lora: None,
        }
    }

    fn of_run(source: WeightSource, run: &str) -> WeightSource {
        WeightSource { run: Some(run.into()), ..source }
    }

    fn loads(loader: &WeightLoader, trigger: &str, outcome: &str) -> u64 {
        loader.loads.with_label_values(&[trigger, outcome]).get()
    }

    #[tokio::test]
    async fn concurrent_pulls_of_a_version_load_it_once() {
        let (url, requests) = serve(StatusCode::OK).await;
        let loader = loader();
        let wanted = source(&url, 3);
        let results = futures::future::join_all((0..8).map(|_| loader.ensure(&wanted))).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!((loader.version(), requests.load(Ordering::SeqCst)), (3, 1));
        assert_eq!((loads(&loader, "pull", "ok"), loads(&loader, "pull", "error")), (1, 0));
        // A late request for an older version runs on the newer weights: nothing to load.
        loader.ensure(&source(&url, 2)).await.unwrap();
        assert_eq!((loader.version(), requests.load(Ordering::SeqCst)), (3, 1));
    }

    #[tokio::test]
    async fn a_failed_load_is_shared_by_its_waiters_and_tried_again_later() {
        let (url, requests) = serve(StatusCode::NOT_FOUND).await;
        let loader = loader();
        let wanted = source(&url, 1);
        let results = futures::future::join_all((0..4).map(|_| loader.ensure(&wanted))).await;
        for result in &results {
            let error = result.as_ref().unwrap_err();
            assert!(matches!(error, LoadError::Fetch { .. }), "{error}");
            assert!(error.to_string().contains("404"), "{error}");
        }
        assert_eq!((loader.version(), requests.load(Ordering::SeqCst)), (0, 1));
        assert_eq!(loads(&loader, "pull", "error"), 1);
        assert!(loader.ensure(&wanted).await.is_err());
        assert_eq!(requests.load(Ordering::SeqCst), 2, "a later request tries again");
    }

    #[tokio::test]
    async fn a_push_loads_the_version_it_names_even_an_older_one() {
        let (url, requests) = serve(StatusCode::OK).await;
        let loader = loader();
        loader.ensure(&source(&url, 5)).await.unwrap();
        loader.load(&source(&url, 4)).await.unwrap();
        assert_eq!((loader.version(), requests.load(Ordering::SeqCst)), (4, 2));
        assert_eq!((loads(&loader, "push", "ok"), loads(&loader, "pull", "ok")), (1, 1));
    }

    #[tokio::test]
    async fn a_pull_from_another_trainer_attempt_loads_whatever_its_version() {
        let (url, requests) = serve(StatusCode::OK).await;
        let loader = loader();
        loader.ensure(&of_run(source(&url, 5), "a")).await.unwrap();
        loader.ensure(&of_run(source(&url, 4), "a")).await.unwrap();
        assert_eq!((loader.version(), requests.load(Ordering::SeqCst)), (5, 1), "a late retry of attempt a");
        // Attempt b resumed from an earlier checkpoint: its version 3 replaces a's 5.
        loader.ensure(&of_run(source(&url, 3), "b")).await.unwrap();
        assert_eq!((loader.version(), requests.load(Ordering::SeqCst)), (3, 2));
        loader.ensure(&of_run(source(&url, 3), "b")).await.unwrap();
        loader.ensure(&source(&url, 2)).await.unwrap();
        assert_eq!(requests.load(Ordering::SeqCst), 2, "held: the same attempt, or a source naming none");
    }

    /// Asserts that `result` failed within `bound` of `started` naming `limit`.
    fn assert_failed_on(result: Result<(), LoadError>, started: Instant, bound: Duration, limit: &str) {
        let elapsed = started.elapsed();
        let error = result.unwrap_err().to_string();
        assert!(error.contains(limit), "{error}");
        assert!(elapsed < bound, "failed after {elapsed:?}, more than {bound:?}: {error}");
    }

    #[tokio::test]
    async fn a_server_that_goes_quiet_fails_the_download_after_the_idle_timeout() {
        // Headers and a first chunk, then nothing.
        let stalling = axum::Router::new().fallback(|| async {
            let first =
                futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{\"a\"")) });
            Body::from_stream(first.chain(futures::stream::pending()))
        });
        let (silent, _) = serve_silence().await;
        let loader = loader_within(idle_after(0.3));
        for url in [serve_app(stalling).await, silent] {
            let started = Instant::now();
            let result = loader.ensure(&source(&url, 1)).await;
            assert!(started.elapsed() >= Duration::from_millis(300), "{url}: failed before the timeout");
            // Short of the default 30 s, whatever a loaded machine adds to 0.3 s.
            assert_failed_on(
                result,
                started,
                Duration::from_secs(25),
                "weight_download.idle_timeout_secs = 0.3",
            );
        }
        assert_eq!((loader.version(), loads(&loader, "pull", "error")), (0, 2));
    }

    #[tokio::test]
    async fn a_server_that_does_not_accept_fails_the_download_after_the_connect_timeout() {
        // A listener whose accept queue is full: the kernel drops further connection attempts.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        while let Ok(stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            queued.push(stream);
            assert!(queued.len() < 64, "the accept queue never filled");
        }
        let limits = WeightDownloadConfig { connect_timeout_secs: 0.3, ..WeightDownloadConfig::default() };
        let started = Instant::now();
        let result = loader_within(limits).ensure(&source(&format!("http://{addr}"), 1)).await;
        // Short of the default 10 s, whatever a loaded machine adds to 0.3 s.
        assert_failed_on(
            result,
            started,
            Duration::from_secs(9),
            "weight_download.connect_timeout_secs = 0.3",
        );
    }

    #[tokio::test]
    async fn downloads_larger_than_max_bytes_are_refused() {
        let bytes = fixture_weights();
        let size = bytes.len() as u64;
        let limits = |max_bytes| WeightDownloadConfig { max_bytes, ..WeightDownloadConfig::default() };
        // Announced: refused before the body is read.
        let (url, _) = serve(StatusCode::OK).await;
        let error = loader_within(limits(size - 1)).ensure(&source(&url, 1)).await.unwrap_err().to_string();
        let expected = format!("weight_download.max_bytes = {}: the server announces {size} bytes", size - 1);
        assert!(error.contains(&expected), "{error}");
        // Streamed without a length: cut off once past the limit.
        let chunked = axum::Router::new().fallback(move || {
            let chunks: Vec<Result<Bytes, std::io::Error>> =
                bytes.chunks(4096).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            async move { Body::from_stream(futures::stream::iter(chunks)) }
        });
        let url = serve_app(chunked).await;
        let error = loader_within(limits(size - 1)).ensure(&source(&url, 1)).await.unwrap_err().to_string();
        assert!(
            error.contains(&format!("weight_download.max_bytes = {}: the body grew past it", size - 1)),
            "{error}"
        );
        // Exactly the limit is within it.
        let loader = loader_within(limits(size));
        loader.ensure(&source(&url, 1)).await.unwrap();
        assert_eq!(loader.version(), 1);
    }

    #[tokio::test]
    async fn a_hanging_download_holds_up_neither_the_held_version_nor_the_next() {
        let (good, _) = serve(StatusCode::OK).await;
        let (silent, hanging) = serve_silence().await;
        // Long enough that the hanging download is still waiting when checked below, however
        // slowly a loaded machine gets there.
        let loader = loader_within(idle_after(10.0));
        loader.ensure(&source(&good, 1)).await.unwrap();
        let stuck = tokio::spawn({
            let loader = loader.clone();
            let wanted = source(&silent, 2);
            async move { loader.ensure(&wanted).await }
        });
        until_count(&hanging, 1).await;
        // The held version needs no load: it proceeds at once.
        loader.ensure(&source(&good, 1)).await.unwrap();
        assert!(!stuck.is_finished(), "the download of version 2 still hangs");
        // Version 3 waits for version 2's download to give up, then loads; only version 2 fails.
        loader.ensure(&source(&good, 3)).await.unwrap();
        let error = stuck.await.unwrap().unwrap_err().to_string();
        assert!(error.contains("weight_download.idle_timeout_secs = 10"), "{error}");
        assert_eq!(loader.version(), 3);
        assert_eq!((loads(&loader, "pull", "ok"), loads(&loader, "pull", "error")), (2, 1));
    }

    #[test]
    fn limits_out_of_range_are_named() {
        let error = Downloader::new(idle_after(-1.0), None).err().unwrap().to_string();
        assert_eq!(error, "weight_download.idle_timeout_secs = -1: must be a positive number of seconds");
    }
}
