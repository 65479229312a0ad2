//! The embedded engine: a [`CausalLm`] owned by one thread that runs the continuous-batching
//! [`Scheduler`] over every generation request of the worker, whichever trajectory sent it.
//!
//! Requests arrive over a channel and are admitted between decoding steps. New weights are applied
//! between steps too, once the sequences already running have finished (no admissions meanwhile),
//! so every generation comes from exactly one policy version.

use super::engine::{Engine, EngineError, EngineOutput};
use crate::model::engine::EngineError as SchedulerError;
use crate::model::{CausalLm, GenerationRequest, Scheduler, Tokenizer};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::mpsc;
use tch::Tensor;
use tokio::sync::oneshot;

type Reply = oneshot::Sender<Result<EngineOutput, EngineError>>;

/// Named parameter tensors (Hugging Face names) of a new policy version.
pub type NamedTensors = Vec<(String, Tensor)>;

enum Command {
    Generate(GenerationRequest, Reply),
    LoadWeights { tensors: NamedTensors, version: i64, done: oneshot::Sender<Result<(), String>> },
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

    /// Replaces the weights with `tensors` (by name) as policy `version`, after the running
    /// sequences finish. Resolves once the new weights are in place.
    pub async fn load_weights(&self, tensors: NamedTensors, version: i64) -> Result<(), EngineError> {
        let (done, wait) = oneshot::channel();
        self.commands.send(Command::LoadWeights { tensors, version, done }).map_err(|_| stopped())?;
        wait.await
            .map_err(|_| stopped())?
            .map_err(|reason| EngineError::Invalid(format!("weights v{version}: {reason}")))
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
                    Command::LoadWeights { tensors, version, done } => {
                        pending_load = Some((tensors, version, done))
                    }
                }
            }
            if pending_load.is_some() && self.scheduler.running() == 0 {
                let (tensors, version, done) = pending_load.take().expect("checked");
                let result = self.load(&tensors);
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
                            let _ = reply.send(Ok(EngineOutput { generation, version: self.version }));
                        }
                    }
                }
                Err(e) => self.fail_all(&mut replies, e),
            }
        }
    }

    /// Copies new parameter values into the model, checking names and shapes.
    fn load(&mut self, tensors: &NamedTensors) -> Result<(), String> {
        let mut vars = self.model.var_store().variables();
        for (name, value) in tensors {
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
