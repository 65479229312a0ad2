//! The embedded engine: a [`CausalLm`] owned by one thread that runs the continuous-batching
//! [`Scheduler`] over every generation request of the worker, whichever trajectory sent it.
//!
//! Requests arrive over a channel and are admitted between decoding steps. New weights are applied
//! between steps too, once the sequences already running have finished (no admissions meanwhile),
//! so every generation comes from exactly one policy version. A model with LoRA adapters attached
//! generates with them, and a new version may be its adapters alone (PEFT's names), copied into
//! place over the base it keeps; adapters of other settings, or none, are attached or dropped as a
//! version needs, never reloading the base.

use crate::scheduler::SchedulerError;
use crate::{CausalLm, Scheduler};
use futures::future::BoxFuture;
use kart_core::config::lora::LoraConfig;
use kart_core::engine::{Engine, EngineError, EngineOutput, LoadWeights, LoadWeightsError};
use kart_core::generation::GenerationRequest;
use kart_tokenizer::Tokenizer;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc;
use tch::Tensor;
use tokio::sync::oneshot;

type Reply = oneshot::Sender<Result<EngineOutput, EngineError>>;

/// Named parameter tensors (Hugging Face names, or PEFT's for adapters) of a new policy version.
pub type NamedTensors = Vec<(String, Tensor)>;

enum Command {
    Generate(GenerationRequest, Reply),
    LoadWeights { update: Update, version: i64, done: oneshot::Sender<Result<(), String>> },
}

/// The tensors of a new version and what they are.
struct Update {
    tensors: NamedTensors,
    kind: UpdateKind,
}

/// What the tensors of an [`Update`] are.
enum UpdateKind {
    /// Parameters of the model as it is (its adapters' among them, where attached).
    AsHeld,
    /// A whole model: adapters the model holds are dropped first.
    Model,
    /// Every adapter of these settings, attached first where the model holds none of them.
    Adapters(LoraConfig),
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct EmbeddedEngine {
    commands: mpsc::Sender<Command>,
}

impl std::fmt::Debug for EmbeddedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EmbeddedEngine")
    }
}

impl EmbeddedEngine {
    /// Starts the engine thread owning `model`, running at most `max_batch` sequences at once.
    pub fn spawn(model: CausalLm, tokenizer: Tokenizer, max_batch: usize, version: i64, seed: u64) -> Self {
        let (commands, inbox) = mpsc::channel();
        std::thread::Builder::new()
            .name("kart-engine".into())
            .spawn(move || {
                EngineLoop { model, tokenizer, version, scheduler: Scheduler::new(max_batch, seed) }
                    .run(inbox)
            })
            .expect("spawn the engine thread");
        EmbeddedEngine { commands }
    }

    /// Replaces the weights with `tensors` (by name: the model's parameters, its adapters'
    /// where attached) as policy `version`, after the running sequences finish. Resolves once the
    /// new weights are in place.
    pub async fn load_tensors(&self, tensors: NamedTensors, version: i64) -> Result<(), LoadWeightsError> {
        self.update(Update { tensors, kind: UpdateKind::AsHeld }, version).await
    }

    async fn update(&self, update: Update, version: i64) -> Result<(), LoadWeightsError> {
        let (done, wait) = oneshot::channel();
        let stopped = || LoadWeightsError::Rejected(stopped().to_string());
        self.commands.send(Command::LoadWeights { update, version, done }).map_err(|_| stopped())?;
        wait.await.map_err(|_| stopped())?.map_err(LoadWeightsError::Rejected)
    }
}

impl LoadWeights for EmbeddedEngine {
    /// A whole model drops the adapters the engine may hold; adapters (`lora`) are applied over
    /// the base it keeps.
    fn load_weights(
        &self,
        file: PathBuf,
        version: i64,
        lora: Option<LoraConfig>,
    ) -> BoxFuture<'_, Result<(), LoadWeightsError>> {
        Box::pin(async move {
            let read = |e: &dyn std::fmt::Display| LoadWeightsError::Read(e.to_string());
            let tensors = tokio::task::spawn_blocking(move || Tensor::read_safetensors(&file))
                .await
                .map_err(|e| read(&e))?
                .map_err(|e| read(&e))?;
            let kind = lora.map_or(UpdateKind::Model, UpdateKind::Adapters);
            self.update(Update { tensors, kind }, version).await
        })
    }
}

fn stopped() -> EngineError {
    EngineError::Unavailable { engine: "embedded".into(), reason: "the engine thread has stopped".into() }
}

impl Engine for EmbeddedEngine {
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
        Box::pin(async move {
            let (reply, wait) = oneshot::channel();
            self.commands.send(Command::Generate(request, reply)).map_err(|_| stopped())?;
            wait.await.map_err(|_| stopped())?
        })
    }

    fn name(&self) -> &str {
        "embedded"
    }
}

struct EngineLoop {
    model: CausalLm,
    tokenizer: Tokenizer,
    version: i64,
    scheduler: Scheduler<u64>,
}

impl EngineLoop {
    fn run(mut self, inbox: mpsc::Receiver<Command>) {
        let mut replies: HashMap<u64, Reply> = HashMap::new();
        let mut next_id = 0u64;
        let mut pending_load = None;
        loop {
            // Block only when there is nothing to do; otherwise take whatever has arrived.
            let idle = self.scheduler.is_idle() && pending_load.is_none();
            let first = if idle {
                match inbox.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                None
            };
            for command in first.into_iter().chain(inbox.try_iter()) {
                match command {
                    Command::Generate(request, reply) => {
                        let id = next_id;
                        next_id += 1;
                        match self.scheduler.submit(id, request, &self.model) {
                            Ok(()) => {
                                replies.insert(id, reply);
                            }
                            Err(e) => {
                                let _ = reply.send(Err(EngineError::Invalid(e.to_string())));
                            }
                        }
                    }
                    Command::LoadWeights { update, version, done } => {
                        pending_load = Some((update, version, done))
                    }
                }
            }
            if pending_load.is_some() && self.scheduler.running() == 0 {
                let (update, version, done) = pending_load.take().expect("checked");
                let result = self.load(update);
                if result.is_ok() {
                    self.version = version;
                }
                let _ = done.send(result);
                continue;
            }
            self.scheduler.set_admitting(pending_load.is_none());
            match self.scheduler.step(&self.model, &self.tokenizer) {
                Ok(finished) => {
                    for (id, generation) in finished {
                        if let Some(reply) = replies.remove(&id) {
                            let _ = reply.send(Ok(EngineOutput::new(generation, self.version)));
                        }
                    }
                }
                Err(e) => self.fail_all(&mut replies, e),
            }
        }
    }

    /// Copies new parameter values into the model (its adapters' too), checking names and shapes;
    /// attaches or drops adapters first as `update` asks.
    fn load(&mut self, Update { tensors, kind }: Update) -> Result<(), String> {
        match kind {
            UpdateKind::AsHeld => {}
            UpdateKind::Model => self.model.detach_lora(),
            UpdateKind::Adapters(lora) => {
                if self.model.lora().map(|a| a.config()) != Some(&lora) {
                    self.model.detach_lora();
                    self.model.attach_lora(&lora, 0).map_err(|e| format!("attaching LoRA adapters: {e}"))?;
                }
                let names: std::collections::BTreeSet<&str> =
                    tensors.iter().map(|(n, _)| n.as_str()).collect();
                let adapter_names = self.model.lora().map(|a| a.named_tensors()).unwrap_or_default();
                if let Some((missing, _)) = adapter_names.iter().find(|(n, _)| !names.contains(n.as_str())) {
                    return Err(format!("the adapters lack `{missing}`"));
                }
            }
        }
        let mut vars = self.model.var_store().variables();
        vars.extend(self.model.lora().map(|a| a.named_tensors()).unwrap_or_default());
        for (name, value) in &tensors {
            let var = vars.get_mut(name).ok_or_else(|| format!("unknown parameter `{name}`"))?;
            if var.size() != value.size() {
                return Err(format!("parameter `{name}`: shape {:?}, got {:?}", var.size(), value.size()));
            }
            tch::no_grad(|| var.copy_(value));
        }
        Ok(())
    }

    /// A failed step leaves the batch in an unknown state: fail every request and start afresh.
    fn fail_all(&mut self, replies: &mut HashMap<u64, Reply>, error: SchedulerError) {
        tracing::error!(%error, "engine step failed");
        for (_, reply) in replies.drain() {
            let _ = reply
                .send(Err(EngineError::Unavailable { engine: "embedded".into(), reason: error.to_string() }));
        }
        self.scheduler.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kart_core::generation::SamplingParams;

    /// An engine on the fixture model at version 0.
    fn engine() -> EmbeddedEngine {
        let dir = kart_testing::model("tiny-qwen2");
        let model = CausalLm::load(&dir, tch::Device::Cpu).unwrap();
        EmbeddedEngine::spawn(model, Tokenizer::load(&dir).unwrap(), 8, 0, 0)
    }

    /// The version of the weights that generate now.
    async fn version(engine: &EmbeddedEngine) -> i64 {
        let request = GenerationRequest {
            input_ids: vec![1, 2, 3],
            sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
            max_new_tokens: 2,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: true,
        };
        engine.generate(request).await.unwrap().version
    }

    #[tokio::test]
    async fn loaded_weights_generate_as_their_version() {
        let engine = engine();
        let file = kart_testing::model("tiny-qwen2").join("model.safetensors");
        engine.load_weights(file, 3, None).await.unwrap();
        assert_eq!(version(&engine).await, 3);
    }

    #[tokio::test]
    async fn a_new_version_may_be_the_adapters_alone() {
        let dir = kart_testing::model("tiny-qwen2");
        let lora = kart_core::config::lora::LoraConfig { r: 4, lora_alpha: 64.0, ..Default::default() };
        // The in-process engine holds adapters already; a worker's starts from the base alone.
        let mut engine_model = CausalLm::load(&dir, tch::Device::Cpu).unwrap();
        engine_model.attach_lora(&lora, 1).unwrap();
        let in_process = EmbeddedEngine::spawn(engine_model, Tokenizer::load(&dir).unwrap(), 8, 0, 0);
        let worker = engine();
        // A policy whose adapters moved (B is zero when attached).
        let mut policy = CausalLm::load(&dir, tch::Device::Cpu).unwrap();
        policy.attach_lora(&lora, 2).unwrap();
        let mut adapters = policy.lora().unwrap().named_tensors();
        tch::no_grad(|| {
            for (_, t) in adapters.iter_mut() {
                t.copy_(&(t.randn_like() * 0.5));
            }
        });
        let request = GenerationRequest {
            input_ids: vec![5, 9, 14, 2],
            sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
            max_new_tokens: 12,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: true,
        };
        let before = in_process.generate(request.clone()).await.unwrap().generation;
        let copies = adapters.iter().map(|(n, t)| (n.clone(), t.detach().copy())).collect();
        in_process.load_tensors(copies, 1).await.unwrap();
        let after = in_process.generate(request.clone()).await.unwrap();
        assert_eq!(after.version, 1);
        let folder = tempfile::tempdir().unwrap();
        let file = folder.path().join("adapters.safetensors");
        Tensor::write_safetensors(&adapters, &file).unwrap();
        worker.load_weights(file.clone(), 1, Some(lora.clone())).await.unwrap();
        let pulled = worker.generate(request.clone()).await.unwrap();
        // What the policy's merged weights generate.
        let mut merged = CausalLm::load(&dir, tch::Device::Cpu).unwrap();
        let tensors = policy.merged_tensors();
        let mut vars = merged.var_store_mut().variables();
        tch::no_grad(|| {
            for (name, t) in &tensors {
                vars.get_mut(name).unwrap().copy_(t);
            }
        });
        let reference = EmbeddedEngine::spawn(merged, Tokenizer::load(&dir).unwrap(), 8, 0, 0);
        let expected = reference.generate(request.clone()).await.unwrap().generation;
        assert_eq!(after.generation.token_ids, expected.token_ids);
        assert_eq!((pulled.version, &pulled.generation.token_ids), (1, &expected.token_ids));
        assert_ne!(before.token_ids, expected.token_ids, "the adapters change what the model generates");
        // Adapters missing a tensor are refused; a whole model drops the adapters.
        let partial = folder.path().join("partial.safetensors");
        Tensor::write_safetensors(&adapters[1..], &partial).unwrap();
        let err = worker.load_weights(partial, 2, Some(lora)).await.unwrap_err();
        assert!(err.to_string().contains(&adapters[0].0), "{err}");
        worker.load_weights(dir.join("model.safetensors"), 3, None).await.unwrap();
        let base = worker.generate(request).await.unwrap();
        assert_eq!((base.version, &base.generation.token_ids), (3, &before.token_ids));
    }

    #[tokio::test]
    async fn unreadable_or_foreign_weights_are_refused_and_change_nothing() {
        let engine = engine();
        let garbage = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(garbage.path(), b"not safetensors").unwrap();
        let err = engine.load_weights(garbage.path().to_path_buf(), 5, None).await.unwrap_err();
        assert!(matches!(err, LoadWeightsError::Read(_)), "{err}");
        // Qwen3 has parameters (q_norm, k_norm) a Qwen2 model does not.
        let qwen3 = kart_testing::model("tiny-qwen3").join("model.safetensors");
        let err = engine.load_weights(qwen3, 6, None).await.unwrap_err();
        assert!(matches!(err, LoadWeightsError::Rejected(ref r) if r.contains("unknown parameter")), "{err}");
        assert_eq!(version(&engine).await, 0);
    }
}
