//! Weight broadcast to SGLang and vLLM servers (`weight_sync: sglang_broadcast | vllm_broadcast`):
//! trainer rank 0 and the workers of every replica form one group, and each publish broadcasts
//! the policy's tensors through it in buckets.
//!
//! - SGLang (`/init_weights_update_group`, `/update_weights_from_distributed`, as slime and verl
//!   drive them): rank 0 serves a `TCPStore` ([`ProcessGroup::serve_named`]) and tells each
//!   replica (`tp_size` workers, from `/get_server_info`) its `rank_offset`; the workers join
//!   with `torch.distributed` and the backend of the trainer's device (NCCL on a GPU, Gloo on
//!   the CPU). For each bucket every replica is told the names, dtypes and shapes
//!   (`load_format: flattened_bucket`), then rank 0 broadcasts the bucket's bytes as one tensor.
//!   The last bucket carries the version as `weight_version`; with `rollout.interruptible` the
//!   first aborts the requests in flight.
//! - vLLM (its weight-transfer engine, backend `nccl`, vLLM 0.32): each replica's workers
//!   (`/get_world_size`) join through `/init_weight_transfer_engine` as `PyNcclCommunicator`
//!   does: rank 0's store holds NCCL's unique id ([`NcclCommunicator`]). A publish pauses every
//!   replica once its requests finished (`/pause?mode=wait`), opens the update
//!   (`/start_weight_update`), sends each bucket with one `/update_weights` and one broadcast per
//!   tensor, then `/finish_weight_update` with the version and `/resume`. A CPU trainer uses a
//!   Gloo group on the same store under `tcp://host:port` (vLLM's stateless `torch.distributed`
//!   group), a barrier after each tensor, as vLLM's `torch.distributed` transport keeps its ends
//!   together: NCCL has no CPU transport.
//! - Either way the group is formed again when the replicas change (one added, removed, or
//!   restarted: a replica not on the version last sent has lost its group), and after a
//!   failure. A replica that [`crate::replica_watch`] finds behind between publishes is caught
//!   up the same way. Tensors go in order, in buckets of at most `bucket_mb` (a larger one
//!   alone; a tied `lm_head.weight` is left out, as checkpoints leave it).
//! - A replica that fails: the attempt is given up (a broadcast another replica does not join
//!   fails at the group's timeout), the group is formed again and the publish retried; a publish
//!   that still fails fails the step.

use crate::replicas;
use crate::weights::{Published, SyncError, UPDATE_RETRY, UPDATE_TIMEOUT};
use kart_core::config::train::InferenceServer;
use kart_core::engine::EngineError;
use kart_model::CausalLm;
use kart_rollout::engines::TensorMeta;
use kart_rollout::engines::sglang::{SglangEngine, UpdateGroup};
use kart_rollout::engines::vllm::{TransferInit, VllmEngine};
use kart_torch::{Backend, DistError, NcclCommunicator, ProcessGroup};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// Where the group meets and how weights travel through it.
#[derive(Debug, Clone)]
pub struct BroadcastConfig {
    /// The kind of the servers.
    pub server: InferenceServer,
    /// The servers (a name with several addresses stands for each).
    pub urls: Vec<String>,
    /// The address the replicas' workers reach rank 0's store at.
    pub master_address: String,
    /// The store's port (0: a free one).
    pub master_port: u16,
    /// Bytes of tensors per broadcast.
    pub bucket_bytes: usize,
    /// How long the workers have to join, and to receive one bucket.
    pub timeout: Duration,
    /// Abort the requests in flight with the first bucket (SGLang).
    pub interrupt: bool,
}

/// One replica of the group: its URL and workers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    url: String,
    workers: usize,
}

/// What rank 0 broadcasts through.
enum Channel {
    /// A c10d group (SGLang's workers; vLLM's on the CPU, with a barrier after each tensor).
    Group { group: ProcessGroup, barrier: bool },
    /// An NCCL communicator (vLLM's workers on GPUs).
    Nccl(NcclCommunicator),
}

impl Channel {
    /// Sends `tensor` from rank 0 to every worker.
    fn broadcast(&self, tensor: &mut Tensor) -> Result<(), DistError> {
        match self {
            Channel::Group { group, barrier } => {
                group.broadcast(tensor, 0)?;
                if *barrier { group.barrier() } else { Ok(()) }
            }
            Channel::Nccl(communicator) => communicator.broadcast(tensor),
        }
    }
}

/// The group the replicas joined.
struct Formed {
    name: String,
    members: Vec<Member>,
    channel: Arc<Mutex<Channel>>,
    /// The version last sent through it.
    version: Option<i64>,
}

/// Broadcasts the policy to every SGLang or vLLM replica.
pub struct Broadcaster {
    config: BroadcastConfig,
    /// The backend's device: the policy's.
    device: Device,
    formed: tokio::sync::Mutex<Option<Formed>>,
    /// Groups formed so far (each is named anew: a replica may still hold the one before).
    formations: std::sync::atomic::AtomicUsize,
    run: String,
}

impl Broadcaster {
    /// A broadcaster of tensors on `device`.
    pub fn new(config: BroadcastConfig, device: Device) -> Self {
        Broadcaster {
            config,
            device,
            formed: tokio::sync::Mutex::new(None),
            formations: Default::default(),
            run: format!("{:08x}", rand::random::<u32>()),
        }
    }

    /// The method's name, as metrics label it.
    pub fn method(&self) -> &'static str {
        match self.config.server {
            InferenceServer::Sglang => "sglang_broadcast",
            InferenceServer::Vllm => "vllm_broadcast",
        }
    }

    /// Publishes `policy` as `version` on every replica, retrying per [`UPDATE_RETRY`].
    pub async fn publish(&self, policy: &CausalLm, version: i64) -> Result<Published, SyncError> {
        self.retried(policy, version, true).await
    }

    /// Brings replicas that left the group (restarted) or are new to `version`, the published
    /// one: a group cannot take new ranks, so a new group is formed and every replica receives
    /// `version` again. Nothing happens when every replica of the group holds it.
    pub async fn catch_up(&self, policy: &CausalLm, version: i64) -> Result<Published, SyncError> {
        self.retried(policy, version, false).await
    }

    async fn retried(&self, policy: &CausalLm, version: i64, always: bool) -> Result<Published, SyncError> {
        let mut delays = UPDATE_RETRY.backoff().take(UPDATE_RETRY.retries as usize);
        loop {
            let error = match self.attempt(policy, version, always).await {
                Ok(published) => return Ok(published),
                Err(error) => error,
            };
            let Some(delay) = delays.next() else { return Err(error) };
            tracing::warn!(version, %error, "broadcasting weights failed; forming the group again");
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(&self, policy: &CausalLm, version: i64, always: bool) -> Result<Published, SyncError> {
        let (members, held): (Vec<Member>, Vec<Option<i64>>) =
            self.members(version).await?.into_iter().unzip();
        let mut formed = self.formed.lock().await;
        // The group holds every replica, and none has lost it since it last took a version.
        let intact =
            formed.as_ref().is_some_and(|f| f.members == members && held.iter().all(|h| *h == f.version));
        if intact && !always && held.iter().all(|h| *h == Some(version)) {
            return Ok(Published { replicas: 0, bytes: 0 });
        }
        if !intact {
            if let Some(old) = formed.take() {
                self.disband(old).await;
            }
            *formed = Some(self.form(members, version).await?);
        }
        let group = formed.as_mut().expect("a group was formed");
        match self.send(group, policy, version).await {
            Ok(bytes) => {
                group.version = Some(version);
                Ok(Published { replicas: group.members.len(), bytes })
            }
            Err(error) => {
                // Its ranks may be anywhere in the protocol: the next attempt forms a new group.
                formed.take();
                Err(error)
            }
        }
    }

    /// The replicas behind the URLs, their workers, and the version each holds.
    async fn members(&self, version: i64) -> Result<Vec<(Member, Option<i64>)>, SyncError> {
        let urls = replicas::resolve(&self.config.urls).await?;
        let probes = urls.iter().map(|url| async move {
            match self.config.server {
                InferenceServer::Sglang => {
                    let engine = SglangEngine::new(url, UPDATE_TIMEOUT);
                    Ok::<_, EngineError>((engine.tp_size().await?, engine.weight_version().await?))
                }
                InferenceServer::Vllm => {
                    let engine = VllmEngine::control(url, UPDATE_TIMEOUT);
                    Ok((engine.world_size().await?, engine.weight_version().await?))
                }
            }
        });
        let answers = futures::future::join_all(probes).await;
        let failures = failures(&urls, answers.iter().map(|a| a.as_ref().err()));
        if urls.is_empty() || !failures.is_empty() {
            return Err(self.replicas_error(version, urls.len(), failures));
        }
        Ok(urls
            .into_iter()
            .zip(answers)
            .map(|(url, answer)| {
                let (workers, held) = answer.expect("failures were returned");
                (Member { url, workers }, held)
            })
            .collect())
    }

    /// Forms a new group of rank 0 and every worker of `members`.
    async fn form(&self, members: Vec<Member>, version: i64) -> Result<Formed, SyncError> {
        let formation = self.formations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("kart-{}-{formation}", self.run);
        let world_size = 1 + members.iter().map(|m| m.workers).sum::<usize>();
        let c = &self.config;
        let (server, address, port, device, timeout) =
            (c.server, c.master_address.clone(), c.master_port, self.device, c.timeout);
        let group_name = name.clone();
        let group_error = |e: DistError| SyncError::Group { name: name.clone(), reason: e.to_string() };
        let served = tokio::task::spawn_blocking(move || match server {
            InferenceServer::Sglang => {
                ProcessGroup::serve_named(&address, port, world_size, &group_name, device, timeout)
            }
            InferenceServer::Vllm => ProcessGroup::serve(&address, port, world_size, device, timeout),
        })
        .await
        .expect("serving the store does not panic")
        .map_err(group_error)?;
        let port = served.port();
        let backend = match Backend::for_device(self.device) {
            Backend::Nccl => "nccl",
            Backend::Gloo => "gloo",
        };
        let offsets = members.iter().scan(1, |next, m| {
            let offset = *next;
            *next += m.workers;
            Some(offset)
        });
        let joins = members.iter().zip(offsets).map(|(member, rank_offset)| {
            let (name, master_address) = (&name, &c.master_address);
            async move {
                match server {
                    InferenceServer::Sglang => {
                        let group = UpdateGroup {
                            master_address,
                            master_port: port,
                            rank_offset,
                            world_size,
                            name,
                            backend,
                        };
                        SglangEngine::new(&member.url, UPDATE_TIMEOUT).init_weights_update_group(&group).await
                    }
                    InferenceServer::Vllm => {
                        let init =
                            TransferInit { master_address, master_port: port, rank_offset, world_size };
                        VllmEngine::control(&member.url, UPDATE_TIMEOUT)
                            .init_weight_transfer_engine(&init)
                            .await
                    }
                }
            }
        });
        let joined = async {
            let answers = futures::future::join_all(joins).await;
            let failures = failures(&members, answers.iter().map(|a| a.as_ref().err()));
            match failures.is_empty() {
                true => Ok(()),
                false => Err(self.replicas_error(version, members.len(), failures)),
            }
        };
        let rendezvous = format!("tcp://{}:{port}", c.master_address);
        let opened = async {
            tokio::task::spawn_blocking(move || match (server, device.is_cuda()) {
                (InferenceServer::Sglang, _) => Ok(Channel::Group { group: served.open()?, barrier: false }),
                (InferenceServer::Vllm, true) => Ok(Channel::Nccl(NcclCommunicator::open(served)?)),
                (InferenceServer::Vllm, false) => {
                    Ok(Channel::Group { group: served.prefixed(&rendezvous)?.open()?, barrier: true })
                }
            })
            .await
            .expect("opening the group does not panic")
            .map_err(group_error)
        };
        // A replica that refuses fails the formation at once; rank 0 gives up at its timeout.
        let ((), channel) = tokio::try_join!(joined, opened)?;
        tracing::info!(group = name, world_size, replicas = members.len(), "weight-update group formed");
        Ok(Formed { name, members, channel: Arc::new(Mutex::new(channel)), version: None })
    }

    /// Tells the replicas of `old` to leave it (a failure is only logged: a replica gone has
    /// left). vLLM has no call for it: a new communicator replaces the old one.
    async fn disband(&self, old: Formed) {
        if self.config.server == InferenceServer::Vllm {
            return;
        }
        let leaves = old.members.iter().map(|m| async {
            let engine = SglangEngine::new(&m.url, Duration::from_secs(30));
            if let Err(error) = engine.destroy_weights_update_group(&old.name).await {
                tracing::info!(replica = m.url, group = old.name, %error, "leaving the old weight-update group");
            }
        });
        futures::future::join_all(leaves).await;
    }

    /// Sends the policy's tensors through `formed`, bucket by bucket; returns the bytes sent.
    async fn send(&self, formed: &Formed, policy: &CausalLm, version: i64) -> Result<u64, SyncError> {
        let mut tensors = policy.merged_tensors();
        tensors.retain(|(name, _)| policy.config().stores(name));
        let buckets = buckets(
            tensors.iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()),
            self.config.bucket_bytes,
        );
        let vllm = self.config.server == InferenceServer::Vllm;
        if vllm {
            self.on_members(formed, |engine| async move {
                engine.pause().await?;
                engine.start_weight_update().await
            })
            .await?;
        }
        let last = buckets.len().saturating_sub(1);
        let mut sent = 0;
        for (i, bucket) in buckets.into_iter().enumerate() {
            let metas: Vec<TensorMeta> = bucket
                .clone()
                .map(|k| {
                    let (name, t) = &tensors[k];
                    TensorMeta { name: name.clone(), dtype: torch_dtype(t.kind()), shape: t.size() }
                })
                .collect();
            // SGLang takes a bucket as one tensor of its bytes, vLLM tensor by tensor.
            let mut parts: Vec<Tensor> = tch::no_grad(|| {
                let parts = bucket.map(|k| tensors[k].1.detach().contiguous());
                match vllm {
                    true => parts.collect(),
                    false => {
                        let bytes: Vec<Tensor> =
                            parts.map(|t| t.flatten(0, -1).view_dtype(Kind::Uint8)).collect();
                        vec![Tensor::cat(&bytes, 0)]
                    }
                }
            });
            sent += parts.iter().map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64).sum::<u64>();
            let (versioned, abort) = ((i == last).then_some(version), self.config.interrupt && i == 0);
            let announce = formed.members.iter().map(|m| {
                let metas = &metas;
                async move {
                    let announced = match vllm {
                        true => VllmEngine::control(&m.url, UPDATE_TIMEOUT).update_weights(metas).await,
                        false => {
                            SglangEngine::new(&m.url, UPDATE_TIMEOUT)
                                .update_weights_from_distributed(metas, &formed.name, versioned, abort)
                                .await
                        }
                    };
                    announced.map_err(|e| SyncError::Remote { url: m.url.clone(), reason: e.to_string() })
                }
            });
            let channel = formed.channel.clone();
            let name = formed.name.clone();
            let broadcast = async {
                tokio::task::spawn_blocking(move || {
                    let channel = channel.lock().expect("one broadcast at a time");
                    parts.iter_mut().try_for_each(|part| channel.broadcast(part))
                })
                .await
                .expect("a broadcast does not panic")
                .map_err(|e| SyncError::Group { name, reason: e.to_string() })
            };
            // Both ends run to completion (a broadcast nobody joins ends at the group's timeout),
            // so that a new group can take the store's port once this attempt failed.
            let (announced, broadcast) = tokio::join!(futures::future::try_join_all(announce), broadcast);
            announced?;
            broadcast?;
        }
        if vllm {
            self.on_members(formed, |engine| async move {
                engine.finish_weight_update(version).await?;
                engine.resume().await
            })
            .await?;
        }
        Ok(sent)
    }

    /// Runs `call` on every vLLM replica of `formed` at once; the first failure is the error.
    async fn on_members<F, Fut>(&self, formed: &Formed, call: F) -> Result<(), SyncError>
    where
        F: Fn(VllmEngine) -> Fut,
        Fut: std::future::Future<Output = Result<(), EngineError>>,
    {
        let calls = formed.members.iter().map(|m| {
            let called = call(VllmEngine::control(&m.url, UPDATE_TIMEOUT));
            async move {
                called.await.map_err(|e| SyncError::Remote { url: m.url.clone(), reason: e.to_string() })
            }
        });
        futures::future::try_join_all(calls).await.map(drop)
    }

    fn replicas_error(&self, version: i64, total: usize, failures: Vec<String>) -> SyncError {
        SyncError::Replicas {
            server: self.config.server.name(),
            version,
            updated: total - failures.len(),
            total,
            failures: if total == 0 { "none found".into() } else { failures.join("; ") },
        }
    }
}

/// Consecutive ranges of tensors (of `sizes` bytes) of at most `limit` bytes each, a larger
/// tensor alone.
fn buckets(sizes: impl Iterator<Item = usize>, limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut buckets: Vec<std::ops::Range<usize>> = Vec::new();
    let mut filled = 0;
    for (i, size) in sizes.enumerate() {
        match buckets.last_mut() {
            Some(last) if filled + size <= limit => {
                last.end = i + 1;
                filled += size;
            }
            _ => {
                buckets.push(i..i + 1);
                filled = size;
            }
        }
    }
    buckets
}

/// `kind` as `torch` names its dtype.
fn torch_dtype(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Int => "int32",
        Kind::Uint8 => "uint8",
        Kind::Bool => "bool",
        other => unreachable!("no model parameter is {other:?}"),
    }
}

/// `replica: error` for each failed answer.
fn failures<'a, R: std::fmt::Display + 'a>(
    replicas: impl IntoIterator<Item = R>,
    errors: impl Iterator<Item = Option<&'a EngineError>>,
) -> Vec<String> {
    replicas.into_iter().zip(errors).filter_map(|(r, e)| e.map(|e| format!("{r}: {e}"))).collect()
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Range;

    #[test]
    fn buckets_fill_up_to_the_limit_and_a_large_tensor_goes_alone() {
        let sizes = [4, 4, 4, 10, 2, 2, 8];
        assert_eq!(buckets(sizes.into_iter(), 8), [0..2, 2..3, 3..4, 4..6, 6..7]);
        assert_eq!(buckets(sizes.into_iter(), 1 << 20), vec![Range { start: 0, end: 7 }]);
        assert!(buckets(std::iter::empty(), 8).is_empty());
    }
}
