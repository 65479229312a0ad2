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
//!   goes away does not abandon it halfway.

use futures::StreamExt;
use kart_core::engine::{LoadWeights, LoadWeightsError};
use kart_core::wire::{InvalidField, WeightSource};
use prometheus::IntCounterVec;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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
    /// A loader for `engine`, which holds `version`; counts loads in `loads` (labels trigger,
    /// outcome).
    pub fn new(engine: Arc<dyn LoadWeights>, version: i64, loads: IntCounterVec) -> Arc<Self> {
        Arc::new(WeightLoader {
            engine,
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
        let result = fetch_and_load(self.engine.as_ref(), &source).await;
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

/// Reads the safetensors file of `source` (downloading it first when it is a URL) into the engine.
async fn fetch_and_load(engine: &dyn LoadWeights, source: &WeightSource) -> Result<(), LoadError> {
    source.validate()?;
    let (file, downloaded) = match (&source.url, &source.path) {
        (Some(url), _) => (download(url).await?, true),
        (None, Some(path)) if path.is_dir() => (path.join("model.safetensors"), false),
        (None, Some(path)) => (path.clone(), false),
        (None, None) => unreachable!("a valid source has a url or a path"),
    };
    let result = engine.load_weights(file.clone(), source.version).await;
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

/// Fetches a safetensors file into a temporary file.
async fn download(url: &str) -> Result<PathBuf, LoadError> {
    let error = |reason: String| LoadError::Fetch { url: url.to_string(), reason };
    let response = reqwest::get(url).await.map_err(|e| error(e.to_string()))?;
    if !response.status().is_success() {
        return Err(error(format!("answered {}", response.status())));
    }
    let file = std::env::temp_dir().join(format!(
        "kart-weights-{}-{}.safetensors",
        std::process::id(),
        rand::random::<u64>()
    ));
    // Streamed to the file: a large policy never sits in memory twice.
    let written = async {
        let mut out = tokio::fs::File::create(&file).await.map_err(|e| e.to_string())?;
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            out.write_all(&chunk.map_err(|e| e.to_string())?).await.map_err(|e| e.to_string())?;
        }
        out.flush().await.map_err(|e| e.to_string())
    };
    if let Err(reason) = written.await {
        let _ = tokio::fs::remove_file(&file).await;
        return Err(error(reason));
    }
    Ok(file)
}

#[cfg(test)]
pub(crate) mod testing {
    //! A weights server and a scripted engine that loads weights, for the tests of loading.

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

    /// Serves the fixture's weights at every path (or answers `status` without them when it is
    /// not 200) on loopback; returns the base URL and the count of requests.
    pub async fn serve(status: StatusCode) -> (String, Arc<AtomicUsize>) {
        let bytes = std::fs::read(kart_testing::model("tiny-qwen2").join("model.safetensors")).unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let app = axum::Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let body = if status == StatusCode::OK { bytes.clone() } else { Vec::new() };
            async move { (status, body) }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, requests)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{engine, serve};
    use super::*;
    use crate::metrics::RolloutMetrics;
    use axum::http::StatusCode;
    use prometheus::Registry;

    fn loader() -> Arc<WeightLoader> {
        WeightLoader::new(engine(), 0, RolloutMetrics::new(&Registry::new()).weight_loads)
    }

    fn source(url: &str, version: i64) -> WeightSource {
        WeightSource { version, url: Some(format!("{url}/weights/{version}")), path: None, run: None }
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
}
