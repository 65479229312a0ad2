//! Weight sync: how a new policy version reaches the rollout engines.
//!
//! - in process: the embedded engine gets copies of the tensors (with LoRA, of the adapters
//!   alone: it generates with them over the base it keeps);
//! - HTTP pull: the trainer writes `weights/v{version}.safetensors` (with LoRA, the adapters
//!   alone, which workers' embedded engines apply over the base they keep) and serves it at
//!   `/weights/{version}`. Every `/rollout` request names its version and that URL, so a worker
//!   that is behind (started late, restarted, or missed a push behind a Service) fetches it
//!   before generating; pushing `POST /weights {version, url}` to each rollout URL is an
//!   optimisation that loads one worker per URL ahead of the requests, and a push that fails (a
//!   worker restarting) is only logged;
//! - SGLang or vLLM from disk: the trainer writes a Hugging Face folder to a shared path and every
//!   replica behind the configured URLs (see [`crate::replicas`]) loads it as the version, each
//!   tried up to three times: SGLang through `/update_weights_from_disk`, vLLM paused, reloading
//!   in place and resumed ([`VllmEngine::reload_from_disk`]). A replica that still fails fails the
//!   publish, and with it the step: no step trains on trajectories of replicas left on different
//!   weights. With LoRA, SGLang and vLLM get the adapters alone, a PEFT folder of megabytes
//!   loaded over the base they keep ([`SglangEngine::load_adapter`], [`VllmEngine::load_adapter`]);
//!   the broadcasts get the adapters merged into the base.

use kart_model::CausalLm;

use kart_model::ModelError;
use kart_tokenizer::file::FileError;

use kart_model::save_pretrained;

use crate::broadcast::Broadcaster;
use crate::replicas::{self, ResolveError};
use kart_core::config::lora::LoraConfig;
use kart_core::config::retry::RetryPolicy;
use kart_core::config::train::InferenceServer;
use kart_core::engine::{EngineError, LoadWeightsError};
use kart_core::wire::WeightSource;
use kart_http::token::Token;
use kart_model::EmbeddedEngine;
use kart_model::save_safetensors;
use kart_rollout::engines::sglang::SglangEngine;
use kart_rollout::engines::vllm::VllmEngine;
use serde_json::json;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A failed sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("writing weights v{version}: {source}")]
    Write { version: i64, source: ModelError },
    #[error("{url}: {reason}")]
    Remote { url: String, reason: String },
    /// The worker behind `url` runs an engine (SGLang, vLLM) that takes no weights through it:
    /// nothing would ever bring that engine to the trainer's weights.
    #[error(
        "{url}: {reason}: weight_sync.kind = http_pull needs workers of the embedded engine (sglang_disk or sglang_broadcast keeps SGLang servers on the trainer's weights, vllm_disk or vllm_broadcast vLLM servers)"
    )]
    Rejected { url: String, reason: String },
    #[error("embedded engine: {0}")]
    Engine(#[from] LoadWeightsError),
    #[error("finding the inference replicas: {0}")]
    Resolve(#[from] ResolveError),
    #[error("weights v{version} reached {updated} of {total} {server} replicas: {failures}")]
    Replicas { server: &'static str, version: i64, updated: usize, total: usize, failures: String },
    #[error("weight-update group {name}: {reason}")]
    Group { name: String, reason: String },
}

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Engines that hold the new version (for HTTP pull: the workers a push reached).
    pub replicas: usize,
    /// Bytes of the weights written or copied.
    pub bytes: u64,
}

/// Retries of one replica's update before the publish fails.
pub(crate) const UPDATE_RETRY: RetryPolicy = RetryPolicy { retries: 2, backoff_ms: 1000 };
/// How long one replica may take to load a version.
pub(crate) const UPDATE_TIMEOUT: Duration = Duration::from_secs(600);

fn bytes_of(tensors: &[(String, tch::Tensor)]) -> u64 {
    tensors.iter().map(|(_, t)| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64).sum()
}

/// What a disk publish writes to its folder for the servers to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Folder {
    /// A Hugging Face model folder: the policy (with LoRA, its adapters merged in).
    Model,
    /// A PEFT folder of the policy's adapters, which the servers load over the base they keep.
    Adapter,
}

impl Folder {
    /// The folder the servers get of `policy`.
    fn of(policy: &CausalLm) -> Folder {
        match policy.lora() {
            Some(_) => Folder::Adapter,
            None => Folder::Model,
        }
    }

    /// Writes `policy` (its base read from `source_dir`) to `folder`; returns the tensors' bytes.
    fn write(self, policy: &CausalLm, folder: &Path, source_dir: &Path) -> Result<u64, ModelError> {
        match (self, policy.lora()) {
            (Folder::Adapter, Some(adapters)) => {
                adapters.save(folder, &source_dir.to_string_lossy())?;
                Ok(bytes_of(&adapters.named_tensors()))
            }
            _ => {
                let tensors = policy.merged_tensors();
                save_pretrained(folder, policy.config(), &tensors, Some(source_dir), policy.kind())?;
                Ok(bytes_of(&tensors))
            }
        }
    }
}

/// The newest published weights files, served at `/weights/{version}`.
#[derive(Debug, Clone, Default)]
pub struct WeightStore(Arc<RwLock<VecDeque<(i64, PathBuf)>>>);

impl WeightStore {
    /// The file of `version`, if it is among the published ones kept.
    pub fn file(&self, version: i64) -> Option<PathBuf> {
        let files = self.0.read().expect("weight store lock");
        files.iter().find(|(v, _)| *v == version).map(|(_, p)| p.clone())
    }

    /// Adds `version`, keeping the newest `keep` (at least one); returns the files let go.
    pub(crate) fn publish(&self, version: i64, path: PathBuf, keep: usize) -> Vec<PathBuf> {
        let mut files = self.0.write().expect("weight store lock");
        files.retain(|(v, _)| *v != version);
        files.push_back((version, path));
        let excess = files.len().saturating_sub(keep.max(1));
        files.drain(..excess).map(|(_, p)| p).collect()
    }
}

/// The URL of `version`'s weights on the trainer at `advertise_url`.
pub fn weights_url(advertise_url: &str, version: i64) -> String {
    format!("{}/weights/{version}", advertise_url.trim_end_matches('/'))
}

/// Where workers pull this trainer's weights, and which attempt of the run it is: a resumed run
/// numbers its versions again from its checkpoint, so every source names its attempt and a
/// worker holding another attempt's weights loads them whatever their number.
#[derive(Debug, Clone, PartialEq)]
pub struct PullFrom {
    /// The trainer's advertised base URL.
    pub advertise_url: String,
    /// This attempt's id, new for every trainer process.
    pub run: String,
    /// With LoRA, the adapters' settings: each version is the adapters alone.
    pub lora: Option<LoraConfig>,
}

impl PullFrom {
    /// The weights served at `advertise_url` by a new attempt: whole models, or with `lora` the
    /// adapters of those settings alone.
    pub fn new(advertise_url: String, lora: Option<LoraConfig>) -> Self {
        PullFrom { advertise_url, run: format!("{:016x}", rand::random::<u64>()), lora }
    }

    /// The weight source of `version`: the body of `POST /weights` and the `weights` of a
    /// `/rollout` request.
    pub fn source(&self, version: i64) -> WeightSource {
        WeightSource {
            version,
            url: Some(weights_url(&self.advertise_url, version)),
            path: None,
            run: Some(self.run.clone()),
            lora: self.lora.clone(),
        }
    }
}

/// How weights reach the engines.
pub enum Publisher {
    /// The in-process pool's engine.
    InProcess(EmbeddedEngine),
    /// Workers pull from the trainer's `/weights/{version}`.
    HttpPull {
        workers: Vec<String>,
        from: PullFrom,
        dir: PathBuf,
        store: WeightStore,
        /// Versions served at once: those that requests in flight may name.
        keep: usize,
        client: reqwest::Client,
    },
    /// SGLang or vLLM servers reload a Hugging Face folder from a shared path: every replica
    /// behind `urls`, SGLang aborting the requests in flight when `interrupt`.
    Disk { server: InferenceServer, path: PathBuf, urls: Vec<String>, source_dir: PathBuf, interrupt: bool },
    /// SGLang or vLLM servers receive the tensors broadcast from this rank.
    Broadcast(Broadcaster),
}

impl Publisher {
    /// An HTTP-pull publisher writing into `dir` and serving the newest `keep` versions, its
    /// pushes to `workers` bearing `token`.
    pub fn http_pull(
        workers: Vec<String>,
        from: PullFrom,
        dir: PathBuf,
        store: WeightStore,
        keep: usize,
        token: Option<&Token>,
    ) -> Self {
        Publisher::HttpPull { workers, from, dir, store, keep, client: client(token) }
    }

    /// A publisher for `server`s writing folders under `path`.
    pub fn disk(
        server: InferenceServer,
        path: PathBuf,
        urls: Vec<String>,
        source_dir: PathBuf,
        interrupt: bool,
    ) -> Self {
        Publisher::Disk { server, path, urls, source_dir, interrupt }
    }

    /// Publishes the policy's weights as `version` (with LoRA, its adapters alone where the engine
    /// keeps the base, else merged into it); returns when every engine uses them (for HTTP pull:
    /// when they are served and one worker per rollout URL that took the push uses them).
    pub async fn publish(&self, policy: &CausalLm, version: i64) -> Result<Published, SyncError> {
        match self {
            Publisher::InProcess(engine) => {
                // With LoRA the engine keeps the base and takes the adapters alone.
                let named = match policy.lora() {
                    Some(adapters) => adapters.named_tensors(),
                    None => policy.named_tensors(),
                };
                let tensors: Vec<_> =
                    tch::no_grad(|| named.into_iter().map(|(n, t)| (n, t.detach().copy())).collect());
                let bytes = bytes_of(&tensors);
                engine.load_tensors(tensors, version).await?;
                Ok(Published { replicas: 1, bytes })
            }
            Publisher::HttpPull { workers, from, dir, store, keep, client } => {
                let file = dir.join(format!("v{version}.safetensors"));
                let bytes = write_safetensors(policy, from.lora.is_some(), &file)
                    .map_err(|source| SyncError::Write { version, source })?;
                for old in store.publish(version, file, *keep) {
                    let _ = std::fs::remove_file(old);
                }
                let body = json!(from.source(version));
                let calls = workers
                    .iter()
                    .map(|w| post(client, format!("{}/weights", w.trim_end_matches('/')), &body));
                let mut replicas = 0;
                for pushed in futures::future::join_all(calls).await {
                    match pushed {
                        Ok(()) => replicas += 1,
                        Err(rejected @ SyncError::Rejected { .. }) => return Err(rejected),
                        Err(error) => {
                            tracing::warn!(version, %error, "pushing weights failed; the worker loads them on its next request");
                        }
                    }
                }
                Ok(Published { replicas, bytes })
            }
            Publisher::Disk { server, path, urls, source_dir, interrupt } => {
                let folder = path.join(format!("v{version}"));
                let kind = Folder::of(policy);
                let bytes = kind
                    .write(policy, &folder, source_dir)
                    .map_err(|source| SyncError::Write { version, source })?;
                let replicas = replicas::resolve(urls).await?;
                let served = folder.display().to_string();
                let updates =
                    replicas.iter().map(|r| update_from_disk(*server, r, kind, &served, version, *interrupt));
                let outcomes = futures::future::join_all(updates).await;
                let failures: Vec<String> = replicas
                    .iter()
                    .zip(outcomes)
                    .filter_map(|(replica, outcome)| outcome.err().map(|e| format!("{replica}: {e}")))
                    .collect();
                if replicas.is_empty() || !failures.is_empty() {
                    let total = replicas.len();
                    return Err(SyncError::Replicas {
                        server: server.name(),
                        version,
                        updated: total - failures.len(),
                        total,
                        failures: if total == 0 { "none found".into() } else { failures.join("; ") },
                    });
                }
                // Keep the folder the servers now use and the one before (a server may still read it).
                if let Ok(entries) = std::fs::read_dir(path) {
                    for entry in entries.flatten() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        let old = name.strip_prefix('v').and_then(|v| v.parse::<i64>().ok());
                        if old.is_some_and(|v| v < version - 1) {
                            let _ = std::fs::remove_dir_all(entry.path());
                        }
                    }
                }
                Ok(Published { replicas: replicas.len(), bytes })
            }
            Publisher::Broadcast(broadcaster) => broadcaster.publish(policy, version).await,
        }
    }
}

impl Publisher {
    /// The method's name, as metrics label it.
    pub fn method(&self) -> &'static str {
        match self {
            Publisher::InProcess(_) => "in_process",
            Publisher::HttpPull { .. } => "http_pull",
            Publisher::Disk { server: InferenceServer::Sglang, .. } => "sglang_disk",
            Publisher::Disk { server: InferenceServer::Vllm, .. } => "vllm_disk",
            Publisher::Broadcast(broadcaster) => broadcaster.method(),
        }
    }

    /// Brings the SGLang or vLLM replicas `behind` (restarted, or new) to `version`, the one published
    /// last; returns how many took it. Other methods have nothing to catch up: workers pulling
    /// over HTTP load a request's version before generating.
    pub async fn catch_up(
        &self,
        policy: &CausalLm,
        version: i64,
        behind: &[String],
    ) -> Result<usize, SyncError> {
        match self {
            Publisher::InProcess(_) | Publisher::HttpPull { .. } => Ok(0),
            Publisher::Broadcast(broadcaster) => Ok(broadcaster.catch_up(policy, version).await?.replicas),
            Publisher::Disk { server, path, interrupt, .. } => {
                let kind = Folder::of(policy);
                let folder = path.join(format!("v{version}")).display().to_string();
                let mut caught_up = 0;
                for replica in behind {
                    // A look before the last catch-up may name a replica already brought up.
                    let held = match server {
                        InferenceServer::Sglang => {
                            SglangEngine::new(replica, UPDATE_TIMEOUT).weight_version().await
                        }
                        InferenceServer::Vllm => {
                            VllmEngine::control(replica, UPDATE_TIMEOUT).weight_version().await
                        }
                    };
                    if held.is_ok_and(|held| held == Some(version)) {
                        continue;
                    }
                    update_from_disk(*server, replica, kind, &folder, version, *interrupt)
                        .await
                        .map_err(|e| SyncError::Remote { url: replica.clone(), reason: e.to_string() })?;
                    caught_up += 1;
                }
                Ok(caught_up)
            }
        }
    }
}

/// Loads the `kind` folder at `path` on the `server` at `replica` as `version` (SGLang aborting
/// its requests in flight when `interrupt`), retrying per [`UPDATE_RETRY`].
async fn update_from_disk(
    server: InferenceServer,
    replica: &str,
    kind: Folder,
    path: &str,
    version: i64,
    interrupt: bool,
) -> Result<(), EngineError> {
    let mut delays = UPDATE_RETRY.backoff().take(UPDATE_RETRY.retries as usize);
    loop {
        let updated = match (server, kind) {
            (InferenceServer::Sglang, Folder::Model) => {
                let engine = SglangEngine::new(replica, UPDATE_TIMEOUT);
                engine.update_weights_from_disk(path, version, interrupt).await
            }
            (InferenceServer::Sglang, Folder::Adapter) => {
                SglangEngine::new(replica, UPDATE_TIMEOUT).load_adapter(path, version, interrupt).await
            }
            (InferenceServer::Vllm, Folder::Model) => {
                VllmEngine::control(replica, UPDATE_TIMEOUT).reload_from_disk(path, version).await
            }
            (InferenceServer::Vllm, Folder::Adapter) => {
                VllmEngine::control(replica, UPDATE_TIMEOUT).load_adapter(path, version).await
            }
        };
        let Err(error) = updated else { return Ok(()) };
        let Some(delay) = delays.next() else { return Err(error) };
        let server = server.name();
        tracing::warn!(replica, version, %error, server, "updating a replica failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

/// A client of kart's workers bearing `token`.
fn client(token: Option<&Token>) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .default_headers(Token::client_headers(token))
        .build()
        .expect("an HTTP client")
}

/// Writes the policy's adapters (PEFT's names, in their own kind) when `adapters` and it has
/// them, else the model with any adapters merged, to `file`; returns the tensors' bytes.
fn write_safetensors(policy: &CausalLm, adapters: bool, file: &Path) -> Result<u64, ModelError> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(FileError::io(dir))?;
    }
    let (tensors, kind) = match policy.lora().filter(|_| adapters) {
        Some(lora) => (lora.named_tensors(), tch::Kind::Float),
        None => (policy.merged_tensors(), policy.kind()),
    };
    save_safetensors(file, tensors.iter().map(|(n, t)| (n.as_str(), t)), kind)?;
    Ok(bytes_of(&tensors))
}

/// Posts `body` to `url`; a `409 Conflict` (a worker whose engine loads no weights through it) is
/// [`SyncError::Rejected`].
async fn post(client: &reqwest::Client, url: String, body: &serde_json::Value) -> Result<(), SyncError> {
    let error = |reason: String| SyncError::Remote { url: url.clone(), reason };
    let response = client.post(&url).json(body).send().await.map_err(|e| error(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        let reason = format!("answered {status}: {}", response.text().await.unwrap_or_default());
        return Err(match status {
            reqwest::StatusCode::CONFLICT => SyncError::Rejected { url, reason },
            _ => error(reason),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_serves_the_newest_versions_it_keeps() {
        let store = WeightStore::default();
        let file = |v: i64| PathBuf::from(format!("v{v}.safetensors"));
        assert!(store.publish(1, file(1), 2).is_empty());
        assert!(store.publish(2, file(2), 2).is_empty());
        assert_eq!(store.publish(3, file(3), 2), [file(1)]);
        assert_eq!((store.file(1), store.file(2), store.file(3)), (None, Some(file(2)), Some(file(3))));
        assert_eq!(store.publish(4, file(4), 0), [file(2), file(3)], "the newest is always kept");
        assert_eq!(weights_url("http://t:8002/", 4), "http://t:8002/weights/4");
    }

    /// Serves `router` on a free port of 127.0.0.1 for the rest of the test: its URL.
    async fn serve(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        url
    }

    /// A fake SGLang server taking every `/update_weights_from_disk`; the bodies it received.
    async fn fake_sglang() -> (String, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let handler = move |axum::Json(body): axum::Json<serde_json::Value>| {
            record.lock().unwrap().push(body);
            async { axum::Json(json!({"success": true, "message": "ok", "num_paused_requests": 0})) }
        };
        let router = axum::Router::new().route("/update_weights_from_disk", axum::routing::post(handler));
        (serve(router).await, seen)
    }

    #[tokio::test]
    async fn sglang_disk_reaches_every_replica_and_reports_what_it_moved() {
        let model = kart_testing::model("tiny-qwen2");
        let policy = CausalLm::load(&model, tch::Device::Cpu).unwrap();
        let ((a, a_seen), (b, b_seen)) = (fake_sglang().await, fake_sglang().await);
        let dir = tempfile::tempdir().unwrap();
        let publisher =
            Publisher::disk(InferenceServer::Sglang, dir.path().to_path_buf(), vec![a, b], model, true);
        let published = publisher.publish(&policy, 7).await.unwrap();
        assert_eq!(published.replicas, 2);
        let folder = dir.path().join("v7");
        for seen in [a_seen, b_seen] {
            let expected = json!({"model_path": folder, "weight_version": "7", "abort_all_requests": true});
            assert_eq!(*seen.lock().unwrap(), [expected]);
        }
        // The tensors' bytes: the written file less its header.
        let file = std::fs::metadata(folder.join("model.safetensors")).unwrap().len();
        assert!(published.bytes > 0 && published.bytes < file, "{published:?}, file {file}");
        assert!(file - published.bytes < 1 << 20, "{published:?}, file {file}");
    }

    /// A fake vLLM server (its RL routes) recording each call's path and body; with `fail`, every
    /// `reload_weights` answers 500.
    async fn fake_vllm(fail: bool) -> (String, Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>) {
        use axum::http::{StatusCode, Uri};
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let handler = move |uri: Uri, body: axum::body::Bytes| {
            let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            let reload = uri.path() == "/collective_rpc";
            record.lock().unwrap().push((uri.to_string(), body));
            async move {
                match reload && fail {
                    true => {
                        (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": "no such folder"})))
                    }
                    false => (StatusCode::OK, axum::Json(json!({"results": [null]}))),
                }
            }
        };
        let router = axum::Router::new().fallback(handler);
        (serve(router).await, seen)
    }

    #[tokio::test]
    async fn vllm_disk_reloads_every_replica_between_a_pause_and_a_resume() {
        let model = kart_testing::model("tiny-qwen2");
        let policy = CausalLm::load(&model, tch::Device::Cpu).unwrap();
        let ((a, a_seen), (b, b_seen)) = (fake_vllm(false).await, fake_vllm(true).await);
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("v3").display().to_string();
        let calls = |version: &str| {
            vec![
                ("/pause?mode=wait".to_string(), json!({})),
                (
                    "/collective_rpc".into(),
                    json!({"method": "reload_weights", "kwargs": {"weights_path": folder}}),
                ),
                ("/update_weight_version".into(), json!({"new_version": version})),
                ("/resume".into(), json!({})),
            ]
        };
        let publisher =
            Publisher::disk(InferenceServer::Vllm, dir.path().into(), vec![a.clone()], model.clone(), false);
        assert_eq!(publisher.publish(&policy, 3).await.unwrap().replicas, 1);
        assert_eq!(*a_seen.lock().unwrap(), calls("3"));
        assert_eq!(publisher.method(), "vllm_disk");

        // A replica whose reload keeps failing is resumed each time and fails the publish, named.
        a_seen.lock().unwrap().clear();
        let publisher =
            Publisher::disk(InferenceServer::Vllm, dir.path().into(), vec![a, b.clone()], model, false);
        let error = publisher.publish(&policy, 3).await.unwrap_err().to_string();
        assert!(error.starts_with("weights v3 reached 1 of 2 vLLM replicas"), "{error}");
        assert!(error.contains(&b) && error.contains("no such folder"), "{error}");
        let attempt = [calls("3")[0].clone(), calls("3")[1].clone(), calls("3")[3].clone()];
        let tries = 1 + UPDATE_RETRY.retries as usize;
        let attempts: Vec<_> = std::iter::repeat_n(attempt, tries).flatten().collect();
        assert_eq!(*b_seen.lock().unwrap(), attempts, "paused, reload failed, resumed; each try");
        assert_eq!(*a_seen.lock().unwrap(), calls("3"));
    }

    #[tokio::test]
    async fn a_lora_policy_publishes_its_adapters_alone_to_vllm_and_to_http_pull() {
        let model = kart_testing::model("tiny-qwen2");
        let mut policy = CausalLm::load(&model, tch::Device::Cpu).unwrap();
        let lora = kart_core::config::lora::LoraConfig { r: 2, ..Default::default() };
        policy.attach_lora(&lora, 0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (vllm, vllm_seen) = fake_vllm(false).await;
        let publisher =
            Publisher::disk(InferenceServer::Vllm, dir.path().into(), vec![vllm], model.clone(), false);
        let published = publisher.publish(&policy, 4).await.unwrap();
        let folder = dir.path().join("v4");
        let files: std::collections::BTreeSet<_> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(files, ["adapter_config.json", "adapter_model.safetensors"].map(String::from).into());
        let adapters = policy.lora().unwrap().named_tensors();
        assert_eq!(published.bytes, adapters.iter().map(|(_, t)| t.numel() as u64 * 4).sum::<u64>());
        let model_bytes = bytes_of(&policy.named_tensors());
        assert!(published.bytes * 10 < model_bytes, "{published:?}");
        let load = json!({"lora_name": kart_core::config::lora::POLICY_ADAPTER, "lora_path": folder, "load_inplace": true});
        let seen = vllm_seen.lock().unwrap().clone();
        let routes: Vec<&str> = seen.iter().map(|(route, _)| route.as_str()).collect();
        assert_eq!(
            routes,
            ["/pause?mode=wait", "/v1/load_lora_adapter", "/update_weight_version", "/resume"]
        );
        assert_eq!(seen[1].1, load);

        // Workers pulling over HTTP get the adapters alone, and their sources say so; without
        // LoRA in the sources, the merged model.
        let pull_dir = dir.path().join("pull");
        let from = PullFrom::new("http://127.0.0.1:1".into(), Some(lora.clone()));
        assert_eq!(from.source(5).lora, Some(lora));
        let publisher =
            Publisher::http_pull(Vec::new(), from, pull_dir.clone(), WeightStore::default(), 2, None);
        assert_eq!(publisher.publish(&policy, 5).await.unwrap().bytes, published.bytes);
        let file = tch::Tensor::read_safetensors(pull_dir.join("v5.safetensors")).unwrap();
        let names = |t: &[(String, tch::Tensor)]| {
            t.iter().map(|(n, _)| n.clone()).collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(names(&file), names(&adapters));
        let from = PullFrom::new("http://127.0.0.1:1".into(), None);
        let publisher =
            Publisher::http_pull(Vec::new(), from, pull_dir.clone(), WeightStore::default(), 2, None);
        assert_eq!(publisher.publish(&policy, 6).await.unwrap().bytes, model_bytes, "the merged model");
    }

    #[test]
    fn every_attempt_names_itself_in_its_sources() {
        let (a, b) =
            (PullFrom::new("http://t:8002/".into(), None), PullFrom::new("http://t:8002/".into(), None));
        assert_ne!(a.run, b.run);
        let source = a.source(4);
        assert_eq!(source.url.as_deref(), Some("http://t:8002/weights/4"));
        assert_eq!((source.version, source.run), (4, Some(a.run)));
    }
}
