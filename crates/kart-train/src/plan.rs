//! `kart plan`: the memory a training run needs on each GPU, estimated from the model's shape, the
//! training config, the cluster and the sequence and batch shape, before anything is loaded.
//!
//! With `P` the policy's parameters (a tied head counted once), `P_layer` one decoder layer's,
//! `P_outer = P - L P_layer` the embeddings, final norm and LM head, `W` the data-parallel ranks
//! (nodes x GPUs per node), `c` the bytes of the compute kind (bf16: 2, f32: 4), `A` the
//! activations' peak:
//! - weights: `c P` on every rank; with `full` sharding `c (L P_layer / W + P_layer + P_outer)`
//!   (the decoder layers sharded, one gathered at a time, the embeddings, final norm and LM head
//!   kept whole);
//! - gradients: `c P`; with `optimizer` sharding (ZeRO-1) also the f32 slice of the summed
//!   gradients the rank updates, `4 P / W`; with `gradients` (ZeRO-2) that slice, and the full
//!   gradients only while a micro-batch's backward pass runs, reduce-scattered and dropped after
//!   it: they grow as the activations are freed, so they add `max(0, c P - A)`; with `full` the
//!   slice and the full gradient of the unit being reduce-scattered, `c max(P_layer, P_outer)`;
//! - optimizer: AdamW's two f32 moments and, in bf16, the f32 master weights, `(8 + 4) P` or
//!   `8 P`; sharded, the rank's slice of both moments and of the f32 master weights, `12 P / W`;
//! - on one GPU nothing is sharded (a single process keeps the whole state);
//! - reference (when `algorithm.kl_loss` is set): weights only, `c P` (sharded as the policy's
//!   with `full`); offloaded, the largest unit moved to the GPU at once, `c max(P_layer, V h)`;
//! - critic (`algorithm.advantage: gae`): the policy's backbone with its (unused) LM head plus a
//!   scalar head, `P + h + 1` parameters, with the weights, gradients (none for an untied LM head)
//!   and AdamW state of the policy's rules;
//! - activations: the peak of one micro-batch (below);
//! - engine (when `rollout.urls` is empty, on rank 0 only): the embedded engine's copy of the
//!   policy, `c P`, and its KV cache of `rollout.max_batch` sequences of `seq_len` tokens,
//!   `c L 2 kv_heads head_dim seq_len max_batch` (the cache grows by doubling, so it may hold up
//!   to twice that; prefill activations are not counted).
//!
//! The figures are for rank 0, the only GPU with the in-process engine. With `full` sharding rank 0
//! also holds the policy (and critic) whole between steps, to publish and save them, without
//! activations: its peak is the larger of a step and that. Not counted: the CUDA
//! context and the caching allocator's fragmentation (together often 1 to 3 GiB), collective
//! buffers (`distributed.bucket_mb`), and the optimizer step's temporaries (a few f32 copies of the
//! largest parameter, after the activations are freed).
//!
//! # Activations
//!
//! The peak of a micro-batch of `N` tokens, `N_t` of them trained, on top of the model states:
//! the larger of the training pass and the scoring pass (old and reference log-probabilities
//! without gradients).
//!
//! Per token and decoder layer, autograd keeps (bytes, `c` the compute kind's):
//! - each RMSNorm (two per layer): its input in f32 (the input itself in f32, a copy in bf16),
//!   its normalised input in `c`, and its output, which the next projections keep: `(4 + 2c) h`;
//! - attention: the rotated queries and keys, the values and the output (a fused kernel, flash or
//!   memory-efficient, keeps no `T x T` matrix) `c (2 q + 2 kv)`, the f32 log-sum-exp `4 heads`;
//!   packed sequences add the output's copy the output projection keeps, `c q`; Qwen3's per-head
//!   norms `(4 + c)(q + kv)`; in bf16 each layer's casts of the rotary cosines and sines for the
//!   queries and the keys, `4 c head_dim`;
//! - the SwiGLU MLP: gate, its SiLU, up and their product, `4 c i`;
//!
//! and once per token the final norm `(4 + 2c) h` and the f32 cosines and sines `8 head_dim`.
//! Padded rows of unequal length add the additive mask, `c rows T²` (counted whenever a
//! micro-batch has several rows).
//!
//! The LM head runs on the `N_t` trained positions only, 1024 at a time: it keeps their hidden
//! states `c h` and their f32 log-softmax `4 V` (with an entropy bonus also its exponential,
//! `4 V`). The peak comes early in the backward pass, when the last chunk (`C = min(1024, N_t)`
//! tokens) has its log-softmax gradient and its logits' gradient in f32 beside everything kept:
//! `8 C V` (`16 C V` with entropy).
//!
//! With activation checkpointing the layers keep only their inputs (and the last layer's output):
//! `c (L + 1) h` per token; the backward pass then recomputes one layer at a time, whose
//! activations and in-flight gradients (of its output and input, `2 c h`, and of the MLP's
//! intermediate, `2 c i`) exist while the LM head's are freed: the peak is the larger of the two
//! phases. The LM head is recomputed too, a chunk at a time: it keeps the trained positions'
//! hidden states `c h` and its f32 values and their gradients, `8` (`16` with entropy), and the
//! chunk's logits, log-softmax and their gradients exist only while the chunk's backward pass
//! runs, `8 C V` (`16 C V` with entropy).
//!
//! The scoring pass keeps nothing: one layer's MLP temporaries `4 c i N`, or a chunk's f32 logits,
//! log-softmax, its exponential and their product `16 C V`, beside the hidden states `2 c h N`.

use crate::batch::MicroBatching;
use kart_core::config::ConfigError;
use kart_core::config::memory::{Precision, Sharding};
use kart_core::config::train::{AdvantageEstimator, TrainConfig};
use kart_model::ModelConfig;
use kart_model::logprobs::DEFAULT_CHUNK;
use kart_model::lora::Adapters;
use kart_model::transformer::parameter_count;
use serde::Serialize;

/// The run a plan is made for.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    /// The policy's shape.
    pub model: &'a ModelConfig,
    /// The fields read: `precision` (unset: bf16, as on CUDA), `activation_checkpointing`,
    /// `sharding`, `reference.offload`, `algorithm.kl_loss`, `algorithm.advantage`,
    /// `algorithm.entropy_coef`, `batch.micro_batch_size`, `batch.micro_batch_tokens`,
    /// `rollout.urls` and `rollout.max_batch`.
    pub config: &'a TrainConfig,
    /// Nodes of the run.
    pub nodes: usize,
    /// GPUs (ranks) per node.
    pub gpus_per_node: usize,
    /// Tokens of the longest trajectory, prompt included.
    pub seq_len: usize,
    /// Tokens of a trajectory the loss trains (the model's turns), at most `seq_len`.
    pub response_len: usize,
}

/// The estimated memory of one GPU of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Data-parallel ranks (nodes x GPUs per node).
    pub world_size: usize,
    /// The compute kind planned for.
    pub precision: Precision,
    /// What the ranks shard (`none` on one GPU).
    pub sharding: Sharding,
    /// Whether decoder layers are recomputed in the backward pass.
    pub activation_checkpointing: bool,
    /// Parameters of the policy (a tied head counted once).
    pub parameters: u64,
    /// Tokens of one forward/backward pass, padding included.
    pub tokens_per_micro_batch: u64,
    /// Of those, the tokens the LM head runs on.
    pub trained_per_micro_batch: u64,
    /// Bytes of each part on rank 0 during a step.
    pub parts: Parts,
    /// With `full` sharding, rank 0's bytes between steps, when it holds the policy (and critic)
    /// whole to publish and save them and no activations; 0 otherwise.
    pub between_steps: u64,
}

/// Bytes per GPU of each part of a run's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Parts {
    /// The policy's parameters.
    pub weights: u64,
    /// The policy's gradients.
    pub gradients: u64,
    /// AdamW's moments and f32 master weights of the policy.
    pub optimizer: u64,
    /// The frozen reference policy of the KL loss.
    pub reference: u64,
    /// The critic's weights, gradients and optimizer state (PPO).
    pub critic: u64,
    /// The peak of a micro-batch's activations.
    pub activations: u64,
    /// The in-process engine's weights and KV cache (rank 0).
    pub engine: u64,
}

impl Parts {
    /// The parts by name, in the order they are listed.
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer", self.optimizer),
            ("reference", self.reference),
            ("critic", self.critic),
            ("activations", self.activations),
            ("engine", self.engine),
        ]
    }
}

impl MemoryPlan {
    /// Rank 0's peak: all parts of a step, or what it holds between steps when that is more.
    pub fn total(&self) -> u64 {
        self.step().max(self.between_steps)
    }

    /// Bytes of all parts during a step.
    pub fn step(&self) -> u64 {
        self.parts.named().iter().map(|(_, bytes)| bytes).sum()
    }

    /// Whether the run fits a GPU of `gpu_bytes`.
    pub fn fits(&self, gpu_bytes: u64) -> bool {
        self.total() <= gpu_bytes
    }
}

/// The shapes of a decoder, as element counts.
#[derive(Debug, Clone, Copy)]
struct Dims {
    layers: u64,
    hidden: u64,
    /// Query width, `heads x head_dim`.
    q: u64,
    /// Key (and value) width, `kv_heads x head_dim`.
    kv: u64,
    inter: u64,
    heads: u64,
    head_dim: u64,
    vocab: u64,
    qk_norm: bool,
}

impl Dims {
    fn of(m: &ModelConfig) -> Self {
        let n = |x: usize| x as u64;
        Dims {
            layers: n(m.num_hidden_layers),
            hidden: n(m.hidden_size),
            q: n(m.num_attention_heads * m.head_dim),
            kv: n(m.num_key_value_heads * m.head_dim),
            inter: n(m.intermediate_size),
            heads: n(m.num_attention_heads),
            head_dim: n(m.head_dim),
            vocab: n(m.vocab_size),
            qk_norm: m.qk_norm,
        }
    }
}

/// The peak bytes of the activations of a micro-batch of `shape` (see the module docs).
fn activations(d: Dims, c: u64, shape: PassShape, entropy: bool, checkpointing: bool) -> u64 {
    let PassShape { tokens: n, trained: n_t, rows, seq_len, packed } = shape;
    let h = d.hidden;
    let norm = (4 + 2 * c) * h;
    let rope_casts = if c < 4 { 4 * c * d.head_dim } else { 0 };
    let attention = c * (2 * d.q + 2 * d.kv) + 4 * d.heads + if packed { c * d.q } else { 0 };
    let qk_norm = if d.qk_norm { (4 + c) * (d.q + d.kv) } else { 0 };
    let layer = 2 * norm + attention + qk_norm + rope_casts + 4 * c * d.inter;
    let once = norm + 8 * d.head_dim;
    let mask = if !packed && rows > 1 { c * rows * seq_len * seq_len } else { 0 };

    let e = u64::from(entropy);
    let chunk = n_t.min(DEFAULT_CHUNK as u64);
    let chunk_backward = chunk * d.vocab * 4 * (2 + 2 * e);
    let lm_head = match checkpointing {
        true => n_t * (c * h + 8 * (1 + e)) + chunk_backward,
        false => n_t * (c * h + 4 * d.vocab * (1 + e)) + chunk_backward,
    };

    let train = if checkpointing {
        let kept = n * (c * (d.layers + 1) * h + once) + mask;
        let recompute = n * (layer + 2 * c * h + 2 * c * d.inter);
        kept + lm_head.max(recompute)
    } else {
        n * (d.layers * layer + once) + mask + lm_head
    };
    let score = 2 * c * h * n + (4 * c * d.inter * n).max(16 * chunk * d.vocab) + mask;
    train.max(score)
}

/// The tokens of one forward/backward pass.
#[derive(Debug, Clone, Copy)]
struct PassShape {
    /// Tokens, padding included.
    tokens: u64,
    /// Tokens the LM head runs on.
    trained: u64,
    /// Rows (padded) or 1 (packed).
    rows: u64,
    seq_len: u64,
    packed: bool,
}

/// How the model states of one model divide over the ranks.
#[derive(Debug, Clone, Copy)]
struct States {
    /// Bytes of the compute kind.
    c: u64,
    /// Bytes per parameter of an unsharded optimizer state.
    optimizer: u64,
    sharding: Sharding,
    world: u64,
}

impl States {
    /// Bytes of the weights of `all` parameters, `layer` of them one decoder layer's and `outer`
    /// outside the decoder layers.
    fn weights(&self, all: u64, layer: u64, outer: u64) -> u64 {
        self.c
            * match self.sharding {
                Sharding::Full => (all - outer).div_ceil(self.world) + layer + outer,
                _ => all,
            }
    }

    /// Bytes of the gradients of `all` parameters, `trained` of them getting one, when `room`
    /// bytes of activations are freed by the time a micro-batch's gradients are whole.
    fn gradients(&self, all: u64, trained: u64, layer: u64, outer: u64, room: u64) -> u64 {
        let slice = 4 * all.div_ceil(self.world);
        match self.sharding {
            Sharding::None => self.c * trained,
            Sharding::Optimizer => self.c * trained + slice,
            Sharding::Gradients => slice + (self.c * trained).saturating_sub(room),
            Sharding::Full => slice + self.c * layer.max(outer),
        }
    }

    /// Bytes of the optimizer state of `all` parameters.
    fn optimizer(&self, all: u64) -> u64 {
        match self.sharding {
            Sharding::None => self.optimizer * all,
            _ => 12 * all.div_ceil(self.world),
        }
    }
}

/// The memory plan of `w`; errors name the field and its value.
pub fn plan(w: &Workload<'_>) -> Result<MemoryPlan, ConfigError> {
    let config = w.config;
    let positive = |field: &'static str, value: usize| match value {
        0 => Err(ConfigError::new(field, 0, "must be at least 1")),
        _ => Ok(value as u64),
    };
    let world = positive("nodes", w.nodes)? * positive("gpus_per_node", w.gpus_per_node)?;
    let seq_len = positive("seq_len", w.seq_len)?;
    if w.response_len > w.seq_len {
        return Err(ConfigError::new("response_len", w.response_len, "must not exceed seq_len"));
    }
    if config.sharding == Sharding::Full && !config.activation_checkpointing {
        return Err(ConfigError::new("sharding", "full", "needs activation_checkpointing: true"));
    }
    if config.sharding == Sharding::Full && config.lora.is_some() {
        return Err(ConfigError::new("sharding", "full", "LoRA trains adapters on a replicated base"));
    }
    let (tokens, rows, packed) = match MicroBatching::of(&config.batch) {
        MicroBatching::Padded { size } => {
            let rows = positive("batch.micro_batch_size", size)?;
            (rows * seq_len, rows, false)
        }
        MicroBatching::Packed { tokens } => {
            (positive("batch.micro_batch_tokens", tokens)?.max(seq_len), 1, true)
        }
    };
    let trained = (tokens * w.response_len as u64).div_ceil(seq_len);
    let shape = PassShape { tokens, trained, rows, seq_len, packed };

    let precision = Precision::resolve(config.precision, true);
    let c = match precision {
        Precision::Bf16 => 2,
        Precision::F32 => 4,
    };
    let states = States {
        c,
        optimizer: match precision {
            Precision::Bf16 => 12,
            Precision::F32 => 8,
        },
        sharding: if world == 1 { Sharding::None } else { config.sharding },
        world,
    };
    let d = Dims::of(w.model);
    let all = parameter_count(w.model, "");
    let layer = parameter_count(w.model, "model.layers.0.");
    let outer = all - d.layers * layer;
    let head = d.vocab * d.hidden;

    let reference = match (config.algorithm.kl_loss, config.reference.offload) {
        (None, _) => 0,
        (Some(_), false) => states.weights(all, layer, outer),
        (Some(_), true) => c * layer.max(head),
    };
    let entropy = config.algorithm.entropy_coef != 0.0;
    let activations = activations(d, c, shape, entropy, config.activation_checkpointing);
    let gradients = states.gradients(all, all, layer, outer, activations);
    // The critic's update runs after the policy's, whose peak its full gradients (ZeRO-2) reuse.
    let critic = match config.algorithm.advantage {
        AdvantageEstimator::Gae => {
            let (critic_all, critic_outer) = (all + d.hidden + 1, outer + d.hidden + 1);
            let trained = if w.model.tie_word_embeddings { critic_all } else { critic_all - head };
            let room = activations.max(c * all);
            states.weights(critic_all, layer, critic_outer)
                + states.gradients(critic_all, trained, layer, critic_outer, room)
                + states.optimizer(critic_all)
        }
        _ => 0,
    };
    let engine = match config.rollout.urls.is_empty() {
        true => {
            let kv_cache = d.layers * 2 * d.kv * seq_len * config.rollout.max_batch as u64;
            c * (all + kv_cache)
        }
        false => 0,
    };
    // With `full`, rank 0 keeps the policy and critic whole between steps: their gathered
    // layers take the place of the activations.
    let critic_layers = match config.algorithm.advantage {
        AdvantageEstimator::Gae => c * (all - outer),
        _ => 0,
    };
    let gathered = match states.sharding {
        Sharding::Full => c * all - states.weights(all, layer, outer) + critic_layers,
        _ => 0,
    };
    let parts = match config.lora.as_ref().map(|lora| Adapters::parameter_count(lora, w.model)) {
        None => Parts {
            weights: states.weights(all, layer, outer),
            gradients,
            optimizer: states.optimizer(all),
            reference,
            critic,
            activations,
            engine,
        },
        // LoRA: the frozen base replicated in the compute kind beside f32 adapters, which alone
        // have gradients and AdamW's two moments (f32, so no masters); the reference is the
        // base itself.
        Some(adapters) => Parts {
            weights: c * all + 4 * adapters,
            gradients: 4 * adapters,
            optimizer: 8 * adapters,
            reference: 0,
            critic,
            activations,
            engine,
        },
    };
    Ok(MemoryPlan {
        world_size: world as usize,
        precision,
        sharding: states.sharding,
        activation_checkpointing: config.activation_checkpointing,
        parameters: all,
        tokens_per_micro_batch: shape.tokens,
        trained_per_micro_batch: shape.trained,
        between_steps: match gathered {
            0 => 0,
            _ => parts.named().iter().map(|(_, bytes)| bytes).sum::<u64>() - activations + gathered,
        },
        parts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kart_core::config::train::BatchConfig;
    use kart_model::QwenSizes;

    /// A Qwen2-shaped model: 4 layers, untied head.
    fn model() -> ModelConfig {
        ModelConfig::qwen2(QwenSizes {
            vocab_size: 1000,
            hidden_size: 64,
            intermediate_size: 160,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 512,
            tie_word_embeddings: false,
            initializer_range: 0.02,
        })
        .unwrap()
    }

    /// bf16, no reference, no critic, no engine, 2 rows of 256 tokens.
    fn config() -> TrainConfig {
        let mut c = TrainConfig { precision: Some(Precision::Bf16), ..TrainConfig::default() };
        c.algorithm.kl_loss = None;
        c.rollout.urls = vec!["http://rollout:8000".into()];
        c.batch = BatchConfig { micro_batch_size: 2, ..BatchConfig::default() };
        c
    }

    fn plan_of(config: &TrainConfig, gpus: usize) -> MemoryPlan {
        let model = model();
        plan(&Workload {
            model: &model,
            config,
            nodes: 1,
            gpus_per_node: gpus,
            seq_len: 256,
            response_len: 192,
        })
        .unwrap()
    }

    #[test]
    fn parameters_are_counted_like_the_model_builds_them() {
        let m = model();
        let layer = 64 * (64 + 32 + 32 + 64) + (64 + 32 + 32) + 2 * 64 + 3 * 64 * 160;
        assert_eq!(parameter_count(&m, "model.layers.0."), layer);
        assert_eq!(plan_of(&config(), 1).parameters, 4 * layer + 2 * 1000 * 64 + 64);
    }

    #[test]
    fn bf16_keeps_master_weights_and_halves_the_rest() {
        let bf16 = plan_of(&config(), 1);
        let f32 = plan_of(&TrainConfig { precision: Some(Precision::F32), ..config() }, 1);
        let p = bf16.parameters;
        assert_eq!((bf16.parts.weights, bf16.parts.gradients, bf16.parts.optimizer), (2 * p, 2 * p, 12 * p));
        assert_eq!((f32.parts.weights, f32.parts.gradients, f32.parts.optimizer), (4 * p, 4 * p, 8 * p));
        assert!(bf16.parts.activations < f32.parts.activations);
        // Unset precision plans for CUDA: bf16.
        assert_eq!(plan_of(&TrainConfig { precision: None, ..config() }, 1), bf16);
    }

    #[test]
    fn sharding_divides_the_sharded_states_by_the_world() {
        let mut c = config();
        c.activation_checkpointing = true;
        let one = plan_of(&c, 1);
        let p = one.parameters;
        let layer = parameter_count(&model(), "model.layers.0.");
        let outer = p - 4 * layer;
        let at = |sharding| plan_of(&TrainConfig { sharding, ..c.clone() }, 8).parts;
        let none = at(Sharding::None);
        assert_eq!(none, one.parts, "without sharding the world size changes nothing");
        let slice = 4 * p.div_ceil(8);
        let zero1 = at(Sharding::Optimizer);
        assert_eq!((zero1.weights, zero1.gradients), (2 * p, 2 * p + slice));
        assert_eq!(zero1.optimizer, 12 * p.div_ceil(8));
        let zero2 = at(Sharding::Gradients);
        assert_eq!((zero2.weights, zero2.optimizer), (2 * p, zero1.optimizer));
        assert!(zero2.activations > 2 * p, "the full gradients fit where the activations were");
        assert_eq!(zero2.gradients, slice);
        let zero2 = States { c: 2, optimizer: 12, sharding: Sharding::Gradients, world: 8 };
        assert_eq!(zero2.gradients(800, 800, 0, 0, 1000), 400 + 600);
        let full = at(Sharding::Full);
        assert_eq!(full.weights, 2 * ((4 * layer).div_ceil(8) + layer + outer));
        assert_eq!((full.gradients, full.optimizer), (slice + 2 * layer.max(outer), zero1.optimizer));
        assert_eq!(full.activations, none.activations);
        let full_plan = plan_of(&TrainConfig { sharding: Sharding::Full, ..c.clone() }, 8);
        let whole = full_plan.step() - full.activations - full.weights + 2 * p;
        assert_eq!(full_plan.between_steps, whole, "rank 0 holds the policy whole between steps");
        assert_eq!(full_plan.total(), full_plan.step().max(whole));
        assert_eq!(plan_of(&TrainConfig { sharding: Sharding::Gradients, ..c.clone() }, 8).between_steps, 0);
        let single = plan_of(&TrainConfig { sharding: Sharding::Optimizer, ..c.clone() }, 1);
        assert_eq!(
            (single.sharding, single.parts),
            (Sharding::None, one.parts),
            "one process shards nothing"
        );
        let no_checkpointing = TrainConfig { sharding: Sharding::Full, activation_checkpointing: false, ..c };
        let model = model();
        let w = Workload {
            model: &model,
            config: &no_checkpointing,
            nodes: 2,
            gpus_per_node: 4,
            seq_len: 8,
            response_len: 8,
        };
        assert_eq!(plan(&w).unwrap_err().field, "sharding");
    }

    #[test]
    fn checkpointing_keeps_only_layer_inputs() {
        let plain = plan_of(&config(), 1).parts.activations;
        let recomputing = TrainConfig { activation_checkpointing: true, ..config() };
        let checkpointed = plan_of(&recomputing, 1).parts.activations;
        assert!(checkpointed < plain, "{checkpointed} vs {plain}");
        // Without trained tokens (no LM head) the decoder's share shows: a layer's activations
        // are a few dozen times its input.
        let model = model();
        let decoder = |config| {
            let w =
                Workload { model: &model, config, nodes: 1, gpus_per_node: 1, seq_len: 256, response_len: 0 };
            plan(&w).unwrap().parts.activations
        };
        let (plain, checkpointed) = (decoder(&config()), decoder(&recomputing));
        assert!(checkpointed < plain / 2, "{checkpointed} vs {plain}");
    }

    #[test]
    fn the_reference_is_weights_only_and_offloading_keeps_one_unit_on_the_gpu() {
        let mut c = config();
        c.algorithm.kl_loss = Some(kart_core::rl::kl::KlEstimator::LowVarKl);
        let resident = plan_of(&c, 1);
        assert_eq!(resident.parts.reference, 2 * resident.parameters);
        c.reference.offload = true;
        let offloaded = plan_of(&c, 1).parts;
        assert_eq!(offloaded.reference, 2 * 1000 * 64, "the LM head, the largest unit");
        assert_eq!(offloaded.weights, resident.parts.weights);
    }

    /// LoRA: the base in bf16 beside f32 adapters, which alone have gradients and optimiser
    /// state; no second copy for the reference.
    #[test]
    fn lora_counts_the_adapters_states_and_no_reference() {
        use kart_core::config::lora::{AllLinear, LoraConfig, TargetModules};
        let mut c = config();
        c.algorithm.kl_loss = Some(kart_core::rl::kl::KlEstimator::LowVarKl);
        let full = plan_of(&c, 1);
        let lora = LoraConfig {
            r: 8,
            target_modules: TargetModules::AllLinear(AllLinear::AllLinear),
            ..Default::default()
        };
        c.lora = Some(lora);
        let adapted = plan_of(&c, 1);
        // r (in + out) per projection: q, k, v, o, gate, up, down of 4 layers.
        let adapters = 4 * 8 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 160));
        assert_eq!(adapted.parts.weights, 2 * adapted.parameters + 4 * adapters);
        assert_eq!((adapted.parts.gradients, adapted.parts.optimizer), (4 * adapters, 8 * adapters));
        assert_eq!(adapted.parts.reference, 0);
        assert_eq!(adapted.parts.activations, full.parts.activations);
        assert!(full.parts.optimizer > 10 * adapted.parts.optimizer);
        c.sharding = Sharding::Full;
        c.activation_checkpointing = true;
        let e = plan(&Workload {
            model: &model(),
            config: &c,
            nodes: 1,
            gpus_per_node: 2,
            seq_len: 256,
            response_len: 192,
        });
        assert!(e.unwrap_err().to_string().starts_with("sharding = full"));
    }

    #[test]
    fn the_critic_and_the_engine_add_their_parts() {
        let mut c = config();
        c.algorithm.advantage = AdvantageEstimator::Gae;
        let ppo = plan_of(&c, 1);
        let p = ppo.parameters;
        let critic = p + 64 + 1;
        assert_eq!(ppo.parts.critic, 2 * critic + 2 * (critic - 1000 * 64) + 12 * critic);
        c.rollout.urls.clear();
        c.rollout.max_batch = 8;
        let colocated = plan_of(&c, 1).parts;
        assert_eq!(colocated.engine, 2 * (p + 4 * 2 * 32 * 256 * 8));
    }

    #[test]
    fn micro_batches_set_the_tokens_and_errors_name_the_field() {
        let packed = TrainConfig {
            batch: BatchConfig { micro_batch_tokens: Some(1024), ..config().batch },
            ..config()
        };
        let p = plan_of(&packed, 1);
        assert_eq!((p.tokens_per_micro_batch, p.trained_per_micro_batch), (1024, 768));
        let padded = plan_of(&config(), 1);
        assert_eq!((padded.tokens_per_micro_batch, padded.trained_per_micro_batch), (512, 384));
        assert!(padded.parts.activations < p.parts.activations);
        let model = model();
        let zero = TrainConfig { batch: BatchConfig { micro_batch_size: 0, ..config().batch }, ..config() };
        let w = Workload {
            model: &model,
            config: &zero,
            nodes: 1,
            gpus_per_node: 1,
            seq_len: 8,
            response_len: 8,
        };
        let err = plan(&w).unwrap_err();
        assert_eq!((err.field.as_str(), err.value.as_str()), ("batch.micro_batch_size", "0"));
        let long = Workload { response_len: 9, config: &packed, ..w };
        assert_eq!(plan(&long).unwrap_err().field, "response_len");
        assert!(plan_of(&config(), 1).fits(1 << 30));
        assert!(!plan_of(&config(), 1).fits(1 << 20));
    }
}
