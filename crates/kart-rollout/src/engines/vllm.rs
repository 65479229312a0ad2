//! A vLLM server as the rollout engine, through its OpenAI-compatible `POST /v1/completions` with the
//! prompt as token ids.
//!
//! The generated ids and their log-probabilities both come from `choices[0].logprobs`: with
//! `return_tokens_as_token_ids` every entry of `tokens` is `"token_id:{id}"`, paired with
//! `token_logprobs`; `text` is never re-tokenised. `logprobs: 0` asks for the sampled token's
//! log-probability only; stop strings stay in the output and special tokens are not skipped.
//!
//! What the log-probabilities are depends on the server's `--logprobs-mode` (vLLM V1):
//! - `raw_logprobs` (the default): `log softmax(logits)` of the model, before temperature, penalties
//!   and top-k/top-p — kart's `log softmax(logits / T)` only when T = 1 (or greedy);
//! - `processed_logprobs`: after temperature *and* top-k/top-p, i.e. renormalised over the kept
//!   tokens — kart's convention only when top-k and top-p are off.
//!
//! So: sample at temperature 1 on a default server, or start vLLM with
//! `--logprobs-mode processed_logprobs` and keep top-k/top-p off.
//!
//! Weights: vLLM's weight-transfer engine (`--weight-transfer-config '{"backend": "nccl"}'`) and
//! its RL routes (`VLLM_SERVER_DEV_MODE=1`, `vllm/entrypoints/serve/dev/rlhf/api_router.py` of
//! vLLM 0.32): [`VllmEngine::init_weight_transfer_engine`] makes the server's workers join the
//! trainer's NCCL communicator; a publish is [`VllmEngine::pause`] (the requests in flight finish
//! first), [`VllmEngine::start_weight_update`], one [`VllmEngine::update_weights`] per bucket of
//! broadcast tensors, [`VllmEngine::finish_weight_update`] with the version, and
//! [`VllmEngine::resume`]. From disk, on any device: [`VllmEngine::reload_from_disk`]
//! (`reload_weights` through `/collective_rpc`, then `/update_weight_version`).
//!
//! LoRA: a trainer of adapters publishes only them, [`VllmEngine::load_adapter`] loading the PEFT
//! folder in place under [`POLICY_ADAPTER`] (`/v1/load_lora_adapter` with `load_inplace`, on a
//! server started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) between a
//! pause and a resume, with the version as for a full reload. Requests name the adapter as their
//! `model` from the moment the server lists it (`GET /v1/models`, read again whenever the
//! server's version changes), the served model before.
//!
//! Policy versions: before each request the client reads the server's `weight_version`
//! (`GET /weight_info`); a paused server holds new requests until the update finished, so that
//! is the version of the weights a request is sampled with, save one admitted while an update
//! was paused (labelled one version older than it ran). A server without the RL routes (no dev
//! mode) reports none: its outputs carry the version recorded by [`VllmEngine::set_version`].

use super::TensorMeta;
use super::http::HttpEngine;
use futures::TryFutureExt;
use futures::future::BoxFuture;
use kart_core::config::lora::POLICY_ADAPTER;
use kart_core::engine::{Engine, EngineError, EngineOutput};
use kart_core::generation::FinishReason;
use kart_core::generation::Generation;
use kart_core::generation::GenerationRequest;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A vLLM OpenAI-compatible server reached over HTTP.
#[derive(Debug)]
pub struct VllmEngine {
    http: HttpEngine,
    model: String,
    /// The server answered that it has no `/weight_info` (not in dev mode).
    unversioned: AtomicBool,
    /// What requests name as their `model`, and the server's version when it was chosen: the
    /// trainer's adapter once the server lists it, else the served model.
    target: Mutex<Option<(Option<i64>, String)>>,
}

/// Where a vLLM server's workers meet the trainer's NCCL communicator (`init_info` of the `nccl`
/// weight-transfer backend): rank 0 serves its store at `master_address:master_port`.
#[derive(Debug, Clone)]
pub struct TransferInit<'a> {
    pub master_address: &'a str,
    pub master_port: u16,
    /// The rank of the server's first worker.
    pub rank_offset: usize,
    pub world_size: usize,
}

impl VllmEngine {
    /// A client for the server at `base_url` (e.g. `http://vllm:8000`, with or without `/v1`) serving
    /// `model` (its `--served-model-name`), with a per-request `timeout`, at policy version 0.
    pub fn new(base_url: &str, model: &str, timeout: Duration) -> Self {
        let base = base_url.trim_end_matches('/').trim_end_matches("/v1");
        VllmEngine {
            http: HttpEngine::new("vllm", base, timeout),
            model: model.to_string(),
            unversioned: AtomicBool::new(false),
            target: Mutex::new(None),
        }
    }

    /// A client of the server's weight-transfer routes only.
    pub fn control(base_url: &str, timeout: Duration) -> Self {
        VllmEngine::new(base_url, "", timeout)
    }

    /// The server's base URL (without `/v1`).
    pub fn url(&self) -> &str {
        self.http.base()
    }

    /// The policy version last recorded.
    pub fn version(&self) -> i64 {
        self.http.version()
    }

    /// Records that the server now holds the weights of policy `version`.
    pub fn set_version(&self, version: i64) {
        self.http.set_version(version);
    }

    /// The server's workers, each one rank of a weight-transfer group (`world_size` of
    /// `GET /get_world_size`: tensor x pipeline x data parallel).
    pub async fn world_size(&self) -> Result<usize, EngineError> {
        let answer = self.http.get("/get_world_size").await?;
        let size = answer["world_size"].as_u64().filter(|&n| n > 0);
        let url = format!("GET {}/get_world_size", self.url());
        let size =
            size.ok_or_else(|| self.http.unavailable(&url, "malformed response: no positive `world_size`"))?;
        Ok(size as usize)
    }

    /// The policy version the server's weights have (`weight_version` of `GET /weight_info`);
    /// `None` when it is not an integer (`null`: the weights it started with).
    pub async fn weight_version(&self) -> Result<Option<i64>, EngineError> {
        let answer = self.http.get("/weight_info").await?;
        Ok(match &answer["weight_version"] {
            Value::String(v) => v.parse().ok(),
            v => v.as_i64(),
        })
    }

    /// Makes the server's workers join the trainer's communicator
    /// (`POST /init_weight_transfer_engine`): worker `i` becomes rank `rank_offset + i`.
    /// Returns once they joined, that is once every rank did.
    pub async fn init_weight_transfer_engine(&self, init: &TransferInit<'_>) -> Result<(), EngineError> {
        let init_info = json!({
            "master_address": init.master_address,
            "master_port": init.master_port,
            "rank_offset": init.rank_offset,
            "world_size": init.world_size,
        });
        self.http.post("/init_weight_transfer_engine", &json!({ "init_info": init_info })).await?;
        Ok(())
    }

    /// Pauses generation once the requests in flight finished (`POST /pause?mode=wait`); new
    /// requests wait for [`VllmEngine::resume`].
    pub async fn pause(&self) -> Result<(), EngineError> {
        self.http.post("/pause?mode=wait", &json!({})).await.map(drop)
    }

    /// Prepares the workers for new weights (`POST /start_weight_update`).
    pub async fn start_weight_update(&self) -> Result<(), EngineError> {
        self.http.post("/start_weight_update", &json!({})).await.map(drop)
    }

    /// Makes the workers receive `tensors`, broadcast from rank 0 one after another, and load
    /// them (`POST /update_weights`, unpacked). Returns once every tensor arrived.
    pub async fn update_weights(&self, tensors: &[TensorMeta]) -> Result<(), EngineError> {
        let update_info = json!({
            "names": tensors.iter().map(|t| &t.name).collect::<Vec<_>>(),
            "dtype_names": tensors.iter().map(|t| t.dtype).collect::<Vec<_>>(),
            "shapes": tensors.iter().map(|t| &t.shape).collect::<Vec<_>>(),
            "packed": false,
        });
        self.http.post("/update_weights", &json!({ "update_info": update_info })).await.map(drop)
    }

    /// Ends the update; the weights are policy `version` (`POST /finish_weight_update`).
    /// Records `version`.
    pub async fn finish_weight_update(&self, version: i64) -> Result<(), EngineError> {
        let body = json!({ "weight_version": version.to_string() });
        self.http.post("/finish_weight_update", &body).await?;
        self.set_version(version);
        Ok(())
    }

    /// Resumes generation (`POST /resume`).
    pub async fn resume(&self) -> Result<(), EngineError> {
        self.http.post("/resume", &json!({})).await.map(drop)
    }

    /// Loads the Hugging Face folder `path` (a path the server sees) as policy `version`: pauses
    /// once the requests in flight finished, reloads the weights in place on every worker
    /// (`reload_weights` through `POST /collective_rpc`), sets the version
    /// (`POST /update_weight_version`) and resumes, also when the reload failed. Records
    /// `version`.
    pub async fn reload_from_disk(&self, path: &str, version: i64) -> Result<(), EngineError> {
        let reload = json!({"method": "reload_weights", "kwargs": {"weights_path": path}});
        self.paused_update(self.http.post("/collective_rpc", &reload).map_ok(drop), version).await
    }

    /// Loads the PEFT folder `path` (a path the server sees) as policy `version`, in place under
    /// [`POLICY_ADAPTER`] (`POST /v1/load_lora_adapter`), between a pause and a resume as
    /// [`VllmEngine::reload_from_disk`] does. Records `version`.
    pub async fn load_adapter(&self, path: &str, version: i64) -> Result<(), EngineError> {
        let load = json!({"lora_name": POLICY_ADAPTER, "lora_path": path, "load_inplace": true});
        // Its success is plain text, not JSON.
        self.paused_update(self.http.post_for_status("/v1/load_lora_adapter", &load), version).await
    }

    /// Pauses once the requests in flight finished, makes the `update`, sets the server's
    /// version (`POST /update_weight_version`) and resumes, also when the update failed.
    /// Records `version`.
    async fn paused_update(
        &self,
        update: impl Future<Output = Result<(), EngineError>>,
        version: i64,
    ) -> Result<(), EngineError> {
        self.pause().await?;
        let updated = match update.await {
            Ok(()) => {
                self.http.post("/update_weight_version", &json!({"new_version": version.to_string()})).await
            }
            Err(error) => Err(error),
        };
        let resumed = self.resume().await;
        updated?;
        resumed?;
        self.set_version(version);
        Ok(())
    }

    /// The models the server serves (`id`s of `GET /v1/models`): the served model and the LoRA
    /// adapters loaded.
    pub async fn models(&self) -> Result<Vec<String>, EngineError> {
        self.http.models().await
    }

    /// The version a request sent now is sampled with (the server's, else the one recorded), and
    /// the `model` it names.
    async fn current(&self) -> Result<(i64, String), EngineError> {
        if self.unversioned.load(Ordering::Relaxed) {
            return Ok((self.version(), self.model.clone()));
        }
        let reported = match self.weight_version().await {
            Ok(reported) => reported,
            // No RL routes: a 404 (a server not in dev mode) is the only 4xx of a GET; such a
            // server takes no weights from a trainer, so its requests name the served model.
            Err(EngineError::Invalid(_)) => {
                self.unversioned.store(true, Ordering::Relaxed);
                return Ok((self.version(), self.model.clone()));
            }
            Err(error) => return Err(error),
        };
        if let Some(version) = reported {
            self.set_version(version);
        }
        let chosen = self.target.lock().expect("target lock").clone();
        let model = match chosen {
            Some((at, model)) if at == reported => model,
            _ => {
                let adapted = self.models().await?.iter().any(|m| m == POLICY_ADAPTER);
                let model = if adapted { POLICY_ADAPTER.to_owned() } else { self.model.clone() };
                *self.target.lock().expect("target lock") = Some((reported, model.clone()));
                model
            }
        };
        Ok((self.version(), model))
    }

    /// The `/v1/completions` body for `request`, sampled from `model`.
    fn payload(&self, request: &GenerationRequest, model: &str) -> Value {
        let sampling = &request.sampling;
        let mut payload = json!({
            "model": model,
            "prompt": request.input_ids,
            "max_tokens": request.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": if sampling.top_k > 0 { sampling.top_k } else { -1 },
            "stop": request.stop,
            "stop_token_ids": request.stop_token_ids,
            "ignore_eos": request.ignore_eos,
            "skip_special_tokens": false,
            "include_stop_str_in_output": true,
            "logprobs": 0,
            "return_tokens_as_token_ids": true,
        });
        if let Some(seed) = sampling.seed {
            // vLLM accepts seeds in the int64 range.
            payload["seed"] = json!(seed & i64::MAX as u64);
        }
        payload
    }

    /// The generation in a `/v1/completions` answer (made at policy `version`), or why there is none.
    fn parse(&self, url: &str, answer: &Value, version: i64) -> Result<EngineOutput, EngineError> {
        let malformed = |what: String| self.http.malformed(url, what);
        let choice = &answer["choices"][0];
        let finish_reason = match choice["finish_reason"].as_str() {
            Some("stop") => FinishReason::Stop,
            Some("length") => FinishReason::Length,
            Some("abort") => return Err(EngineError::Aborted { engine: self.http.name().into() }),
            _ => {
                let found = &choice["finish_reason"];
                return Err(malformed(format!(
                    "`choices[0].finish_reason` is {found}, not stop, length or abort"
                )));
            }
        };
        let logprobs = &choice["logprobs"];
        let (Some(tokens), Some(values)) =
            (logprobs["tokens"].as_array(), logprobs["token_logprobs"].as_array())
        else {
            return Err(malformed("no `choices[0].logprobs.tokens` and `token_logprobs` lists".into()));
        };
        if tokens.len() != values.len() {
            let (t, v) = (tokens.len(), values.len());
            return Err(malformed(format!("{t} `choices[0].logprobs.tokens` but {v} `token_logprobs`")));
        }
        let token_ids = tokens
            .iter()
            .enumerate()
            .map(|(i, token)| {
                token
                    .as_str()
                    .and_then(|t| t.strip_prefix("token_id:"))
                    .and_then(|id| id.parse().ok())
                    .ok_or_else(|| {
                        malformed(format!(
                            "`choices[0].logprobs.tokens[{i}]` is {token}, not \"token_id:<id>\""
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let logprobs = values
            .iter()
            .enumerate()
            .map(|(i, value)| {
                value.as_f64().map(|lp| lp as f32).ok_or_else(|| {
                    malformed(format!("`choices[0].logprobs.token_logprobs[{i}]` is {value}, not a number"))
                })
            })
            .collect::<Result<Vec<f32>, _>>()?;
        Ok(EngineOutput::new(Generation { token_ids, logprobs, finish_reason }, version))
    }
}

impl Engine for VllmEngine {
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
        Box::pin(async move {
            let (version, model) = self.current().await?;
            let answer = self.http.post("/v1/completions", &self.payload(&request, &model)).await?;
            self.parse(&format!("{}/v1/completions", self.url()), &answer, version)
        })
    }

    fn name(&self) -> &str {
        self.http.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::http::{dead_url, serve};
    use axum::Json;
    use axum::http::StatusCode;
    use axum::routing::post;
    use kart_core::generation::SamplingParams;
    use std::sync::{Arc, Mutex};

    type Requests = Arc<Mutex<Vec<Value>>>;

    /// A fake vLLM server answering `/v1/completions` with `status` and `body`, recording requests.
    async fn fake(status: StatusCode, body: String) -> (String, Requests) {
        let requests = Requests::default();
        let seen = requests.clone();
        let handler = move |Json(request): Json<Value>| {
            let (seen, body) = (seen.clone(), body.clone());
            async move {
                seen.lock().unwrap().push(request);
                (status, [("content-type", "application/json")], body)
            }
        };
        (serve(axum::Router::new().route("/v1/completions", post(handler))).await, requests)
    }

    /// A completion shaped like vLLM's (fields it sends that kart ignores included).
    fn answer(finish_reason: Value) -> String {
        json!({
            "id": "cmpl-5b0c1f2e9d8a4c7b",
            "object": "text_completion",
            "created": 1_735_689_600,
            "model": "qwen",
            "choices": [{
                "index": 0,
                "text": "<answer>Paris</answer><|im_end|>",
                "logprobs": {
                    "text_offset": [0, 1, 7, 8, 13, 15, 21],
                    "token_logprobs": [-0.25, -0.0625, -1.5, -0.003, -0.5, -0.125, -0.01],
                    "tokens": ["token_id:27", "token_id:9217", "token_id:29", "token_id:59604",
                               "token_id:522", "token_id:9217", "token_id:151645"],
                    "top_logprobs": [{"token_id:27": -0.25}, {"token_id:9217": -0.0625}, {"token_id:29": -1.5},
                                     {"token_id:59604": -0.003}, {"token_id:522": -0.5},
                                     {"token_id:9217": -0.125}, {"token_id:151645": -0.01}]
                },
                "finish_reason": finish_reason,
                "stop_reason": null,
                "token_ids": null,
                "prompt_logprobs": null,
                "prompt_token_ids": null
            }],
            "service_tier": null,
            "system_fingerprint": null,
            "usage": {"prompt_tokens": 4, "total_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": null},
            "kv_transfer_params": null
        })
        .to_string()
    }

    fn request() -> GenerationRequest {
        GenerationRequest {
            input_ids: vec![9707, 11, 1879, 0],
            sampling: SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 50, seed: Some(7) },
            max_new_tokens: 128,
            stop: vec!["</answer>".into()],
            stop_token_ids: vec![],
            ignore_eos: true,
        }
    }

    fn engine(url: &str) -> VllmEngine {
        VllmEngine::new(url, "qwen", Duration::from_secs(60))
    }

    #[tokio::test]
    async fn generate_sends_token_ids_and_reads_token_id_logprobs() {
        let (url, requests) = fake(StatusCode::OK, answer(json!("stop"))).await;
        let engine = engine(&format!("{url}/v1/"));
        engine.set_version(9);
        let output = engine.generate(request()).await.unwrap();
        assert_eq!(output.generation.token_ids, [27, 9217, 29, 59604, 522, 9217, 151645]);
        assert_eq!(output.generation.logprobs, [-0.25, -0.0625, -1.5, -0.003, -0.5, -0.125, -0.01]);
        assert_eq!(output.generation.finish_reason, FinishReason::Stop);
        assert_eq!(output.version, 9);
        let expected = json!({
            "model": "qwen", "prompt": [9707, 11, 1879, 0], "max_tokens": 128, "temperature": 1.0,
            "top_p": 1.0, "top_k": 50, "seed": 7, "stop": ["</answer>"], "stop_token_ids": [],
            "ignore_eos": true, "skip_special_tokens": false, "include_stop_str_in_output": true,
            "logprobs": 0, "return_tokens_as_token_ids": true
        });
        assert_eq!(requests.lock().unwrap()[0], expected);
    }

    /// A fake vLLM server in dev mode: `/weight_info` reports `version`, `/v1/models` lists
    /// `models`; the `model` each completion named is recorded.
    async fn dev_mode(
        version: Arc<Mutex<Value>>,
        models: Arc<Mutex<Vec<&'static str>>>,
    ) -> (String, Requests) {
        let named = Requests::default();
        let record = named.clone();
        let router = axum::Router::new()
            .route(
                "/v1/completions",
                post(move |Json(request): Json<Value>| {
                    record.lock().unwrap().push(request["model"].clone());
                    async { ([("content-type", "application/json")], answer(json!("stop"))) }
                }),
            )
            .route(
                "/weight_info",
                axum::routing::get(move || {
                    let reported = version.lock().unwrap().clone();
                    async move { Json(json!({ "weight_version": reported })) }
                }),
            )
            .route(
                "/v1/models",
                axum::routing::get(move || {
                    let data: Vec<Value> = models
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|id| json!({"id": id, "object": "model"}))
                        .collect();
                    async move { Json(json!({"object": "list", "data": data})) }
                }),
            );
        (serve(router).await, named)
    }

    #[tokio::test]
    async fn outputs_carry_the_version_the_server_reports() {
        let version = Arc::new(Mutex::new(json!(null)));
        let (url, _) = dev_mode(version.clone(), Arc::new(Mutex::new(vec!["qwen"]))).await;
        let engine = engine(&url);
        engine.set_version(2);
        assert_eq!(engine.generate(request()).await.unwrap().version, 2, "null: the version recorded");
        *version.lock().unwrap() = json!("7");
        assert_eq!(engine.generate(request()).await.unwrap().version, 7);
        assert_eq!(engine.weight_version().await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn requests_name_the_trainers_adapter_from_the_version_it_came_with() {
        let version = Arc::new(Mutex::new(json!(null)));
        let models = Arc::new(Mutex::new(vec!["qwen"]));
        let (url, named) = dev_mode(version.clone(), models.clone()).await;
        let engine = engine(&url);
        engine.generate(request()).await.unwrap();
        // Loaded under the same version: not looked for again until the version changes.
        models.lock().unwrap().push(POLICY_ADAPTER);
        engine.generate(request()).await.unwrap();
        *version.lock().unwrap() = json!("0");
        assert_eq!(engine.generate(request()).await.unwrap().version, 0);
        *version.lock().unwrap() = json!("1");
        assert_eq!(engine.generate(request()).await.unwrap().version, 1);
        assert_eq!(
            *named.lock().unwrap(),
            [json!("qwen"), json!("qwen"), json!(POLICY_ADAPTER), json!(POLICY_ADAPTER)]
        );
    }

    #[tokio::test]
    async fn an_adapter_loads_in_place_between_a_pause_and_a_resume() {
        let calls = Requests::default();
        let record = |route: &'static str| {
            let calls = calls.clone();
            post(move |Json(body): Json<Value>| {
                calls.lock().unwrap().push(json!({"route": route, "body": body}));
                async move {
                    use axum::response::IntoResponse;
                    match route {
                        // vLLM's answer: plain text.
                        "/v1/load_lora_adapter" => {
                            format!("Success: LoRA adapter '{POLICY_ADAPTER}' added successfully.")
                                .into_response()
                        }
                        _ => Json(json!({})).into_response(),
                    }
                }
            })
        };
        let mut router = axum::Router::new();
        for route in ["/pause", "/v1/load_lora_adapter", "/update_weight_version", "/resume"] {
            router = router.route(route, record(route));
        }
        let engine = VllmEngine::control(&serve(router).await, Duration::from_secs(60));
        engine.load_adapter("/w/v3", 3).await.unwrap();
        assert_eq!(engine.version(), 3);
        let load = json!({"lora_name": POLICY_ADAPTER, "lora_path": "/w/v3", "load_inplace": true});
        assert_eq!(
            *calls.lock().unwrap(),
            [
                json!({"route": "/pause", "body": {}}),
                json!({"route": "/v1/load_lora_adapter", "body": load}),
                json!({"route": "/update_weight_version", "body": {"new_version": "3"}}),
                json!({"route": "/resume", "body": {}}),
            ]
        );
    }

    #[tokio::test]
    async fn length_abort_and_top_k_off() {
        let (url, requests) = fake(StatusCode::OK, answer(json!("length"))).await;
        let mut greedy = request();
        greedy.sampling = SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, seed: None };
        assert_eq!(
            engine(&url).generate(greedy).await.unwrap().generation.finish_reason,
            FinishReason::Length
        );
        let sent = requests.lock().unwrap()[0].clone();
        assert_eq!(sent["top_k"], -1);
        assert!(sent.get("seed").is_none());

        let (url, _) = fake(StatusCode::OK, answer(json!("abort"))).await;
        assert_eq!(
            engine(&url).generate(request()).await.unwrap_err(),
            EngineError::Aborted { engine: "vllm".into() }
        );
    }

    #[tokio::test]
    async fn errors_are_sorted_by_status() {
        let (url, _) = fake(StatusCode::SERVICE_UNAVAILABLE, String::new()).await;
        let err = engine(&url).generate(request()).await.unwrap_err();
        assert!(
            matches!(&err, EngineError::Unavailable { engine, reason } if engine == "vllm" && reason.contains("503")),
            "{err:?}"
        );

        let body = json!({"error": {"message": "This model's maximum context length is 4096 tokens.", "type": "BadRequestError", "param": null, "code": 400}});
        let (url, _) = fake(StatusCode::BAD_REQUEST, body.to_string()).await;
        match engine(&url).generate(request()).await.unwrap_err() {
            EngineError::Invalid(message) => {
                assert!(message.contains("maximum context length is 4096"), "{message}")
            }
            other => panic!("expected Invalid, got {other:?}"),
        }

        let err = engine(&dead_url()).generate(request()).await.unwrap_err();
        assert!(matches!(err, EngineError::Unavailable { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn malformed_answers_are_unavailable_naming_the_field() {
        let reason = |e: EngineError| match e {
            EngineError::Unavailable { reason, .. } => reason,
            other => panic!("expected Unavailable, got {other:?}"),
        };
        let (url, _) = fake(StatusCode::OK, "not json".into()).await;
        assert!(reason(engine(&url).generate(request()).await.unwrap_err()).contains("malformed JSON"));

        let mut odd: Value = serde_json::from_str(&answer(json!("stop"))).unwrap();
        odd["choices"][0]["logprobs"]["tokens"][1] = json!("<answer>");
        let (url, _) = fake(StatusCode::OK, odd.to_string()).await;
        assert!(reason(engine(&url).generate(request()).await.unwrap_err()).contains("logprobs.tokens[1]"));

        let mut odd: Value = serde_json::from_str(&answer(json!("stop"))).unwrap();
        odd["choices"][0]["logprobs"] = Value::Null;
        let (url, _) = fake(StatusCode::OK, odd.to_string()).await;
        assert!(
            reason(engine(&url).generate(request()).await.unwrap_err())
                .contains("choices[0].logprobs.tokens")
        );

        let (url, _) = fake(StatusCode::OK, json!({"choices": []}).to_string()).await;
        assert!(
            reason(engine(&url).generate(request()).await.unwrap_err()).contains("choices[0].finish_reason")
        );
    }
}
