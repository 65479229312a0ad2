//! The decoder-only transformer of Qwen2, Qwen3 and Llama, computing what transformers computes.
//!
//! The three families share one block: RMSNorm, grouped-query attention with rotary embeddings,
//! RMSNorm, SwiGLU MLP, with residual connections. They differ only in details the config carries:
//! Qwen2 has biases on q/k/v, Qwen3 normalises each query and key head (RMSNorm over `head_dim`) and
//! may set `head_dim` explicitly, Llama may use biases everywhere (`attention_bias`, `mlp_bias`).
//! Parameters live in a [`VarStore`] under their Hugging Face names, so the optimiser trains them in
//! place and saving writes a folder transformers loads. A model comes from a checkpoint
//! ([`CausalLm::load`]) or from a seeded random initialisation ([`CausalLm::random`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::nn::{Path as VarPath, VarStore};
use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::lora::{self, Adaptable, Adapter, Adapters};
use crate::offload::Offload;
use crate::prepacked::{Kernels, Prepacked};
use crate::residency::Residency;
use crate::rope::{self, RotaryEmbedding};
use crate::weights::Weights;
use kart_core::config::lora::{LoraConfig, Projection};

/// Registers `t` as the trainable variable with the dotted Hugging Face `name` (tch paths cannot hold
/// dots in a variable name, so each dotted part becomes a sub-path).
fn var(p: &VarPath, name: &str, t: &Tensor) -> Tensor {
    let mut parts: Vec<&str> = name.split('.').collect();
    let leaf = parts.pop().expect("split yields at least one part");
    match parts.split_first() {
        Some((first, rest)) => rest.iter().fold(p.sub(first), |path, part| path.sub(part)).var_copy(leaf, t),
        None => p.var_copy(leaf, t),
    }
}

/// Takes the tensor `name` of the expected shape from the checkpoint and registers it as a variable.
pub(crate) fn param(p: &VarPath, w: &mut Weights, name: &str, shape: &[i64]) -> Result<Tensor, ModelError> {
    Ok(var(p, name, &w.take(name, shape)?))
}

/// A linear layer `x W^T + b`, with a LoRA adapter's update where one is attached.
#[derive(Debug)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// `weight` packed for generation's kernels.
    packed: Prepacked,
    adapter: Option<Adapter>,
}

impl Linear {
    fn load(
        p: &VarPath,
        w: &mut Weights,
        prefix: &str,
        out: i64,
        inp: i64,
        bias: bool,
    ) -> Result<Self, ModelError> {
        let weight = param(p, w, &format!("{prefix}.weight"), &[out, inp])?;
        let bias = if bias { Some(param(p, w, &format!("{prefix}.bias"), &[out])?) } else { None };
        Ok(Linear { weight, bias, packed: Prepacked::default(), adapter: None })
    }

    fn forward(&self, x: &Tensor, kernels: Kernels) -> Tensor {
        let packed = match kernels {
            Kernels::Prepacked => self.packed.linear(x, &self.weight, self.bias.as_ref()),
            Kernels::Standard => None,
        };
        let y = packed.unwrap_or_else(|| x.linear(&self.weight, self.bias.as_ref()));
        match &self.adapter {
            Some(adapter) => adapter.add(x, y),
            None => y,
        }
    }
}

/// Root-mean-square normalisation, computed in f32 as transformers does.
#[derive(Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn load(p: &VarPath, w: &mut Weights, name: &str, dim: i64, eps: f64) -> Result<Self, ModelError> {
        let weight = param(p, w, &format!("{name}.weight"), &[dim])?;
        Ok(RmsNorm { weight, eps })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let x32 = x.to_kind(Kind::Float);
        let variance = x32.square().mean_dim(-1, true, Kind::Float);
        let normed = x32 * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(kind)
    }
}

/// Grouped-query self-attention.
#[derive(Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3's per-head RMSNorm on queries and keys.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn load(p: &VarPath, w: &mut Weights, prefix: &str, c: &ModelConfig) -> Result<Self, ModelError> {
        let (hidden, heads, kv_heads, head_dim) = (
            c.hidden_size as i64,
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
            c.head_dim as i64,
        );
        let (qkv_bias, o_bias) = (c.qkv_bias(), c.o_proj_bias());
        let qk_norm = if c.qk_norm {
            Some((
                RmsNorm::load(p, w, &format!("{prefix}.q_norm"), head_dim, c.rms_norm_eps)?,
                RmsNorm::load(p, w, &format!("{prefix}.k_norm"), head_dim, c.rms_norm_eps)?,
            ))
        } else {
            None
        };
        Ok(Attention {
            q_proj: Linear::load(p, w, &format!("{prefix}.q_proj"), heads * head_dim, hidden, qkv_bias)?,
            k_proj: Linear::load(p, w, &format!("{prefix}.k_proj"), kv_heads * head_dim, hidden, qkv_bias)?,
            v_proj: Linear::load(p, w, &format!("{prefix}.v_proj"), kv_heads * head_dim, hidden, qkv_bias)?,
            o_proj: Linear::load(p, w, &format!("{prefix}.o_proj"), hidden, heads * head_dim, o_bias)?,
            qk_norm,
            heads,
            kv_heads,
            head_dim,
        })
    }

    /// `x`: `(B, T, hidden)`, its queries attending as `attend` says.
    fn forward(
        &self,
        x: &Tensor,
        rot: &(Tensor, Tensor),
        attend: Attend<'_>,
        cache: Option<(&mut KvCache, usize)>,
        kernels: Kernels,
    ) -> Tensor {
        let (b, t, _) = x.size3().expect("(B, T, hidden)");
        let split = |y: Tensor, n: i64| y.view([b, t, n, self.head_dim]);
        let (mut q, mut k) = (
            split(self.q_proj.forward(x, kernels), self.heads),
            split(self.k_proj.forward(x, kernels), self.kv_heads),
        );
        let v = split(self.v_proj.forward(x, kernels), self.kv_heads).transpose(1, 2);
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            q = q_norm.forward(&q);
            k = k_norm.forward(&k);
        }
        let q = rope::apply(&q.transpose(1, 2), &rot.0, &rot.1);
        let k = rope::apply(&k.transpose(1, 2), &rot.0, &rot.1);
        let (k, v) = match cache {
            Some((cache, layer)) => cache.append(layer, &k, &v),
            None => (k, v),
        };
        // Grouped-query attention without copying keys and values per query head: a single query
        // per row folds the query heads of each key/value head into that head's query rows
        // (transformers' `pack_gqa`); longer queries let the kernel share heads (`enable_gqa`).
        let groups = self.heads / self.kv_heads;
        let scale = (self.head_dim as f64).powf(-0.5);
        let sdpa = |q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, causal: bool| {
            Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, groups > 1)
        };
        let mask = match attend {
            Attend::Mask(mask) => Some(mask),
            _ => None,
        };
        let out =
            match attend {
                // Each packed sequence attends causally to itself alone: one product per sequence, no
                // (T, T) mask.
                Attend::Segments(lengths) => {
                    let mut at = 0;
                    let parts: Vec<Tensor> = lengths
                        .iter()
                        .map(|&len| {
                            let part = |x: &Tensor| x.narrow(2, at, len);
                            let out = sdpa(&part(&q), &part(&k), &part(&v), None, len > 1);
                            at += len;
                            out
                        })
                        .collect();
                    Tensor::cat(&parts, 2)
                }
                _ if t == 1 && groups > 1 => {
                    let q = q.reshape([b, self.kv_heads, groups, self.head_dim]);
                    Tensor::scaled_dot_product_attention(&q, &k, &v, mask, 0.0, false, scale, false)
                        .reshape([b, self.heads, 1, self.head_dim])
                }
                _ => sdpa(&q, &k, &v, mask, mask.is_none() && t > 1),
            };
        self.o_proj.forward(&out.transpose(1, 2).reshape([b, t, self.heads * self.head_dim]), kernels)
    }
}

/// How the queries of a forward pass attend to the keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attend<'a> {
    /// Each query to itself and the keys before it (or, with a cache, all cached keys).
    Causal,
    /// Through an additive `(B, 1, T, Tk)` mask.
    Mask(&'a Tensor),
    /// One row of sequences packed back to back, of these lengths: each query to the keys of its
    /// own sequence up to itself.
    Segments(&'a [i64]),
}

impl<'a> Attend<'a> {
    /// `mask` when there is one, else plain causal attention.
    fn from_mask(mask: Option<&'a Tensor>) -> Self {
        mask.map_or(Attend::Causal, Attend::Mask)
    }
}

/// The SwiGLU feed-forward block.
#[derive(Debug)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn load(p: &VarPath, w: &mut Weights, prefix: &str, c: &ModelConfig) -> Result<Self, ModelError> {
        let (hidden, inter) = (c.hidden_size as i64, c.intermediate_size as i64);
        Ok(Mlp {
            gate_proj: Linear::load(p, w, &format!("{prefix}.gate_proj"), inter, hidden, c.mlp_bias)?,
            up_proj: Linear::load(p, w, &format!("{prefix}.up_proj"), inter, hidden, c.mlp_bias)?,
            down_proj: Linear::load(p, w, &format!("{prefix}.down_proj"), hidden, inter, c.mlp_bias)?,
        })
    }

    fn forward(&self, x: &Tensor, kernels: Kernels) -> Tensor {
        let gated = self.gate_proj.forward(x, kernels).silu() * self.up_proj.forward(x, kernels);
        self.down_proj.forward(&gated, kernels)
    }
}

/// One pre-norm transformer block.
#[derive(Debug)]
pub(crate) struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    fn load(p: &VarPath, w: &mut Weights, i: usize, c: &ModelConfig) -> Result<Self, ModelError> {
        let prefix = format!("model.layers.{i}");
        let hidden = c.hidden_size as i64;
        Ok(DecoderLayer {
            input_layernorm: RmsNorm::load(
                p,
                w,
                &format!("{prefix}.input_layernorm"),
                hidden,
                c.rms_norm_eps,
            )?,
            self_attn: Attention::load(p, w, &format!("{prefix}.self_attn"), c)?,
            post_attention_layernorm: RmsNorm::load(
                p,
                w,
                &format!("{prefix}.post_attention_layernorm"),
                hidden,
                c.rms_norm_eps,
            )?,
            mlp: Mlp::load(p, w, &format!("{prefix}.mlp"), c)?,
        })
    }

    /// Its linear projection `p`.
    fn projection_mut(&mut self, p: Projection) -> &mut Linear {
        match p {
            Projection::QProj => &mut self.self_attn.q_proj,
            Projection::KProj => &mut self.self_attn.k_proj,
            Projection::VProj => &mut self.self_attn.v_proj,
            Projection::OProj => &mut self.self_attn.o_proj,
            Projection::GateProj => &mut self.mlp.gate_proj,
            Projection::UpProj => &mut self.mlp.up_proj,
            Projection::DownProj => &mut self.mlp.down_proj,
        }
    }

    /// Its linear projection `p`.
    fn projection(&self, p: Projection) -> &Linear {
        match p {
            Projection::QProj => &self.self_attn.q_proj,
            Projection::KProj => &self.self_attn.k_proj,
            Projection::VProj => &self.self_attn.v_proj,
            Projection::OProj => &self.self_attn.o_proj,
            Projection::GateProj => &self.mlp.gate_proj,
            Projection::UpProj => &self.mlp.up_proj,
            Projection::DownProj => &self.mlp.down_proj,
        }
    }

    /// The block on `h` `(B, T, hidden)`: attention and MLP, each behind its norm and around a
    /// residual connection.
    pub(crate) fn forward(
        &self,
        h: &Tensor,
        rot: &(Tensor, Tensor),
        attend: Attend<'_>,
        cache: Option<(&mut KvCache, usize)>,
        kernels: Kernels,
    ) -> Tensor {
        let attn = self.self_attn.forward(&self.input_layernorm.forward(h), rot, attend, cache, kernels);
        let h = h + attn;
        let mlp = self.mlp.forward(&self.post_attention_layernorm.forward(&h), kernels);
        h + mlp
    }
}

/// How the tokens of a forward pass without a cache are laid out.
#[derive(Debug)]
pub enum Layout {
    /// Rows padded on the right; `valid` `(B, T)` marks the real tokens (`None`: all are).
    Padded { valid: Option<Tensor> },
    /// One row of sequences back to back, of these lengths, positions restarting at each: no
    /// padding, and no sequence attends to another.
    Packed { lengths: Vec<i64> },
}

/// A causal language model: embeddings, decoder layers, final norm and LM head.
#[derive(Debug)]
pub struct CausalLm {
    config: ModelConfig,
    vs: VarStore,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when the head is tied to the embeddings.
    lm_head: Option<Tensor>,
    /// The head's weight packed for generation's kernels.
    lm_head_packed: Prepacked,
    rope: RotaryEmbedding,
    /// Where the decoder layers' weights live between uses (`None`: on the device).
    residency: Option<Box<dyn Residency>>,
    /// LoRA adapters on the decoder's projections.
    lora: Option<Adapters>,
}

impl CausalLm {
    /// Loads a Hugging Face model folder onto `device`: f32 on the CPU, bf16 on CUDA.
    pub fn load(dir: &Path, device: Device) -> Result<Self, ModelError> {
        Self::load_as(dir, device, default_kind(device))
    }

    /// Loads a Hugging Face model folder onto `device` with parameters of `kind` (f32 or bf16).
    pub fn load_as(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = ModelConfig::load(dir)?;
        let weights = Weights::load(dir, device, Kind::Float)?;
        Self::build(config, weights, device, kind)
    }

    /// A model of `config` with fresh weights, drawn as transformers' `_init_weights` draws them:
    /// linear and embedding weights from N(0, `initializer_range`²) (the padding token's
    /// embedding zero), biases zero, RMSNorm weights one. The same seed gives the same weights on
    /// any device; f32 on the CPU, bf16 on CUDA.
    pub fn random(config: ModelConfig, device: Device, seed: u64) -> Result<Self, ModelError> {
        let std = config.initializer_range();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        for Parameter { name, shape, init } in parameters(&config) {
            let options = (Kind::Float, device);
            let tensor = match init {
                Init::Normal => {
                    let numel = shape.iter().product::<i64>() as usize;
                    Tensor::from_slice(&normal(&mut rng, numel, std)).view(shape.as_slice()).to_device(device)
                }
                Init::Zeros => Tensor::zeros(shape.as_slice(), options),
                Init::Ones => Tensor::ones(shape.as_slice(), options),
            };
            tensors.insert(name, tensor);
        }
        if let Some(pad) = config.pad_token_id.filter(|&id| (0..config.vocab_size as i64).contains(&id)) {
            let embed = &tensors["model.embed_tokens.weight"];
            let _ = embed.get(pad).zero_();
        }
        let weights = Weights::from_tensors(PathBuf::from("(random initialisation)"), tensors);
        Self::build(config, weights, device, default_kind(device))
    }

    /// The model of `config` with all of `weights`, its parameters of `kind`.
    fn build(
        config: ModelConfig,
        mut weights: Weights,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        let mut model = Self::from_weights(config, &mut weights, device)?;
        weights.finish()?;
        if kind != Kind::Float {
            model.vs.set_kind(kind);
        }
        Ok(model)
    }

    /// Builds the model from loaded weights (f32 variables on `device`).
    pub fn from_weights(config: ModelConfig, w: &mut Weights, device: Device) -> Result<Self, ModelError> {
        let vs = VarStore::new(device);
        let p = vs.root();
        let (vocab, hidden) = (config.vocab_size as i64, config.hidden_size as i64);
        let embed_tokens = param(&p, w, "model.embed_tokens.weight", &[vocab, hidden])?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::load(&p, w, i, &config))
            .collect::<Result<_, _>>()?;
        let norm = RmsNorm::load(&p, w, "model.norm", hidden, config.rms_norm_eps)?;
        let lm_head = match config.tie_word_embeddings {
            true => None,
            false => Some(param(&p, w, "lm_head.weight", &[vocab, hidden])?),
        };
        let rope = RotaryEmbedding::new(config.head_dim, config.rope.theta, &config.rope.scaling, device);
        Ok(CausalLm {
            config,
            vs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            lm_head_packed: Prepacked::default(),
            rope,
            residency: None,
            lora: None,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The parameters, for optimisers, copying and saving.
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// Mutable access to the parameters (loading new weights, changing their kind).
    pub fn var_store_mut(&mut self) -> &mut VarStore {
        &mut self.vs
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The floating-point kind of the parameters.
    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
    }

    /// The parameters under their Hugging Face names, sorted (a tied head is the embedding).
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut named: Vec<_> = self.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }

    /// Attaches fresh LoRA adapters of `config` (seeded; the model computes what it computed
    /// until they are trained) and freezes the base: from now on only the adapters train.
    pub fn attach_lora(&mut self, config: &LoraConfig, seed: u64) -> Result<(), ModelError> {
        let device = self.device();
        self.lora = Some(lora::attach(self, config, device, seed)?);
        self.vs.freeze();
        Ok(())
    }

    /// Attaches the LoRA adapters of the PEFT folder `dir` and freezes the base.
    pub fn load_lora(&mut self, dir: &Path) -> Result<(), ModelError> {
        let device = self.device();
        self.lora = Some(lora::load(self, dir, device)?);
        self.vs.freeze();
        Ok(())
    }

    /// Its LoRA adapters, when attached.
    pub fn lora(&self) -> Option<&Adapters> {
        self.lora.as_ref()
    }

    /// The parameters under their Hugging Face names as [`Self::named_tensors`], with each
    /// adapted projection's weight merged (`W + scaling · B A`, in the base's kind): the plain
    /// model the adapted one computes, for engines that serve no adapters and for
    /// `kart convert merge-lora`. Without adapters, the parameters themselves.
    pub fn merged_tensors(&self) -> Vec<(String, Tensor)> {
        let mut named = self.named_tensors();
        let Some(adapters) = &self.lora else { return named };
        for &(layer, projection) in adapters.targets() {
            let linear = self.layers[layer].projection(projection);
            let adapter = linear.adapter.as_ref().expect("every target has its adapter");
            let name = format!("model.layers.{layer}.{}.weight", projection.path());
            let slot = named.iter_mut().find(|(n, _)| *n == name).expect("a target is a parameter");
            slot.1 = lora::merged(&linear.weight, adapter);
        }
        named
    }

    /// Merges the adapters into the weights they adapt (`W + scaling · B A`) and drops them:
    /// the plain model the adapted one computed, trainable again.
    pub fn merge_lora(&mut self) {
        let Some(adapters) = self.lora.take() else { return };
        for &(layer, projection) in adapters.targets() {
            let linear = self.layers[layer].projection_mut(projection);
            let adapter = linear.adapter.take().expect("every target has its adapter");
            let merged = lora::merged(&linear.weight, &adapter);
            tch::no_grad(|| linear.weight.copy_(&merged));
        }
        self.vs.unfreeze();
    }

    /// Drops the adapters, where attached, without merging them: the base model again,
    /// trainable.
    pub fn detach_lora(&mut self) {
        let Some(adapters) = self.lora.take() else { return };
        for &(layer, projection) in adapters.targets() {
            self.layers[layer].projection_mut(projection).adapter = None;
        }
        self.vs.unfreeze();
    }

    /// A fresh cache for `batch` sequences.
    pub fn new_cache(&self, batch: i64) -> KvCache {
        let c = &self.config;
        KvCache::new(
            c.num_hidden_layers,
            batch,
            c.num_key_value_heads as i64,
            c.head_dim as i64,
            self.kind(),
            self.device(),
        )
    }

    /// Runs the decoder and returns the final hidden states `(B, T, hidden)`.
    ///
    /// `input_ids` and `positions` are `(B, T)` int64. `valid` `(B, T)` marks real tokens (false for
    /// padding); `None` means all are real. With a cache, the new tokens attend to everything cached
    /// before and their keys and values are appended to it; rows are right-aligned (pad on the left).
    pub fn forward(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        valid: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_with(input_ids, positions, valid, cache, Kernels::Standard)
    }

    /// [`Self::forward`] for generation, without gradients: on the CPU in f32 the linear layers
    /// multiply through oneDNN by weights packed once (rebuilt when the weights change), unless a
    /// [`Residency`] brings the layers' weights anew for every pass. The results agree with
    /// `forward`'s to rounding.
    pub fn decode(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        valid: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> Tensor {
        let kernels = if self.residency.is_some() { Kernels::Standard } else { Kernels::Prepacked };
        tch::no_grad(|| self.forward_with(input_ids, positions, valid, Some(cache), kernels))
    }

    fn forward_with(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        valid: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
        kernels: Kernels,
    ) -> Tensor {
        let (b, t) = input_ids.size2().expect("input_ids is (B, T)");
        let kind = self.kind();
        // Plain causal attention (no explicit mask) when nothing is padding and the queries are either
        // a single new token or all the keys there are.
        let mask = match cache.as_deref_mut() {
            Some(cache) => {
                let new_valid = match valid {
                    Some(v) => v.to_kind(Kind::Bool),
                    None => Tensor::ones([b, t], (Kind::Bool, input_ids.device())),
                };
                cache.push_columns(&new_valid);
                let keys = cache.valid();
                let plain = (t == 1 || cache.len() == t) && all_true(&keys);
                (!plain).then(|| attention_mask(&keys, t, kind))
            }
            None => self.padding_mask(valid, t),
        };
        let rot = self.rope.cos_sin(positions);
        let mut h = self.embed(input_ids);
        for i in 0..self.layers.len() {
            h = self.run_layer(
                i,
                &h,
                &rot,
                Attend::from_mask(mask.as_ref()),
                cache.as_deref_mut().map(|c| (c, i)),
                kernels,
            );
        }
        self.norm.forward(&h)
    }

    /// The final hidden states `(B, T, hidden)` of tokens laid out as `layout` says, without a
    /// cache.
    pub fn forward_layout(&self, input_ids: &Tensor, positions: &Tensor, layout: &Layout) -> Tensor {
        match layout {
            Layout::Padded { valid } => self.forward(input_ids, positions, valid.as_ref(), None),
            Layout::Packed { lengths } => {
                let rot = self.rope.cos_sin(positions);
                let mut h = self.embed(input_ids);
                for i in 0..self.layers.len() {
                    h = self.run_layer(i, &h, &rot, Attend::Segments(lengths), None, Kernels::Standard);
                }
                self.norm.forward(&h)
            }
        }
    }

    /// The embeddings of `input_ids`.
    pub(crate) fn embed(&self, input_ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false)
    }

    /// Decoder layers.
    pub(crate) fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Decoder layer `i` on `h`, its weights brought to the device meanwhile.
    pub(crate) fn run_layer(
        &self,
        i: usize,
        h: &Tensor,
        rot: &(Tensor, Tensor),
        attend: Attend<'_>,
        cache: Option<(&mut KvCache, usize)>,
        kernels: Kernels,
    ) -> Tensor {
        self.with_layer(i, || self.layers[i].forward(h, rot, attend, cache, kernels))
    }

    /// Decoder layer `i` (its weights on the device only inside [`Self::with_layer`] when a
    /// residency manages them).
    pub(crate) fn layer(&self, i: usize) -> &DecoderLayer {
        &self.layers[i]
    }

    /// Keeps the decoder layers' weights in CPU memory from now on, each layer's copied to the
    /// device only while it runs: for frozen models in passes without gradients (the reference
    /// policy).
    pub fn offload_layers(&mut self) {
        if self.residency.is_none() {
            self.residency = Some(Box::new(Offload::new(self)));
        }
    }

    /// Hands the decoder layers' weights to `residency` from now on (their data as it decides;
    /// see [`crate::residency`]).
    pub fn set_residency(&mut self, residency: Box<dyn Residency>) {
        self.residency = Some(residency);
    }

    /// Where the decoder layers' weights live, when not on the device.
    pub(crate) fn residency(&self) -> Option<&dyn Residency> {
        self.residency.as_deref()
    }

    /// The final norm.
    pub(crate) fn final_norm(&self, h: &Tensor) -> Tensor {
        self.norm.forward(h)
    }

    /// The rotary embedding's `(cos, sin)` at `positions`.
    pub(crate) fn rotary(&self, positions: &Tensor) -> (Tensor, Tensor) {
        self.rope.cos_sin(positions)
    }

    /// The additive attention mask of padded rows (`None`: plain causal attention suffices).
    pub(crate) fn padding_mask(&self, valid: Option<&Tensor>, t: i64) -> Option<Tensor> {
        valid
            .map(|v| v.to_kind(Kind::Bool))
            .filter(|v| !all_true(v))
            .map(|v| attention_mask(&v, t, self.kind()))
    }

    /// Full-vocabulary logits `(…, vocab)` of hidden states `(…, hidden)`.
    pub fn lm_head(&self, hidden: &Tensor) -> Tensor {
        hidden.matmul(&self.lm_head_weight().tr())
    }

    /// The logits a generation engine samples from: [`Self::lm_head`] of hidden states
    /// `(rows, hidden)`, without gradients, the head's weight packed as [`Self::decode`] packs the
    /// layers' (the results agree to rounding).
    pub fn next_token_logits(&self, hidden: &Tensor) -> Tensor {
        let weight = self.lm_head_weight();
        tch::no_grad(|| {
            self.lm_head_packed.linear(hidden, weight, None).unwrap_or_else(|| self.lm_head(hidden))
        })
    }

    /// The LM head's weight `(vocab, hidden)`.
    pub fn lm_head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}

impl Adaptable for CausalLm {
    fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    fn set_adapter(&mut self, layer: usize, projection: Projection, adapter: Adapter) {
        self.layers[layer].projection_mut(projection).adapter = Some(adapter);
    }
}

/// The parameter kind of a model on `device` unless told otherwise: bf16 on CUDA, f32 elsewhere.
pub fn default_kind(device: Device) -> Kind {
    if device.is_cuda() { Kind::BFloat16 } else { Kind::Float }
}

/// How [`CausalLm::random`] initialises a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Init {
    Normal,
    Zeros,
    Ones,
}

/// One parameter of a model: its Hugging Face name, shape and initialisation.
#[derive(Debug)]
pub(super) struct Parameter {
    pub(super) name: String,
    pub(super) shape: Vec<i64>,
    pub(super) init: Init,
}

/// Every parameter of a model of `config`, in the order random weights are drawn in. A tied head
/// has no parameter of its own.
pub(super) fn parameters(c: &ModelConfig) -> Vec<Parameter> {
    let [vocab, hidden, inter, heads, kv_heads, head_dim] = [
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    ]
    .map(|n| n as i64);
    let mut parameters = Vec::new();
    let mut push =
        |name: String, shape: Vec<i64>, init: Init| parameters.push(Parameter { name, shape, init });
    push("model.embed_tokens.weight".to_owned(), vec![vocab, hidden], Init::Normal);
    for i in 0..c.num_hidden_layers {
        let layer = |name: &str| format!("model.layers.{i}.{name}");
        push(layer("input_layernorm.weight"), vec![hidden], Init::Ones);
        for (proj, out) in [("q", heads), ("k", kv_heads), ("v", kv_heads)] {
            push(layer(&format!("self_attn.{proj}_proj.weight")), vec![out * head_dim, hidden], Init::Normal);
            if c.qkv_bias() {
                push(layer(&format!("self_attn.{proj}_proj.bias")), vec![out * head_dim], Init::Zeros);
            }
        }
        if c.qk_norm {
            push(layer("self_attn.q_norm.weight"), vec![head_dim], Init::Ones);
            push(layer("self_attn.k_norm.weight"), vec![head_dim], Init::Ones);
        }
        push(layer("self_attn.o_proj.weight"), vec![hidden, heads * head_dim], Init::Normal);
        if c.o_proj_bias() {
            push(layer("self_attn.o_proj.bias"), vec![hidden], Init::Zeros);
        }
        push(layer("post_attention_layernorm.weight"), vec![hidden], Init::Ones);
        for (proj, shape) in [("gate", [inter, hidden]), ("up", [inter, hidden]), ("down", [hidden, inter])] {
            push(layer(&format!("mlp.{proj}_proj.weight")), shape.to_vec(), Init::Normal);
            if c.mlp_bias {
                push(layer(&format!("mlp.{proj}_proj.bias")), vec![shape[0]], Init::Zeros);
            }
        }
    }
    push("model.norm.weight".to_owned(), vec![hidden], Init::Ones);
    if !c.tie_word_embeddings {
        push("lm_head.weight".to_owned(), vec![vocab, hidden], Init::Normal);
    }
    parameters
}

/// Elements of the parameters of a model of `config` whose Hugging Face names start with `prefix`
/// (`""`: all of them; `"model.layers.0."`: one decoder layer); a tied head is counted once.
pub fn parameter_count(config: &ModelConfig, prefix: &str) -> u64 {
    parameters(config)
        .iter()
        .filter(|p| p.name.starts_with(prefix))
        .map(|p| p.shape.iter().product::<i64>() as u64)
        .sum()
}

/// `n` samples of N(0, std²) drawn from a generator seeded with `seed` (the same on every
/// thread and device: no global generator is touched).
pub fn seeded_normal(seed: u64, n: usize, std: f64) -> Vec<f32> {
    normal(&mut ChaCha8Rng::seed_from_u64(seed), n, std)
}

/// `n` samples of N(0, std²) by the Box-Muller transform.
fn normal(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f32> {
    let mut samples = Vec::with_capacity(n + 1);
    while samples.len() < n {
        let u1 = 1.0 - rng.random::<f64>(); // in (0, 1], so the logarithm is finite
        let u2 = rng.random::<f64>();
        let radius = std * (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        samples.extend([(radius * cos) as f32, (radius * sin) as f32]);
    }
    samples.truncate(n);
    samples
}

/// Whether every entry of a bool tensor is true.
fn all_true(t: &Tensor) -> bool {
    bool::try_from(t.all()).expect("a bool scalar")
}

/// Additive attention mask `(B, 1, T, Tk)` for `t` queries occupying the last `t` of the `Tk` key
/// columns: a query sees real keys at or before its own column. Masked entries hold the dtype's
/// lowest finite value rather than -inf, so rows of padding queries stay finite (as transformers).
fn attention_mask(valid_keys: &Tensor, t: i64, kind: Kind) -> Tensor {
    let (b, tk) = valid_keys.size2().expect("(B, Tk)");
    let device = valid_keys.device();
    let query_cols = Tensor::arange_start(tk - t, tk, (Kind::Int64, device)).view([t, 1]);
    let key_cols = Tensor::arange(tk, (Kind::Int64, device)).view([1, tk]);
    let causal = key_cols.le_tensor(&query_cols).view([1, 1, t, tk]);
    let allowed = causal.logical_and(&valid_keys.view([b, 1, 1, tk]));
    let lowest = match kind {
        Kind::BFloat16 => -3.389_531_389_251_535e38,
        Kind::Half => -65504.0,
        _ => f32::MIN as f64,
    };
    Tensor::zeros([b, 1, t, tk], (kind, device)).masked_fill(&allowed.logical_not(), lowest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(rows: &[&[i64]]) -> Tensor {
        let width = rows[0].len() as i64;
        Tensor::from_slice(&rows.concat()).view([rows.len() as i64, width])
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn parameters_keep_their_hugging_face_names() {
        let model = CausalLm::load(&kart_testing::model("tiny-llama"), Device::Cpu).unwrap();
        let names: Vec<String> = model.named_tensors().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"model.embed_tokens.weight".to_string()), "{names:?}");
        assert!(names.contains(&"model.layers.1.self_attn.o_proj.weight".to_string()));
        assert!(names.contains(&"lm_head.weight".to_string()), "llama's head is untied");
        let tied = CausalLm::load(&kart_testing::model("tiny-qwen3"), Device::Cpu).unwrap();
        let names: Vec<String> = tied.named_tensors().into_iter().map(|(n, _)| n).collect();
        assert!(!names.contains(&"lm_head.weight".to_string()));
        assert!(names.contains(&"model.layers.0.self_attn.q_norm.weight".to_string()));
    }

    #[test]
    fn padded_batch_matches_unpadded_rows() {
        for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
            let model = CausalLm::load(&kart_testing::model(name), Device::Cpu).unwrap();
            tch::no_grad(|| {
                let long = ids(&[&[5, 9, 17, 33, 2, 8]]);
                let short = ids(&[&[40, 41, 42]]);
                let run = |x: &Tensor| {
                    let t = x.size()[1];
                    model.lm_head(&model.forward(
                        x,
                        &Tensor::arange(t, (Kind::Int64, Device::Cpu)).view([1, t]),
                        None,
                        None,
                    ))
                };
                let batch = ids(&[&[5, 9, 17, 33, 2, 8], &[0, 0, 0, 40, 41, 42]]);
                let valid = Tensor::from_slice(&[
                    true, true, true, true, true, true, false, false, false, true, true, true,
                ])
                .view([2, 6]);
                let positions = ids(&[&[0, 1, 2, 3, 4, 5], &[0, 0, 0, 0, 1, 2]]);
                let both = model.lm_head(&model.forward(&batch, &positions, Some(&valid), None));
                assert!(max_diff(&both.narrow(0, 0, 1), &run(&long)) < 1e-4, "{name}: row 0");
                assert!(
                    max_diff(&both.narrow(0, 1, 1).narrow(1, 3, 3), &run(&short)) < 1e-4,
                    "{name}: row 1"
                );
            });
        }
    }

    /// Prefills six tokens of two right-aligned rows into a cache, then decodes three steps, each
    /// through `step` (the standard cached forward or generation's `decode`).
    fn cached_logits(
        model: &CausalLm,
        step: impl Fn(&Tensor, &Tensor, &Tensor, &mut KvCache) -> Tensor,
    ) -> (Tensor, Tensor) {
        let rows: [&[i64]; 2] = [&[3, 14, 15, 92, 65, 35, 89, 79, 32], &[0, 0, 0, 0, 0, 0, 27, 18, 28]];
        let full = ids(&rows);
        let valid_row = |r: &[i64], pad: usize| (0..r.len()).map(move |i| i >= pad);
        let valid: Vec<bool> = valid_row(rows[0], 0).chain(valid_row(rows[1], 6)).collect();
        let valid = Tensor::from_slice(&valid).view([2, 9]);
        let positions = ids(&[&[0, 1, 2, 3, 4, 5, 6, 7, 8], &[0, 0, 0, 0, 0, 0, 0, 1, 2]]);
        let reference = tch::no_grad(|| model.lm_head(&model.forward(&full, &positions, Some(&valid), None)));
        let mut cache = model.new_cache(2);
        let mut got = Vec::new();
        for (start, len) in [(0, 6), (6, 1), (7, 1), (8, 1)] {
            let part = |x: &Tensor| x.narrow(1, start, len);
            let h = step(&part(&full), &part(&positions), &part(&valid), &mut cache);
            got.push(tch::no_grad(|| model.lm_head(&h)));
        }
        (Tensor::cat(&got, 1), reference)
    }

    /// Whether cached logits agree with the full pass at every real position (row 1's first six
    /// columns are padding).
    fn agree(got: &Tensor, reference: &Tensor) -> bool {
        let (row0, row1) = (|t: &Tensor| t.narrow(0, 0, 1), |t: &Tensor| t.narrow(0, 1, 1).narrow(1, 6, 3));
        max_diff(&row0(got), &row0(reference)) < 1e-4 && max_diff(&row1(got), &row1(reference)) < 1e-4
    }

    #[test]
    fn cached_decoding_matches_full_forward() {
        for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
            let model = CausalLm::load(&kart_testing::model(name), Device::Cpu).unwrap();
            let (got, reference) = cached_logits(&model, |ids, positions, valid, cache| {
                tch::no_grad(|| model.forward(ids, positions, Some(valid), Some(cache)))
            });
            assert!(agree(&got, &reference), "{name}: forward with a cache");
            let (got, reference) = cached_logits(&model, |ids, positions, valid, cache| {
                model.decode(ids, positions, Some(valid), cache)
            });
            assert!(agree(&got, &reference), "{name}: decode");
            assert!(model.layers[0].mlp.up_proj.packed.is_packed(), "{name}: decode packs the weights");
        }
    }

    #[test]
    fn decoding_follows_weights_written_in_place() {
        let model = CausalLm::load(&kart_testing::model("tiny-qwen2"), Device::Cpu).unwrap();
        let decode = |ids: &Tensor, positions: &Tensor, valid: &Tensor, cache: &mut KvCache| {
            model.decode(ids, positions, Some(valid), cache)
        };
        let (before, _) = cached_logits(&model, decode);
        // New weights copied in, as the engine loads a policy version (head included: it is tied).
        tch::manual_seed(5);
        for (_, mut var) in model.named_tensors() {
            let noise = Tensor::randn(var.size(), (Kind::Float, Device::Cpu)) * 0.05;
            tch::no_grad(|| var.copy_(&(&var + noise)));
        }
        let (after, reference) = cached_logits(&model, decode);
        assert!(agree(&after, &reference), "decoded with the new weights");
        assert!(!agree(&before, &reference), "the new weights change the logits");
    }

    fn small_qwen2() -> ModelConfig {
        ModelConfig::qwen2(crate::QwenSizes {
            vocab_size: 500,
            hidden_size: 64,
            intermediate_size: 96,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 128,
            tie_word_embeddings: false,
            initializer_range: 0.02,
        })
        .unwrap()
    }

    #[test]
    fn random_weights_follow_transformers_init() {
        let config = small_qwen2();
        let model = CausalLm::random(config.clone(), Device::Cpu, 7).unwrap();
        let named = model.named_tensors();
        let mut expected: Vec<(String, Vec<i64>)> =
            parameters(&config).into_iter().map(|p| (p.name, p.shape)).collect();
        expected.sort();
        assert_eq!(named.iter().map(|(n, t)| (n.clone(), t.size())).collect::<Vec<_>>(), expected);
        for (name, tensor) in &named {
            let (mean, std) =
                (tensor.mean(Kind::Float).double_value(&[]), tensor.std(true).double_value(&[]));
            if name.ends_with("norm.weight") {
                assert_eq!((mean, std), (1.0, 0.0), "{name}");
            } else if name.ends_with(".bias") {
                assert_eq!((mean, std), (0.0, 0.0), "{name}");
            } else {
                assert!(mean.abs() < 2e-3 && (std - 0.02).abs() < 1e-3, "{name}: mean {mean}, std {std}");
            }
        }
        // Seeded: the same seed gives the same weights, another seed others.
        let same = CausalLm::random(config.clone(), Device::Cpu, 7).unwrap();
        let other = CausalLm::random(config, Device::Cpu, 8).unwrap();
        for ((name, a), ((_, b), (_, c))) in
            named.iter().zip(same.named_tensors().iter().zip(&other.named_tensors()))
        {
            assert!(a.equal(b), "{name}");
            assert!(name.contains("norm") || name.ends_with(".bias") || !a.equal(c), "{name}");
        }
    }

    #[test]
    fn random_weights_zero_the_padding_embedding() {
        let mut value: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(kart_testing::model("tiny-llama").join("config.json")).unwrap(),
        )
        .unwrap();
        value["pad_token_id"] = serde_json::json!(5);
        let config = ModelConfig::from_json(&value, std::path::Path::new("config.json")).unwrap();
        let model = CausalLm::random(config, Device::Cpu, 0).unwrap();
        let embed =
            model.named_tensors().into_iter().find(|(n, _)| n == "model.embed_tokens.weight").unwrap().1;
        assert_eq!(embed.get(5).abs().sum(Kind::Float).double_value(&[]), 0.0);
        assert!(embed.get(4).abs().sum(Kind::Float).double_value(&[]) > 0.0);
    }

    #[test]
    fn next_token_logits_agree_with_the_head() {
        for name in ["tiny-qwen2", "tiny-llama"] {
            let model = CausalLm::load(&kart_testing::model(name), Device::Cpu).unwrap();
            let hidden = Tensor::randn([5, 64], (Kind::Float, Device::Cpu));
            let logits = model.next_token_logits(&hidden);
            assert_eq!(logits.size(), [5, 366]);
            assert!(!logits.requires_grad());
            assert!(max_diff(&logits, &model.lm_head(&hidden)) < 1e-5, "{name}");
        }
    }

    #[test]
    fn missing_tensor_is_named() {
        let dir = std::env::temp_dir().join(format!("kart-missing-tensor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "tokenizer.json"] {
            std::fs::copy(kart_testing::model("tiny-qwen2").join(f), dir.join(f)).unwrap();
        }
        let mut tensors =
            Tensor::read_safetensors(kart_testing::model("tiny-qwen2").join("model.safetensors")).unwrap();
        tensors.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight");
        Tensor::write_safetensors(&tensors, dir.join("model.safetensors")).unwrap();
        let err = CausalLm::load(&dir, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
