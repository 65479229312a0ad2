//! An SGLang server as the rollout engine, through its native `POST /generate` with token ids in and
//! `return_logprob`, the way slime and verl drive it.
//!
//! The generated ids and their log-probabilities both come from `meta_info.output_token_logprobs`
//! (`[logprob, token_id, text]` per token), never from re-tokenising `text`. Stop strings are kept in
//! the output (`no_stop_trim`) and special tokens are not skipped, so nothing is cut out of the ids.
//!
//! What the log-probabilities are: by default SGLang reports `log softmax(logits / T)` of the sampled
//! token, before top-k/top-p/min-p truncation, and `log softmax(logits)` for greedy requests
//! (temperature 0 becomes top-k 1 at T = 1) — kart's convention. Started with
//! `SGLANG_RETURN_ORIGINAL_LOGPROB=1` it reports `log softmax(logits)` (T = 1) for every request,
//! which differs whenever T ≠ 1: leave that variable unset. Repetition penalties and logit biases
//! would be applied before either; kart sends none.
//!
//! Seeds: `sampling_seed` only takes effect on servers started with
//! `--enable-deterministic-inference`; other servers ignore it.
//!
//! Weights: [`SglangEngine::update_weights_from_disk`] loads a Hugging Face folder;
//! [`SglangEngine::init_weights_update_group`] and [`SglangEngine::update_weights_from_distributed`]
//! receive tensors broadcast by the trainer over NCCL (or Gloo), in flattened buckets, as slime and
//! verl send them.
//!
//! Policy versions: both update calls tag the new weights with
//! SGLang's `weight_version`, which the server reports in every response's `meta_info` at the moment
//! the output finished (a weight update waits for running requests, unless it aborts them). Outputs
//! carry that version when it is an integer, otherwise the one recorded (by
//! [`SglangEngine::set_version`]) when the request was sent.
//!
//! LoRA: a trainer of adapters publishes only them. SGLang refuses to load a name twice, so each
//! version is loaded under its own name ([`adapter_name`]): [`SglangEngine::load_adapter`] loads
//! the PEFT folder (`POST /load_lora_adapter`), makes the version the server's
//! (`POST /update_weight_version`) and unloads the adapters older than the one before it
//! (`POST /unload_lora_adapter`, which waits for the requests using them). A request names the
//! adapter of the server's version as its `lora_path` once the server lists it (`GET /v1/models`,
//! read again whenever `GET /get_weight_version` changes), and its tokens carry that version: an
//! update of the version alone does not wait for the requests running, so the `weight_version`
//! they finish with may already be the next one.
//!
//! Interrupted requests: an answer that finished with `abort` (a weight update with
//! `abort_all_requests`) keeps the tokens and log-probabilities generated so far; the request is
//! sent again with them appended to its `input_ids` and its `max_new_tokens` reduced, and goes on
//! on the new weights, as AReaL continues interrupted generations. The output then carries each
//! span of tokens with the version that sampled it ([`EngineOutput::earlier`]). A request aborted
//! more than [`MAX_INTERRUPTIONS`] times fails as aborted.

use super::TensorMeta;
use super::http::HttpEngine;
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

/// Continuations of one request after interruptions, before it fails as aborted.
pub const MAX_INTERRUPTIONS: usize = 4;

/// What a `/generate` answer holds.
enum Answer {
    /// A finished generation.
    Finished(EngineOutput),
    /// The tokens of a request that was aborted, and the version that sampled them.
    Interrupted { token_ids: Vec<u32>, logprobs: Vec<f32>, version: i64 },
}

/// A weight-update group an SGLang server's workers join: rank 0 (the trainer) serves its store
/// at `master_address:master_port`.
#[derive(Debug, Clone)]
pub struct UpdateGroup<'a> {
    pub master_address: &'a str,
    pub master_port: u16,
    /// The rank of the server's first worker.
    pub rank_offset: usize,
    pub world_size: usize,
    pub name: &'a str,
    /// `nccl` (CUDA tensors) or `gloo`.
    pub backend: &'a str,
}

/// The name the trainer's adapters of policy `version` are loaded under on an SGLang server.
pub fn adapter_name(version: i64) -> String {
    format!("{POLICY_ADAPTER}-v{version}")
}

/// The version of an adapter named by [`adapter_name`].
fn adapter_version(name: &str) -> Option<i64> {
    name.strip_prefix(POLICY_ADAPTER)?.strip_prefix("-v")?.parse().ok()
}

/// An SGLang server reached over HTTP.
#[derive(Debug)]
pub struct SglangEngine {
    http: HttpEngine,
    /// The server answered that it has no `/get_weight_version` (an SGLang before it).
    unversioned: AtomicBool,
    /// The server's version when last read, and the trainer's adapter of that version if the
    /// server lists it.
    adapter: Mutex<Option<(Option<i64>, Option<String>)>>,
}

impl SglangEngine {
    /// A client for the server at `base_url` (e.g. `http://sglang:30000`) with a per-request
    /// `timeout`, at policy version 0.
    pub fn new(base_url: &str, timeout: Duration) -> Self {
        SglangEngine {
            http: HttpEngine::new("sglang", base_url, timeout),
            unversioned: AtomicBool::new(false),
            adapter: Mutex::new(None),
        }
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        self.http.base()
    }

    /// The policy version last recorded.
    pub fn version(&self) -> i64 {
        self.http.version()
    }

    /// Records that the server now holds the weights of policy `version` (when something other than
    /// this client updated them).
    pub fn set_version(&self, version: i64) {
        self.http.set_version(version);
    }

    /// Makes the server load the Hugging Face folder at `model_path` (a path on the server's
    /// filesystem) as policy `version`, through `POST /update_weights_from_disk`. SGLang finishes the
    /// running requests first, or with `abort_all` aborts them (their clients continue them on the
    /// new weights); new ones wait for the new weights. Records `version` on success.
    pub async fn update_weights_from_disk(
        &self,
        model_path: &str,
        version: i64,
        abort_all: bool,
    ) -> Result<(), EngineError> {
        let payload = json!({
            "model_path": model_path, "weight_version": version.to_string(), "abort_all_requests": abort_all,
        });
        self.call("/update_weights_from_disk", &payload).await?;
        self.set_version(version);
        Ok(())
    }

    /// Loads the PEFT folder `path` (a path on the server's filesystem) as policy `version`: under
    /// [`adapter_name`] (`POST /load_lora_adapter`, unless a try before loaded it), then as the
    /// server's version (`POST /update_weight_version`, aborting the requests in flight when
    /// `abort_all`), then unloads the trainer's adapters older than `version - 1`
    /// (`POST /unload_lora_adapter`). Records `version`.
    pub async fn load_adapter(&self, path: &str, version: i64, abort_all: bool) -> Result<(), EngineError> {
        let name = adapter_name(version);
        if !self.models().await?.contains(&name) {
            self.call("/load_lora_adapter", &json!({"lora_name": name, "lora_path": path})).await?;
        }
        let update = json!({"new_version": version.to_string(), "abort_all_requests": abort_all});
        self.call("/update_weight_version", &update).await?;
        self.set_version(version);
        for old in self.models().await? {
            if adapter_version(&old).is_some_and(|v| v < version - 1) {
                self.call("/unload_lora_adapter", &json!({ "lora_name": old })).await?;
            }
        }
        Ok(())
    }

    /// The models the server serves (`id`s of `GET /v1/models`): the served model and the LoRA
    /// adapters loaded.
    pub async fn models(&self) -> Result<Vec<String>, EngineError> {
        self.http.models().await
    }

    /// The trainer's adapter a request sent now names, and its version: that of the server's
    /// version, if the server lists it.
    async fn current_adapter(&self) -> Result<Option<(String, i64)>, EngineError> {
        if self.unversioned.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let version = match self.weight_version().await {
            Ok(version) => version,
            // A 404: the only 4xx of a GET, from a server without the route.
            Err(EngineError::Invalid(_)) => {
                self.unversioned.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        let known = self.adapter.lock().expect("adapter lock").clone();
        let name = match known {
            Some((at, name)) if at == version => name,
            _ => {
                let wanted = version.map(adapter_name);
                let listed = match &wanted {
                    Some(wanted) => self.models().await?.contains(wanted),
                    None => false,
                };
                let name = wanted.filter(|_| listed);
                *self.adapter.lock().expect("adapter lock") = Some((version, name.clone()));
                name
            }
        };
        Ok(name.zip(version))
    }

    /// The server's tensor-parallel size (`tp_size` of `GET /get_server_info`): its workers, each
    /// one rank of a weight-update group.
    pub async fn tp_size(&self) -> Result<usize, EngineError> {
        let info = self.http.get("/get_server_info").await?;
        let tp = info["tp_size"].as_u64().filter(|&tp| tp > 0);
        let url = format!("GET {}/get_server_info", self.url());
        let tp =
            tp.ok_or_else(|| self.http.unavailable(&url, "malformed response: no positive `tp_size`"))?;
        Ok(tp as usize)
    }

    /// The policy version the server's weights have (`GET /get_weight_version`); `None` when it is
    /// not an integer: SGLang's `default`, the weights it started with.
    pub async fn weight_version(&self) -> Result<Option<i64>, EngineError> {
        let answer = self.http.get("/get_weight_version").await?;
        Ok(answer["weight_version"].as_str().and_then(|v| v.parse().ok()))
    }

    /// Tells the server's workers to join `group` (`POST /init_weights_update_group`): worker
    /// `i` becomes rank `rank_offset + i`. Returns once they joined, that is once every rank did.
    pub async fn init_weights_update_group(&self, group: &UpdateGroup<'_>) -> Result<(), EngineError> {
        let payload = json!({
            "master_address": group.master_address,
            "master_port": group.master_port,
            "rank_offset": group.rank_offset,
            "world_size": group.world_size,
            "group_name": group.name,
            "backend": group.backend,
        });
        self.call("/init_weights_update_group", &payload).await
    }

    /// Makes the server's workers receive `tensors` as one flattened bucket (their bytes in order)
    /// broadcast from rank 0 of `group_name` (`POST /update_weights_from_distributed`, load format
    /// `flattened_bucket`), and load them. The last bucket of a publish carries its `version`,
    /// which then becomes the server's `weight_version`, and flushes the prefix cache;
    /// `abort_all` aborts the requests in flight first. Returns once the broadcast completed.
    pub async fn update_weights_from_distributed(
        &self,
        tensors: &[TensorMeta],
        group_name: &str,
        version: Option<i64>,
        abort_all: bool,
    ) -> Result<(), EngineError> {
        let payload = json!({
            "names": tensors.iter().map(|t| &t.name).collect::<Vec<_>>(),
            "dtypes": tensors.iter().map(|t| t.dtype).collect::<Vec<_>>(),
            "shapes": tensors.iter().map(|t| &t.shape).collect::<Vec<_>>(),
            "group_name": group_name,
            "flush_cache": version.is_some(),
            "abort_all_requests": abort_all,
            "weight_version": version.map(|v| v.to_string()),
            "load_format": "flattened_bucket",
        });
        self.call("/update_weights_from_distributed", &payload).await?;
        if let Some(version) = version {
            self.set_version(version);
        }
        Ok(())
    }

    /// Makes the server's workers leave `group_name` (`POST /destroy_weights_update_group`).
    pub async fn destroy_weights_update_group(&self, group_name: &str) -> Result<(), EngineError> {
        self.call("/destroy_weights_update_group", &json!({ "group_name": group_name })).await
    }

    /// POSTs `payload` to one of SGLang's control endpoints, which answer `success` and `message`
    /// (a failure is a 400 with `success: false`).
    async fn call(&self, path: &str, payload: &Value) -> Result<(), EngineError> {
        let answer = self.http.post(path, payload).await?;
        if answer["success"].as_bool() != Some(true) {
            let url = format!("{}{path}", self.url());
            return Err(self.http.malformed(&url, format!("`success` is not true in {answer}")));
        }
        Ok(())
    }

    /// The `/generate` body for `request`, sampled with the LoRA adapter `adapter` if any.
    fn payload(request: &GenerationRequest, adapter: Option<&str>) -> Value {
        let sampling = &request.sampling;
        let mut params = json!({
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": if sampling.top_k > 0 { sampling.top_k } else { -1 },
            "max_new_tokens": request.max_new_tokens,
            "stop": request.stop,
            "stop_token_ids": request.stop_token_ids,
            "ignore_eos": request.ignore_eos,
            "no_stop_trim": true,
            "skip_special_tokens": false,
        });
        if let Some(seed) = sampling.seed {
            // Older SGLang keeps seeds in an int32 tensor: send the low 31 bits.
            params["sampling_seed"] = json!(seed & 0x7fff_ffff);
        }
        let mut payload =
            json!({"input_ids": request.input_ids, "sampling_params": params, "return_logprob": true});
        if let Some(adapter) = adapter {
            payload["lora_path"] = json!(adapter);
        }
        payload
    }

    /// The generation in a `/generate` answer, or why there is none; `recorded` is the version
    /// recorded when the request was sent.
    fn parse(&self, url: &str, answer: &Value, recorded: i64) -> Result<Answer, EngineError> {
        let malformed = |what: String| self.http.malformed(url, what);
        let meta = &answer["meta_info"];
        let finish = &meta["finish_reason"];
        let finish_reason = match finish["type"].as_str() {
            Some("stop") => Some(FinishReason::Stop),
            Some("length") => Some(FinishReason::Length),
            Some("abort") => {
                tracing::info!(url, reason = %finish["message"], "sglang interrupted a request; continuing it");
                None
            }
            _ => {
                return Err(malformed(format!(
                    "`meta_info.finish_reason.type` is missing or unknown in {finish}"
                )));
            }
        };
        let no_tokens = Vec::new();
        let entries = match meta["output_token_logprobs"].as_array() {
            Some(entries) => entries,
            // Aborted before its prefill: nothing generated.
            None if finish_reason.is_none() => &no_tokens,
            None => return Err(malformed("no `meta_info.output_token_logprobs` list".into())),
        };
        let mut token_ids = Vec::with_capacity(entries.len());
        let mut logprobs = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let logprob = entry[0].as_f64();
            let id = entry[1].as_u64().and_then(|id| u32::try_from(id).ok());
            let (Some(logprob), Some(id)) = (logprob, id) else {
                return Err(malformed(format!(
                    "`meta_info.output_token_logprobs[{i}]` is {entry}, not [logprob, token_id, text]"
                )));
            };
            token_ids.push(id);
            logprobs.push(logprob as f32);
        }
        let version = meta["weight_version"].as_str().and_then(|v| v.parse().ok()).unwrap_or(recorded);
        Ok(match finish_reason {
            Some(finish_reason) => Answer::Finished(EngineOutput::new(
                Generation { token_ids, logprobs, finish_reason },
                version,
            )),
            None => Answer::Interrupted { token_ids, logprobs, version },
        })
    }
}

impl Engine for SglangEngine {
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
        Box::pin(async move {
            let url = format!("{}/generate", self.url());
            let mut request = request;
            let (mut token_ids, mut logprobs, mut earlier) =
                (Vec::new(), Vec::new(), Vec::<(usize, i64)>::new());
            for _ in 0..=MAX_INTERRUPTIONS {
                let adapter = self.current_adapter().await?;
                let recorded = self.version();
                let payload = Self::payload(&request, adapter.as_ref().map(|(name, _)| name.as_str()));
                let answer = self.http.post("/generate", &payload).await?;
                let mut parsed = self.parse(&url, &answer, recorded)?;
                // Sampled by the adapter named, whatever version the server reached meanwhile.
                if let Some((_, sampled_by)) = adapter {
                    match &mut parsed {
                        Answer::Finished(output) => output.version = sampled_by,
                        Answer::Interrupted { version, .. } => *version = sampled_by,
                    }
                }
                let (ids, lps, version) = match parsed {
                    Answer::Finished(mut output) => {
                        token_ids.append(&mut output.generation.token_ids);
                        logprobs.append(&mut output.generation.logprobs);
                        (output.generation.token_ids, output.generation.logprobs) = (token_ids, logprobs);
                        // Spans of the final version belong to its tokens.
                        while earlier.last().is_some_and(|&(_, v)| v == output.version) {
                            earlier.pop();
                        }
                        output.earlier = earlier;
                        return Ok(output);
                    }
                    Answer::Interrupted { token_ids, logprobs, version } => (token_ids, logprobs, version),
                };
                match earlier.last_mut() {
                    Some((n, v)) if *v == version => *n += ids.len(),
                    _ if ids.is_empty() => {}
                    _ => earlier.push((ids.len(), version)),
                }
                request.max_new_tokens = request.max_new_tokens.saturating_sub(ids.len());
                request.input_ids.extend_from_slice(&ids);
                token_ids.extend(ids);
                logprobs.extend(lps);
                if request.max_new_tokens == 0 {
                    // The budget ran out as the request was interrupted: its last span is the output's.
                    let version = earlier.pop().map_or(version, |(_, v)| v);
                    let generation = Generation { token_ids, logprobs, finish_reason: FinishReason::Length };
                    return Ok(EngineOutput { generation, version, earlier });
                }
            }
            tracing::warn!(url, interruptions = MAX_INTERRUPTIONS + 1, "sglang kept aborting a request");
            Err(EngineError::Aborted { engine: self.http.name().into() })
        })
    }

    fn name(&self) -> &str {
        self.http.name()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::engines::http::{dead_url, serve};
    use axum::Json;
    use axum::http::StatusCode;
    use axum::routing::post;
    use kart_core::generation::SamplingParams;
    use std::sync::{Arc, Mutex};

    /// What a fake server saw.
    pub(crate) type Requests = Arc<Mutex<Vec<(String, Value)>>>;

    /// A fake SGLang server answering every POST with `status` and `body`, recording the requests.
    pub(crate) async fn fake(status: StatusCode, body: String) -> (String, Requests) {
        let requests = Requests::default();
        let seen = requests.clone();
        let handler = move |uri: axum::http::Uri, Json(request): Json<Value>| {
            let (seen, body) = (seen.clone(), body.clone());
            async move {
                seen.lock().unwrap().push((uri.path().to_string(), request));
                (status, [("content-type", "application/json")], body)
            }
        };
        let router = axum::Router::new()
            .route("/generate", post(handler.clone()))
            .route("/update_weights_from_disk", post(handler));
        (serve(router).await, requests)
    }

    /// A `/generate` answer shaped like SGLang's (fields it sends that kart ignores included).
    pub(crate) fn answer(finish_reason: Value, weight_version: &str) -> String {
        json!({
            "text": "<search>Paris</search>",
            "output_ids": [27, 1836, 29, 59604, 522, 1836, 29],
            "meta_info": {
                "id": "0f7d3c9a5e2b4c1d8a6f9e3b7c2d1a4e",
                "finish_reason": finish_reason,
                "prompt_tokens": 4,
                "weight_version": weight_version,
                "total_retractions": 0,
                "input_token_logprobs": [[null, 9707, null]],
                "output_token_logprobs": [
                    [-0.0125, 27, null], [-0.5, 1836, null], [-1.0e-4, 29, null], [-2.25, 59604, null],
                    [-0.75, 522, null], [-0.001, 1836, null], [0.0, 29, null]
                ],
                "input_top_logprobs": [null],
                "output_top_logprobs": [],
                "completion_tokens": 7,
                "cached_tokens": 3,
                "e2e_latency": 0.1873
            }
        })
        .to_string()
    }

    pub(crate) fn request() -> GenerationRequest {
        GenerationRequest {
            input_ids: vec![9707, 11, 1879, 0],
            sampling: SamplingParams { temperature: 0.7, top_p: 0.9, top_k: 0, seed: Some(u64::MAX) },
            max_new_tokens: 64,
            stop: vec!["</search>".into(), "</answer>".into()],
            stop_token_ids: vec![151645],
            ignore_eos: false,
        }
    }

    fn engine(url: &str) -> SglangEngine {
        SglangEngine::new(url, Duration::from_secs(60))
    }

    #[tokio::test]
    async fn generate_sends_token_ids_and_reads_output_token_logprobs() {
        let (url, requests) =
            fake(StatusCode::OK, answer(json!({"type": "stop", "matched": "</search>"}), "default")).await;
        let engine = engine(&format!("{url}/"));
        engine.set_version(5);
        let output = engine.generate(request()).await.unwrap();
        assert_eq!(output.generation.token_ids, [27, 1836, 29, 59604, 522, 1836, 29]);
        assert_eq!(output.generation.logprobs, [-0.0125, -0.5, -1.0e-4, -2.25, -0.75, -0.001, 0.0]);
        assert_eq!(output.generation.finish_reason, FinishReason::Stop);
        assert_eq!(output.version, 5, "`default` is no version: the recorded one is used");

        let (path, body) = requests.lock().unwrap()[0].clone();
        assert_eq!(path, "/generate");
        let expected = json!({
            "input_ids": [9707, 11, 1879, 0],
            "sampling_params": {
                "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_new_tokens": 64,
                "stop": ["</search>", "</answer>"], "stop_token_ids": [151645], "ignore_eos": false,
                "no_stop_trim": true, "skip_special_tokens": false, "sampling_seed": 0x7fff_ffff
            },
            "return_logprob": true
        });
        assert_eq!(body, expected);
    }

    #[tokio::test]
    async fn greedy_top_k_and_length_finish() {
        let (url, requests) =
            fake(StatusCode::OK, answer(json!({"type": "length", "length": 7}), "12")).await;
        let mut greedy = request();
        greedy.sampling = SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 20, seed: None };
        let output = engine(&url).generate(greedy).await.unwrap();
        assert_eq!(output.generation.finish_reason, FinishReason::Length);
        assert_eq!(output.version, 12, "an integer weight_version is the output's version");
        let params = requests.lock().unwrap()[0].1["sampling_params"].clone();
        assert_eq!((params["temperature"].as_f64(), params["top_k"].as_i64()), (Some(0.0), Some(20)));
        assert!(params.get("sampling_seed").is_none());
    }

    #[tokio::test]
    async fn abort_is_aborted() {
        let finish = json!({"type": "abort", "message": "Abort before prefill", "status_code": null, "err_type": null});
        let (url, _) = fake(StatusCode::OK, answer(finish, "default")).await;
        assert_eq!(
            engine(&url).generate(request()).await.unwrap_err(),
            EngineError::Aborted { engine: "sglang".into() }
        );
    }

    #[tokio::test]
    async fn server_errors_are_retryable_and_client_errors_carry_the_message() {
        let (url, _) = fake(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error".into()).await;
        match engine(&url).generate(request()).await.unwrap_err() {
            EngineError::Unavailable { engine, reason } => {
                assert_eq!(engine, "sglang");
                assert!(reason.contains(&format!("{url}/generate")) && reason.contains("500"), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let too_long = r#"{"error": {"message": "The input (40000 tokens) is longer than the model's context length (32768 tokens)."}}"#;
        let (url, _) = fake(StatusCode::BAD_REQUEST, too_long.into()).await;
        match engine(&url).generate(request()).await.unwrap_err() {
            EngineError::Invalid(message) => {
                assert!(message.contains("longer than the model's context length"), "{message}")
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn malformed_answers_are_unavailable_naming_the_field() {
        let reason = |e: EngineError| match e {
            EngineError::Unavailable { reason, .. } => reason,
            other => panic!("expected Unavailable, got {other:?}"),
        };
        let (url, _) = fake(StatusCode::OK, "{\"text\": ".into()).await;
        assert!(reason(engine(&url).generate(request()).await.unwrap_err()).contains("malformed JSON"));

        let (url, _) = fake(
            StatusCode::OK,
            json!({"text": "hi", "meta_info": {"finish_reason": {"type": "stop"}}}).to_string(),
        )
        .await;
        assert!(
            reason(engine(&url).generate(request()).await.unwrap_err())
                .contains("meta_info.output_token_logprobs")
        );

        let mut odd: Value = serde_json::from_str(&answer(json!({"type": "stop"}), "default")).unwrap();
        odd["meta_info"]["output_token_logprobs"][2] = json!([null, 29, null]);
        let (url, _) = fake(StatusCode::OK, odd.to_string()).await;
        assert!(
            reason(engine(&url).generate(request()).await.unwrap_err()).contains("output_token_logprobs[2]")
        );

        let (url, _) = fake(StatusCode::OK, answer(Value::Null, "default")).await;
        assert!(reason(engine(&url).generate(request()).await.unwrap_err()).contains("finish_reason"));
    }

    #[tokio::test]
    async fn unreachable_server_is_unavailable() {
        let err = engine(&dead_url()).generate(request()).await.unwrap_err();
        assert!(err.is_retryable() && matches!(err, EngineError::Unavailable { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn update_weights_from_disk_posts_the_path_and_records_the_version() {
        let ok = json!({"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0});
        let (url, requests) = fake(StatusCode::OK, ok.to_string()).await;
        let engine = engine(&url);
        engine.update_weights_from_disk("/ckpt/step-3", 3, true).await.unwrap();
        assert_eq!(engine.version(), 3);
        let (path, body) = requests.lock().unwrap()[0].clone();
        assert_eq!(path, "/update_weights_from_disk");
        let expected =
            json!({"model_path": "/ckpt/step-3", "weight_version": "3", "abort_all_requests": true});
        assert_eq!(body, expected);

        let failed = json!({"success": false, "message": "Failed to get weights iterator: /ckpt/x not found", "num_paused_requests": 0});
        let (url, _) = fake(StatusCode::BAD_REQUEST, failed.to_string()).await;
        let engine = SglangEngine::new(&url, Duration::from_secs(60));
        match engine.update_weights_from_disk("/ckpt/x", 4, false).await.unwrap_err() {
            EngineError::Invalid(message) => assert!(message.contains("/ckpt/x not found"), "{message}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
        assert_eq!(engine.version(), 0, "a failed update keeps the version");
    }

    /// A fake SGLang server answering its `/generate` requests with `answers` in turn (the last
    /// one again once they run out), recording the requests.
    async fn fake_answers(answers: Vec<String>) -> (String, Requests) {
        let requests = Requests::default();
        let seen = requests.clone();
        let handler = move |Json(request): Json<Value>| {
            let (seen, answers) = (seen.clone(), answers.clone());
            async move {
                let mut seen = seen.lock().unwrap();
                seen.push(("/generate".to_string(), request));
                let body = answers[(seen.len() - 1).min(answers.len() - 1)].clone();
                (StatusCode::OK, [("content-type", "application/json")], body)
            }
        };
        (serve(axum::Router::new().route("/generate", post(handler))).await, requests)
    }

    /// A `/generate` answer of `tokens` (id, logprob) finishing with `finish`, sampled by `version`.
    fn partial(tokens: &[(u32, f64)], finish: Value, version: &str) -> String {
        let logprobs: Vec<Value> = tokens.iter().map(|(id, lp)| json!([lp, id, null])).collect();
        json!({"text": "", "meta_info": {"finish_reason": finish, "weight_version": version,
                                          "output_token_logprobs": logprobs}})
        .to_string()
    }

    #[tokio::test]
    async fn an_interrupted_request_goes_on_from_its_prefix_with_each_span_versioned() {
        let abort = json!({"type": "abort", "message": "Abort in running batch"});
        let (url, requests) = fake_answers(vec![
            partial(&[(27, -0.5), (1836, -0.25)], abort.clone(), "3"),
            partial(&[], abort, "3"),
            partial(&[(29, -1.0)], json!({"type": "stop", "matched": "</search>"}), "4"),
        ])
        .await;
        let output = engine(&url).generate(request()).await.unwrap();
        assert_eq!(output.generation.token_ids, [27, 1836, 29]);
        assert_eq!(output.generation.logprobs, [-0.5, -0.25, -1.0]);
        assert_eq!(output.generation.finish_reason, FinishReason::Stop);
        assert_eq!(
            (output.earlier.as_slice(), output.version),
            (&[(2, 3)][..], 4),
            "two tokens of v3, one of v4"
        );
        let requests = requests.lock().unwrap();
        assert_eq!(requests.len(), 3, "sent again after each interruption");
        let continued = &requests[2].1;
        assert_eq!(continued["input_ids"], json!([9707, 11, 1879, 0, 27, 1836]), "the prefix goes on");
        assert_eq!(continued["sampling_params"]["max_new_tokens"], 62, "the budget left");
    }

    #[tokio::test]
    async fn a_request_interrupted_at_its_budget_ends_by_length_and_one_always_aborted_fails() {
        let abort = json!({"type": "abort", "message": "Abort in running batch"});
        let mut short = request();
        short.max_new_tokens = 2;
        let (url, _) = fake_answers(vec![partial(&[(27, -0.5), (1836, -0.25)], abort.clone(), "7")]).await;
        let output = engine(&url).generate(short).await.unwrap();
        assert_eq!(output.generation.finish_reason, FinishReason::Length);
        assert_eq!((output.earlier.is_empty(), output.version), (true, 7));
        let (url, requests) = fake_answers(vec![partial(&[], abort, "7")]).await;
        let error = engine(&url).generate(request()).await.unwrap_err();
        assert!(matches!(error, EngineError::Aborted { .. }), "{error}");
        assert_eq!(requests.lock().unwrap().len(), MAX_INTERRUPTIONS + 1);
    }
}
