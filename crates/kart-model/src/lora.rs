//! LoRA adapters: low-rank updates `scaling · B A` beside a model's frozen linear projections.
//!
//! An [`Adapters`] set is attached to a [`CausalLm`](crate::CausalLm) fresh
//! ([`CausalLm::attach_lora`](crate::CausalLm::attach_lora), initialised as PEFT initialises them:
//! `A` Kaiming-uniform, `B` zero, so the adapted model starts as the base) or from a PEFT folder
//! ([`CausalLm::load_lora`](crate::CausalLm::load_lora)). Its tensors live in a store of their
//! own under PEFT's names, so the base's [`named_tensors`](crate::CausalLm::named_tensors) stay
//! the Hugging Face checkpoint's. Each adapted projection computes, as PEFT's `lora.Linear` does,
//! `base(x) + B(A(dropout(x))) · scaling` with `x` in the adapters' kind (f32 beside a bf16 base)
//! and the sum in the base's kind. An [`AdapterMode`] switches them off (the reference policy is
//! the base itself) or on with dropout (the training pass).

use crate::error::ModelError;
use crate::weights::{Weights, save_safetensors};
use kart_core::config::lora::{LoraConfig, Projection, TargetModules};
use kart_tokenizer::file::{FileError, require_json};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

/// PEFT's adapter configuration file.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// PEFT's adapter weights file.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// What the adapters add to a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterMode {
    /// Nothing: the base model (the reference policy).
    Off,
    /// Their update, without dropout (generation, scoring).
    On,
    /// Their update, with dropout on their input (the training pass).
    Train,
}

impl AdapterMode {
    fn to_u8(self) -> u8 {
        match self {
            AdapterMode::Off => 0,
            AdapterMode::On => 1,
            AdapterMode::Train => 2,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => AdapterMode::Off,
            2 => AdapterMode::Train,
            _ => AdapterMode::On,
        }
    }
}

/// Restores the adapters' mode before [`Adapters::scoped`] when dropped.
#[must_use = "the mode lasts as long as the guard"]
pub struct ModeGuard {
    mode: Arc<AtomicU8>,
    previous: AdapterMode,
}

impl Drop for ModeGuard {
    fn drop(&mut self) {
        self.mode.store(self.previous.to_u8(), Ordering::Relaxed);
    }
}

/// The adapter of one projection.
#[derive(Debug)]
pub(crate) struct Adapter {
    /// `(r, in)`.
    a: Tensor,
    /// `(out, r)`.
    b: Tensor,
    scaling: f64,
    dropout: f64,
    mode: Arc<AtomicU8>,
}

impl Adapter {
    /// `base` (the projection's output on `x`) plus this adapter's update, in `base`'s kind.
    pub(crate) fn add(&self, x: &Tensor, base: Tensor) -> Tensor {
        let mode = AdapterMode::from_u8(self.mode.load(Ordering::Relaxed));
        if mode == AdapterMode::Off {
            return base;
        }
        let mut x = x.to_kind(self.a.kind());
        if mode == AdapterMode::Train && self.dropout > 0.0 {
            x = x.dropout(self.dropout, true);
        }
        let update = x.linear::<Tensor>(&self.a, None).linear::<Tensor>(&self.b, None) * self.scaling;
        let kind = base.kind();
        (base + update).to_kind(kind)
    }

    /// `scaling · B A`, the update merged into the weight `(out, in)`.
    fn delta(&self) -> Tensor {
        self.b.matmul(&self.a) * self.scaling
    }
}

/// A model's adapters: their tensors, configuration and mode.
#[derive(Debug)]
pub struct Adapters {
    config: LoraConfig,
    vs: VarStore,
    mode: Arc<AtomicU8>,
    /// (layer, projection) of each adapter, in the model's order.
    targets: Vec<(usize, Projection)>,
}

impl Adapters {
    /// Their configuration.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// Their tensors under PEFT's names (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`),
    /// sorted: what an optimiser trains and [`Adapters::save`] writes.
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut named: Vec<_> = self.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }

    /// The adapted projections: (decoder layer, projection), in the model's order.
    pub fn targets(&self) -> &[(usize, Projection)] {
        &self.targets
    }

    /// Parameters of adapters of `config` on a model of `model` (`r · (in + out)` per adapted
    /// projection).
    pub fn parameter_count(config: &LoraConfig, model: &crate::ModelConfig) -> u64 {
        let per_layer: i64 = config.targets().iter().map(|&p| shape(model, p).iter().sum::<i64>()).sum();
        model.num_hidden_layers as u64 * config.r as u64 * per_layer as u64
    }

    /// The mode of every adapter from now on; returns the previous one.
    pub fn set_mode(&self, mode: AdapterMode) -> AdapterMode {
        AdapterMode::from_u8(self.mode.swap(mode.to_u8(), Ordering::Relaxed))
    }

    /// The current mode.
    pub fn mode(&self) -> AdapterMode {
        AdapterMode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    /// Sets `mode` until the guard is dropped, then restores the mode before it.
    pub fn scoped(&self, mode: AdapterMode) -> ModeGuard {
        let previous = self.set_mode(mode);
        ModeGuard { mode: self.mode.clone(), previous }
    }

    /// Writes PEFT's folder: `adapter_config.json` (naming `base_model` as
    /// `base_model_name_or_path`) and `adapter_model.safetensors` (f32).
    pub fn save(&self, dir: &Path, base_model: &str) -> Result<(), ModelError> {
        std::fs::create_dir_all(dir).map_err(FileError::io(dir))?;
        let mut modules: Vec<&str> = self.targets.iter().map(|(_, p)| p.name()).collect();
        modules.sort_unstable();
        modules.dedup();
        let config = PeftConfig {
            peft_type: "LORA".into(),
            task_type: Some("CAUSAL_LM".into()),
            base_model_name_or_path: Some(base_model.to_owned()),
            r: self.config.r,
            lora_alpha: self.config.lora_alpha,
            lora_dropout: self.config.lora_dropout,
            target_modules: serde_json::json!(modules),
            use_rslora: self.config.use_rslora,
            bias: "none".into(),
            use_dora: false,
            fan_in_fan_out: false,
            modules_to_save: None,
            layers_to_transform: None,
            rank_pattern: Default::default(),
            alpha_pattern: Default::default(),
            init_lora_weights: true,
            inference_mode: true,
        };
        let path = dir.join(CONFIG_FILE);
        let json = serde_json::to_string_pretty(&config).expect("a PEFT config serialises");
        std::fs::write(&path, json + "\n").map_err(FileError::io(&path))?;
        let named = self.named_tensors();
        save_safetensors(&dir.join(WEIGHTS_FILE), named.iter().map(|(n, t)| (n.as_str(), t)), Kind::Float)
    }
}

/// PEFT's name of the `A` (`"A"`) or `B` tensor of `projection` in decoder layer `layer`.
pub fn tensor_name(layer: usize, projection: Projection, which: &str) -> String {
    format!("base_model.model.model.layers.{layer}.{}.lora_{which}.weight", projection.path())
}

/// `(out, in)` of `projection` in a model of `c`.
fn shape(c: &crate::ModelConfig, projection: Projection) -> [i64; 2] {
    let [hidden, inter, q, kv] = [
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
    ]
    .map(|n| n as i64);
    match projection {
        Projection::QProj => [q, hidden],
        Projection::KProj | Projection::VProj => [kv, hidden],
        Projection::OProj => [hidden, q],
        Projection::GateProj | Projection::UpProj => [inter, hidden],
        Projection::DownProj => [hidden, inter],
    }
}

/// The keys of `adapter_config.json` kart writes, and reads (PEFT writes more; those that would
/// change what the adapter computes are checked, the others ignored).
#[derive(Debug, Serialize, Deserialize)]
struct PeftConfig {
    peft_type: String,
    #[serde(default)]
    task_type: Option<String>,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    target_modules: serde_json::Value,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default = "no_bias")]
    bias: String,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    modules_to_save: Option<serde_json::Value>,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default = "yes")]
    init_lora_weights: bool,
    #[serde(default)]
    inference_mode: bool,
}

fn no_bias() -> String {
    "none".into()
}

fn yes() -> bool {
    true
}

/// Attaches adapters to a model's projections (implemented by the transformer, which owns them).
pub(crate) trait Adaptable {
    /// The model's configuration.
    fn model_config(&self) -> &crate::ModelConfig;
    /// Sets the adapter of `projection` in decoder layer `layer`.
    fn set_adapter(&mut self, layer: usize, projection: Projection, adapter: Adapter);
}

/// Fresh adapters of `config` on `model`, initialised from `seed` as PEFT does: `A` from
/// U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with `a = sqrt(5)`), `B` zero.
pub(crate) fn attach(
    model: &mut impl Adaptable,
    config: &LoraConfig,
    device: tch::Device,
    seed: u64,
) -> Result<Adapters, ModelError> {
    let c = model.model_config().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let r = config.r as i64;
    let mut tensors = std::collections::HashMap::new();
    for layer in 0..c.num_hidden_layers {
        for projection in config.targets() {
            let [out, inp] = shape(&c, projection);
            let bound = 1.0 / (inp as f64).sqrt();
            let a: Vec<f32> = (0..r * inp).map(|_| rng.random_range(-bound..bound) as f32).collect();
            let a = Tensor::from_slice(&a).view([r, inp]).to_device(device);
            tensors.insert(tensor_name(layer, projection, "A"), a);
            tensors
                .insert(tensor_name(layer, projection, "B"), Tensor::zeros([out, r], (Kind::Float, device)));
        }
    }
    let weights = Weights::from_tensors(PathBuf::from("(fresh LoRA adapters)"), tensors);
    build(model, config.clone(), weights, device)
}

/// The adapters of the PEFT folder `dir` on `model`: the projections its tensors name, scaled as
/// its config says. What kart would compute differently from PEFT (DoRA, biases, per-module
/// ranks, saved modules) is refused, naming the key.
pub(crate) fn load(
    model: &mut impl Adaptable,
    dir: &Path,
    device: tch::Device,
) -> Result<Adapters, ModelError> {
    let path = dir.join(CONFIG_FILE);
    let peft: PeftConfig = require_json(&path)?;
    let bad = |key: &str, value: String, reason: &str| ModelError::Config {
        path: path.clone(),
        key: key.into(),
        value,
        reason: reason.into(),
    };
    if !peft.peft_type.eq_ignore_ascii_case("lora") {
        return Err(bad("peft_type", peft.peft_type, "kart loads LoRA adapters only"));
    }
    let unsupported = [
        ("bias", peft.bias != "none", format!("{:?}", peft.bias)),
        ("use_dora", peft.use_dora, "true".into()),
        ("fan_in_fan_out", peft.fan_in_fan_out, "true".into()),
        (
            "modules_to_save",
            peft.modules_to_save.as_ref().is_some_and(|v| !v.is_null()),
            format!("{:?}", peft.modules_to_save),
        ),
        (
            "layers_to_transform",
            peft.layers_to_transform.as_ref().is_some_and(|v| !v.is_null()),
            format!("{:?}", peft.layers_to_transform),
        ),
        ("rank_pattern", !peft.rank_pattern.is_empty(), format!("{:?}", peft.rank_pattern)),
        ("alpha_pattern", !peft.alpha_pattern.is_empty(), format!("{:?}", peft.alpha_pattern)),
    ];
    if let Some((key, _, value)) = unsupported.into_iter().find(|(_, refused, _)| *refused) {
        return Err(bad(
            key,
            value,
            "not supported by kart's LoRA (plain LoRA on the decoder's projections)",
        ));
    }
    let weights = Weights::open(dir.join(WEIGHTS_FILE), device, Kind::Float)?;
    let c = model.model_config().clone();
    let named: Vec<Projection> = Projection::ALL
        .into_iter()
        .filter(|&p| (0..c.num_hidden_layers).any(|i| weights.names().any(|n| n == tensor_name(i, p, "A"))))
        .collect();
    if named.is_empty() {
        return Err(bad(
            "target_modules",
            peft.target_modules.to_string(),
            "no adapter tensor of a decoder projection in the folder",
        ));
    }
    let config = LoraConfig {
        r: peft.r,
        lora_alpha: peft.lora_alpha,
        lora_dropout: peft.lora_dropout,
        target_modules: TargetModules::Named(named),
        use_rslora: peft.use_rslora,
    };
    config.validate().map_err(|e| bad(&e.field, e.value, e.reason))?;
    // Every layer must have each named projection's pair: `build` takes them all and refuses
    // any tensor left over.
    build(model, config, weights, device)
}

/// Registers `weights` (every target's `A` and `B`, of the config's rank) as the adapters of
/// `model`.
fn build(
    model: &mut impl Adaptable,
    config: LoraConfig,
    mut weights: Weights,
    device: tch::Device,
) -> Result<Adapters, ModelError> {
    let c = model.model_config().clone();
    let vs = VarStore::new(device);
    let mode = Arc::new(AtomicU8::new(1));
    let (r, scaling, dropout) = (config.r as i64, config.scaling(), config.lora_dropout);
    let mut targets = Vec::new();
    for layer in 0..c.num_hidden_layers {
        for projection in config.targets() {
            let [out, inp] = shape(&c, projection);
            let mut take = |which: &str, shape: [i64; 2]| {
                crate::transformer::param(
                    &vs.root(),
                    &mut weights,
                    &tensor_name(layer, projection, which),
                    &shape,
                )
            };
            let (a, b) = (take("A", [r, inp])?, take("B", [out, r])?);
            model.set_adapter(layer, projection, Adapter { a, b, scaling, dropout, mode: mode.clone() });
            targets.push((layer, projection));
        }
    }
    weights.finish()?;
    Ok(Adapters { config, vs, mode, targets })
}

/// The merged weight of a projection: `weight + scaling · B A`, in `weight`'s kind.
pub(crate) fn merged(weight: &Tensor, adapter: &Adapter) -> Tensor {
    tch::no_grad(|| (weight.to_kind(Kind::Float) + adapter.delta()).to_kind(weight.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CausalLm, ModelConfig, QwenSizes};
    use kart_core::config::lora::AllLinear;
    use tch::Device;

    fn model() -> CausalLm {
        let sizes = QwenSizes {
            vocab_size: 97,
            hidden_size: 32,
            intermediate_size: 48,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 64,
            tie_word_embeddings: false,
            initializer_range: 0.1,
        };
        CausalLm::random(ModelConfig::qwen2(sizes).unwrap(), Device::Cpu, 3).unwrap()
    }

    fn logits(model: &CausalLm) -> Tensor {
        tch::no_grad(|| logits_with_grad(model))
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// Gives every `B` random values, so the adapters change what the model computes.
    fn perturb(model: &CausalLm) {
        for (name, mut t) in model.lora().unwrap().named_tensors() {
            if name.contains("lora_B") {
                tch::no_grad(|| t.copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.1)));
            }
        }
    }

    fn all_linear(r: usize) -> LoraConfig {
        LoraConfig {
            r,
            lora_alpha: 16.0,
            target_modules: TargetModules::AllLinear(AllLinear::AllLinear),
            ..LoraConfig::default()
        }
    }

    #[test]
    fn fresh_adapters_start_as_the_base_and_off_is_the_base() {
        let mut m = model();
        let base = logits(&m);
        m.attach_lora(&all_linear(4), 1).unwrap();
        let adapters = m.lora().unwrap();
        assert_eq!(adapters.targets().len(), 2 * 7);
        assert_eq!(adapters.named_tensors().len(), 2 * 7 * 2);
        let params: i64 = adapters.named_tensors().iter().map(|(_, t)| t.numel() as i64).sum();
        assert_eq!(params as u64, Adapters::parameter_count(adapters.config(), m.config()));
        assert_eq!(max_diff(&logits(&m), &base), 0.0, "B starts at zero");
        perturb(&m);
        let adapted = logits(&m);
        assert!(max_diff(&adapted, &base) > 1e-3, "trained adapters change the logits");
        {
            let _off = m.lora().unwrap().scoped(AdapterMode::Off);
            assert_eq!(max_diff(&logits(&m), &base), 0.0, "off: the base");
        }
        assert_eq!(m.lora().unwrap().mode(), AdapterMode::On);
        assert_eq!(max_diff(&logits(&m), &adapted), 0.0);
    }

    /// `lora_dropout` acts in the training mode alone.
    #[test]
    fn dropout_acts_only_while_training() {
        let mut m = model();
        m.attach_lora(&LoraConfig { lora_dropout: 0.5, ..all_linear(4) }, 5).unwrap();
        perturb(&m);
        let on = logits(&m);
        assert_eq!(max_diff(&logits(&m), &on), 0.0, "no dropout outside training");
        let _train = m.lora().unwrap().scoped(AdapterMode::Train);
        assert!(max_diff(&logits(&m), &on) > 1e-4, "dropout changes the training pass");
    }

    #[test]
    fn merged_weights_compute_what_the_adapters_do() {
        let mut m = model();
        m.attach_lora(&LoraConfig { use_rslora: true, ..all_linear(8) }, 2).unwrap();
        perturb(&m);
        let adapted = logits(&m);
        let merged = model();
        for ((name, mut to), (from_name, from)) in merged.named_tensors().into_iter().zip(m.merged_tensors())
        {
            assert_eq!(name, from_name);
            tch::no_grad(|| to.copy_(&from));
        }
        let diff = max_diff(&logits(&merged), &adapted);
        assert!(diff < 1e-5, "merged differs by {diff}");
        assert!(max_diff(&logits(&merged), &logits(&model())) > 1e-3);
        m.merge_lora();
        assert!(m.lora().is_none());
        let diff = max_diff(&logits(&m), &adapted);
        assert!(diff < 1e-5, "merged in place differs by {diff}");
    }

    #[test]
    fn only_the_adapters_get_gradients() {
        let mut m = model();
        m.attach_lora(&LoraConfig::default(), 3).unwrap();
        perturb(&m);
        logits_with_grad(&m).sum(Kind::Float).backward();
        for (name, t) in m.named_tensors() {
            assert!(!t.grad().defined(), "{name} of the frozen base has a gradient");
        }
        let adapters = m.lora().unwrap().named_tensors();
        assert_eq!(adapters.len(), 2 * 2 * 2, "q_proj and v_proj by default");
        for (name, t) in adapters {
            assert!(t.grad().defined() && t.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0, "{name}");
        }
    }

    fn logits_with_grad(model: &CausalLm) -> Tensor {
        let ids = Tensor::from_slice(&[5i64, 9, 17, 33, 2, 8]).view([1, 6]);
        let positions = Tensor::arange(6, (Kind::Int64, Device::Cpu)).view([1, 6]);
        model.lm_head(&model.forward(&ids, &positions, None, None))
    }

    #[test]
    fn peft_folders_round_trip_and_what_kart_cannot_compute_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = model();
        let config = LoraConfig {
            target_modules: TargetModules::Named(vec![Projection::DownProj, Projection::KProj]),
            ..all_linear(4)
        };
        m.attach_lora(&config, 4).unwrap();
        perturb(&m);
        m.lora().unwrap().save(dir.path(), "tiny-qwen2").unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(written["peft_type"], "LORA");
        assert_eq!(written["target_modules"], serde_json::json!(["down_proj", "k_proj"]));
        assert_eq!((written["r"].as_u64(), written["lora_alpha"].as_f64()), (Some(4), Some(16.0)));
        let mut loaded = model();
        loaded.load_lora(dir.path()).unwrap();
        assert_eq!(loaded.lora().unwrap().targets(), m.lora().unwrap().targets());
        assert_eq!(max_diff(&logits(&loaded), &logits(&m)), 0.0);

        for (key, value) in [("use_dora", "true"), ("bias", "\"all\""), ("peft_type", "\"IA3\"")] {
            let mut bad = written.clone();
            bad[key] = serde_json::from_str(value).unwrap();
            std::fs::write(dir.path().join(CONFIG_FILE), bad.to_string()).unwrap();
            let e = model().load_lora(dir.path()).unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
        }
    }
}
