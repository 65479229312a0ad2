//! `config.json` of a Hugging Face causal LM, read the way transformers reads it.
//!
//! Two styles occur on the Hub and both are accepted:
//! - classic (transformers 4): top-level `rope_theta`, an optional `rope_scaling` block keyed by
//!   `type` or `rope_type`, and `torch_dtype`;
//! - current (transformers 5): a `rope_parameters` block holding `rope_theta` and `rope_type`, and
//!   `dtype`.
//!
//! Keys a config may omit take the defaults of the family's transformers config class
//! (`LlamaConfig`, `Qwen2Config`, `Qwen3Config`), so that a config means here what it means
//! there. Values kart cannot compute exactly (another activation, another RoPE scaling,
//! sliding-window attention) are errors naming the key and value rather than silent approximations.
//!
//! ```no_run
//! # use kart_model::{Family, ModelConfig};
//! let config = ModelConfig::load("models/Qwen2.5-0.5B-Instruct")?;
//! assert_eq!(config.family, Family::Qwen2);
//! # Ok::<(), kart_model::ModelError>(())
//! ```

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::error::ModelError;
use kart_tokenizer::file::require_json;

/// The model families kart implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `Qwen2ForCausalLM` (Qwen2, Qwen2.5): q/k/v projections with bias.
    Qwen2,
    /// `Qwen3ForCausalLM`: per-head RMSNorm on queries and keys.
    Qwen3,
    /// `LlamaForCausalLM` (Llama 2 and 3, and the many models sharing its layout).
    Llama,
}

impl Family {
    /// The family of a transformers architecture name such as `Qwen2ForCausalLM`.
    fn from_architecture(architecture: &str) -> Option<Self> {
        match architecture {
            "Qwen2ForCausalLM" => Some(Family::Qwen2),
            "Qwen3ForCausalLM" => Some(Family::Qwen3),
            "LlamaForCausalLM" => Some(Family::Llama),
            _ => None,
        }
    }

    /// The family of a transformers `model_type` such as `qwen2`.
    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen2" => Some(Family::Qwen2),
            "qwen3" => Some(Family::Qwen3),
            "llama" => Some(Family::Llama),
            _ => None,
        }
    }
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// The base of the rotation frequencies (`rope_theta`).
    pub theta: f64,
    /// How the frequencies are rescaled for longer contexts.
    pub scaling: RopeScaling,
}

/// The RoPE variants kart computes, with the parameters transformers' `ROPE_INIT_FUNCTIONS` read.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: "default"`: the original RoPE.
    Default,
    /// `rope_type: "linear"`: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// `rope_type: "llama3"`: low frequencies divided by `factor`, high ones kept, a smooth blend
    /// between the wavelengths `original_max_position_embeddings / low_freq_factor` and
    /// `original_max_position_embeddings / high_freq_factor`.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// The model of kart's benchmarks (`kart bench model`, `kart bench train`) and memory tests: a
/// Qwen2 of 46.5M parameters.
pub const BENCHMARK_SIZES: QwenSizes = QwenSizes {
    vocab_size: 32_000,
    hidden_size: 512,
    intermediate_size: 1536,
    num_hidden_layers: 10,
    num_attention_heads: 8,
    num_key_value_heads: 2,
    max_position_embeddings: 1024,
    tie_word_embeddings: true,
    initializer_range: 0.02,
};

/// The sizes of a fresh Qwen2-shaped model, for [`ModelConfig::qwen2`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QwenSizes {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Standard deviation of the initial weights (transformers' default is 0.02).
    pub initializer_range: f64,
}

/// The architecture of a causal LM, parsed from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Key/value heads of grouped-query attention. When the key is absent, transformers uses the
    /// class default: `num_attention_heads` for Llama, 32 for Qwen2 and Qwen3; `null` means
    /// `num_attention_heads` for all three.
    pub num_key_value_heads: usize,
    /// The explicit `head_dim`, else `hidden_size / num_attention_heads` (Qwen3's class default
    /// is 128 when the key is absent).
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope: Rope,
    pub max_position_embeddings: usize,
    /// Whether `lm_head` shares its weight with `embed_tokens`.
    pub tie_word_embeddings: bool,
    /// The `attention_bias` key (Llama, Qwen3): bias on the q/k/v and output projections. Qwen2
    /// ignores it; see [`ModelConfig::qkv_bias`] and [`ModelConfig::o_proj_bias`].
    pub attention_bias: bool,
    /// Bias on the MLP projections (Llama's `mlp_bias`; never for Qwen).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys (Qwen3).
    pub qk_norm: bool,
    /// The stored weights' dtype as named in the config (`"bfloat16"`, `"float32"`, ...).
    pub dtype: Option<String>,
    pub bos_token_id: Option<i64>,
    pub pad_token_id: Option<i64>,
    /// `eos_token_id`, which may be one id or a list.
    pub eos_token_ids: Vec<i64>,
    /// The config as read, written back by `save_pretrained`.
    raw: Map<String, Value>,
}

impl ModelConfig {
    /// The same config naming its tokenizer's end-of-sequence and padding tokens
    /// (`eos_token_id`, `pad_token_id`), as generation loops read them from `config.json` and
    /// `generation_config.json`.
    pub fn with_special_tokens(mut self, eos: Option<u32>, pad: Option<u32>) -> Self {
        self.eos_token_ids = eos.map(i64::from).into_iter().collect();
        self.pad_token_id = pad.map(i64::from);
        self.raw.insert("eos_token_id".into(), eos.map_or(Value::Null, Value::from));
        self.raw.insert("pad_token_id".into(), pad.map_or(Value::Null, Value::from));
        self
    }

    /// Whether a Hugging Face checkpoint of this model holds tensor `name`: all but a tied
    /// `lm_head.weight`, which is the embedding's.
    pub fn stores(&self, name: &str) -> bool {
        !(self.tie_word_embeddings && name == "lm_head.weight")
    }

    /// Reads `config.json` from a model folder, or from the given file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let path = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
        let value: Value = require_json(&path)?;
        Self::from_json(&value, &path)
    }

    /// Parses a config already read as JSON; `path` is only used in errors.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self, ModelError> {
        let Value::Object(raw) = value else {
            return Err(config_error(path, "(root)", value, "expected a JSON object"));
        };
        let keys = Keys { path, map: raw, block: None };
        let family = family(&keys)?;

        let hidden_size = keys.usize("hidden_size")?;
        let num_attention_heads = keys.usize("num_attention_heads")?;
        if num_attention_heads == 0 {
            return Err(keys.invalid("num_attention_heads", "must be positive"));
        }
        let num_key_value_heads = match raw.get("num_key_value_heads") {
            None if family != Family::Llama => 32,
            None | Some(Value::Null) => num_attention_heads,
            Some(_) => keys.usize("num_key_value_heads")?,
        };
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(ModelError::Config {
                path: path.to_path_buf(),
                key: "num_key_value_heads".to_owned(),
                value: match raw.get("num_key_value_heads") {
                    Some(value) => value.to_string(),
                    None => format!("{num_key_value_heads} (the default)"),
                },
                reason: format!("must divide num_attention_heads ({num_attention_heads})"),
            });
        }
        let head_dim = match raw.get("head_dim") {
            None if family == Family::Qwen3 => 128,
            None | Some(Value::Null) => hidden_size / num_attention_heads,
            Some(_) => keys.usize("head_dim")?,
        };

        let hidden_act = keys.str("hidden_act")?.unwrap_or("silu");
        if hidden_act != "silu" {
            return Err(keys.invalid("hidden_act", "only \"silu\" is supported"));
        }
        for key in ["use_sliding_window", "use_bidirectional_attention"] {
            if keys.bool(key)? == Some(true) {
                return Err(keys.invalid(key, "only causal full attention is supported"));
            }
        }
        if let Some(Value::Array(layer_types)) = raw.get("layer_types")
            && layer_types.iter().any(|t| t != "full_attention")
        {
            return Err(keys.invalid("layer_types", "only \"full_attention\" layers are supported"));
        }

        let max_position_embeddings =
            keys.usize_or("max_position_embeddings", if family == Family::Llama { 2048 } else { 32768 })?;
        let (default_bos, default_eos) = match family {
            Family::Llama => (Some(1), vec![2]),
            Family::Qwen2 | Family::Qwen3 => (None, Vec::new()),
        };
        let bos_token_id = match raw.get("bos_token_id") {
            None => default_bos,
            Some(_) => keys.i64("bos_token_id")?,
        };
        let eos_token_ids = match raw.get("eos_token_id") {
            None => default_eos,
            Some(_) => keys.ids("eos_token_id")?,
        };

        Ok(ModelConfig {
            family,
            vocab_size: keys.usize("vocab_size")?,
            hidden_size,
            intermediate_size: keys.usize("intermediate_size")?,
            num_hidden_layers: keys.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: keys.f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope: rope(&keys, max_position_embeddings)?,
            max_position_embeddings,
            tie_word_embeddings: keys.bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: keys.bool("attention_bias")?.unwrap_or(false),
            mlp_bias: family == Family::Llama && keys.bool("mlp_bias")?.unwrap_or(false),
            qk_norm: family == Family::Qwen3,
            dtype: match keys.str("dtype")? {
                Some(dtype) => Some(dtype.to_owned()),
                None => keys.str("torch_dtype")?.map(str::to_owned),
            },
            bos_token_id,
            pad_token_id: keys.i64("pad_token_id")?,
            eos_token_ids,
            raw: raw.clone(),
        })
    }

    /// The config of a fresh `Qwen2ForCausalLM` of the given sizes: the `config.json`
    /// transformers 5 writes for `Qwen2Config(**sizes)`, parsed like any other, so that a model
    /// built from it saves as a folder transformers loads.
    pub fn qwen2(sizes: QwenSizes) -> Result<Self, ModelError> {
        let layer_types = vec!["full_attention"; sizes.num_hidden_layers];
        let value = json!({
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": null,
            "dtype": "float32",
            "eos_token_id": null,
            "hidden_act": "silu",
            "hidden_size": sizes.hidden_size,
            "initializer_range": sizes.initializer_range,
            "intermediate_size": sizes.intermediate_size,
            "layer_types": layer_types,
            "max_position_embeddings": sizes.max_position_embeddings,
            "max_window_layers": 28,
            "model_type": "qwen2",
            "num_attention_heads": sizes.num_attention_heads,
            "num_hidden_layers": sizes.num_hidden_layers,
            "num_key_value_heads": sizes.num_key_value_heads,
            "pad_token_id": null,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "sliding_window": null,
            "tie_word_embeddings": sizes.tie_word_embeddings,
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": sizes.vocab_size,
        });
        Self::from_json(&value, Path::new("(Qwen2 sizes)"))
    }

    /// The standard deviation of the initial weights (`initializer_range`, 0.02 when absent or
    /// zero, as in transformers' `_init_weights`).
    pub fn initializer_range(&self) -> f64 {
        self.raw.get("initializer_range").and_then(Value::as_f64).filter(|&std| std != 0.0).unwrap_or(0.02)
    }

    /// Whether the q, k and v projections have a bias: always for Qwen2, else `attention_bias`.
    pub fn qkv_bias(&self) -> bool {
        self.family == Family::Qwen2 || self.attention_bias
    }

    /// Whether the attention output projection has a bias: never for Qwen2, else
    /// `attention_bias`.
    pub fn o_proj_bias(&self) -> bool {
        self.family != Family::Qwen2 && self.attention_bias
    }

    /// The config as read, with its dtype key (`dtype` and/or `torch_dtype`, whichever it has;
    /// `dtype` if neither) set to `dtype`.
    pub(super) fn to_json_with_dtype(&self, dtype: &str) -> Value {
        let mut raw = self.raw.clone();
        let mut updated = false;
        for key in ["dtype", "torch_dtype"] {
            if let Some(value) = raw.get_mut(key) {
                *value = Value::from(dtype);
                updated = true;
            }
        }
        if !updated {
            raw.insert("dtype".to_owned(), Value::from(dtype));
        }
        Value::Object(raw)
    }
}

/// The family named by `architectures[0]`, else by `model_type`.
fn family(keys: &Keys) -> Result<Family, ModelError> {
    let architecture = match keys.map.get("architectures") {
        Some(Value::Array(names)) => names.first().and_then(Value::as_str),
        _ => None,
    };
    let unsupported = |architecture: &str| ModelError::UnsupportedArchitecture {
        path: keys.path.to_path_buf(),
        architecture: architecture.to_owned(),
    };
    match (architecture, keys.str("model_type")?) {
        (Some(architecture), _) => {
            Family::from_architecture(architecture).ok_or_else(|| unsupported(architecture))
        }
        (None, Some(model_type)) => {
            Family::from_model_type(model_type).ok_or_else(|| unsupported(model_type))
        }
        (None, None) => Err(keys.missing("architectures")),
    }
}

/// RoPE parameters, resolved as transformers' `RotaryEmbeddingConfigMixin` does: a non-empty
/// `rope_scaling` wins over `rope_parameters`; `rope_theta` comes from the block, else the top
/// level, else 10000; the type from `rope_type`, else `type`, else `"default"`.
fn rope(keys: &Keys, max_position_embeddings: usize) -> Result<Rope, ModelError> {
    let block = ["rope_scaling", "rope_parameters"].into_iter().find_map(|key| match keys.map.get(key) {
        Some(Value::Object(map)) if !map.is_empty() => Some(Keys { path: keys.path, map, block: Some(key) }),
        _ => None,
    });
    let block_theta = match &block {
        Some(block) => block.f64("rope_theta")?,
        None => None,
    };
    let theta = match block_theta {
        Some(theta) => theta,
        None => keys.f64("rope_theta")?.unwrap_or(10_000.0),
    };
    let Some(block) = block else {
        return Ok(Rope { theta, scaling: RopeScaling::Default });
    };
    if let Some(factor) = block.f64("partial_rotary_factor")?
        && factor != 1.0
    {
        return Err(block.invalid("partial_rotary_factor", "partial rotary embeddings are not supported"));
    }
    let type_key = if block.map.contains_key("rope_type") { "rope_type" } else { "type" };
    let scaling = match block.str(type_key)?.unwrap_or("default") {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: block.required_f64("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: block.required_f64("factor")?,
            low_freq_factor: block.required_f64("low_freq_factor")?,
            high_freq_factor: block.required_f64("high_freq_factor")?,
            // A top-level value wins over the block's (transformers' Phi-3 exception).
            original_max_position_embeddings: keys.usize_or(
                "original_max_position_embeddings",
                block.usize_or("original_max_position_embeddings", max_position_embeddings)?,
            )?,
        },
        _ => {
            return Err(block.invalid(type_key, "unsupported RoPE type (supported: default, linear, llama3)"));
        }
    };
    Ok(Rope { theta, scaling })
}

/// Typed access to the keys of one JSON object, with errors naming the file and the full key.
struct Keys<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
    /// The key of the enclosing block (`rope_scaling`), `None` at the top level.
    block: Option<&'a str>,
}

impl<'a> Keys<'a> {
    /// The full name of `key`, as errors show it: `rope_scaling.factor`.
    fn name(&self, key: &str) -> String {
        match self.block {
            Some(block) => format!("{block}.{key}"),
            None => key.to_owned(),
        }
    }

    /// The value of `key`, `None` when absent or `null`.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|value| !value.is_null())
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let value = self.get(key).ok_or_else(|| self.missing(key))?;
        value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.invalid(key, "expected a non-negative integer"))
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        match self.get(key) {
            Some(_) => self.usize(key),
            None => Ok(default),
        }
    }

    fn i64(&self, key: &str) -> Result<Option<i64>, ModelError> {
        self.get(key)
            .map(|value| value.as_i64().ok_or_else(|| self.invalid(key, "expected an integer")))
            .transpose()
    }

    /// One integer or a list of integers.
    fn ids(&self, key: &str) -> Result<Vec<i64>, ModelError> {
        let invalid = || self.invalid(key, "expected an integer or a list of integers");
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|item| item.as_i64().ok_or_else(invalid)).collect(),
            Some(value) => Ok(vec![value.as_i64().ok_or_else(invalid)?]),
        }
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.get(key)
            .map(|value| value.as_f64().ok_or_else(|| self.invalid(key, "expected a number")))
            .transpose()
    }

    fn required_f64(&self, key: &str) -> Result<f64, ModelError> {
        self.f64(key)?.ok_or_else(|| self.missing(key))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        self.get(key)
            .map(|value| value.as_bool().ok_or_else(|| self.invalid(key, "expected a boolean")))
            .transpose()
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, ModelError> {
        self.get(key)
            .map(|value| value.as_str().ok_or_else(|| self.invalid(key, "expected a string")))
            .transpose()
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            key: self.name(key),
            value: "(missing)".to_owned(),
            reason: "required key is missing".to_owned(),
        }
    }

    fn invalid(&self, key: &str, reason: &str) -> ModelError {
        let value = self.map.get(key).unwrap_or(&Value::Null);
        config_error(self.path, &self.name(key), value, reason)
    }
}

fn config_error(path: &Path, key: &str, value: &Value, reason: &str) -> ModelError {
    ModelError::Config {
        path: PathBuf::from(path),
        key: key.to_owned(),
        value: value.to_string(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A valid classic-style Llama config to mutate in the error tests.
    fn llama_json() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 128,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "rope_theta": 500000.0,
            "torch_dtype": "bfloat16"
        })
    }

    fn parse(value: Value) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_json(&value, Path::new("test/config.json"))
    }

    fn error_message(value: Value) -> String {
        parse(value).unwrap_err().to_string()
    }

    #[test]
    fn qwen2_classic_style() {
        let c = ModelConfig::load(kart_testing::model("tiny-qwen2")).unwrap();
        assert_eq!(c.family, Family::Qwen2);
        assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size), (366, 64, 128));
        assert_eq!((c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads), (2, 4, 2));
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.rope, Rope { theta: 10_000.0, scaling: RopeScaling::Default });
        assert_eq!(c.max_position_embeddings, 512);
        assert!(c.tie_word_embeddings);
        assert!(c.qkv_bias() && !c.o_proj_bias() && !c.mlp_bias && !c.qk_norm);
        assert_eq!(c.dtype.as_deref(), Some("float32"));
        assert_eq!((c.bos_token_id, c.pad_token_id), (None, None));
        assert!(c.eos_token_ids.is_empty());
    }

    #[test]
    fn qwen3_new_style() {
        let c = ModelConfig::load(kart_testing::model("tiny-qwen3").join("config.json")).unwrap();
        assert_eq!(c.family, Family::Qwen3);
        assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (4, 2, 16));
        assert_eq!(c.rope, Rope { theta: 1_000_000.0, scaling: RopeScaling::Default });
        assert!(c.tie_word_embeddings);
        assert!(c.qk_norm && !c.qkv_bias() && !c.o_proj_bias() && !c.mlp_bias);
        assert_eq!(c.dtype.as_deref(), Some("float32"));
    }

    #[test]
    fn llama_new_style() {
        let c = ModelConfig::load(kart_testing::model("tiny-llama")).unwrap();
        assert_eq!(c.family, Family::Llama);
        assert_eq!((c.vocab_size, c.intermediate_size), (366, 160));
        assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (4, 4, 16));
        assert_eq!(c.rms_norm_eps, 1e-5);
        assert_eq!(c.rope, Rope { theta: 10_000.0, scaling: RopeScaling::Default });
        assert!(!c.tie_word_embeddings);
        assert!(!c.qkv_bias() && !c.o_proj_bias() && !c.mlp_bias && !c.qk_norm);
        assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice()), (Some(1), &[2][..]));
    }

    #[test]
    fn llama3_rope_scaling() {
        let mut value = llama_json();
        value["rope_scaling"] = json!({
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3"
        });
        value["eos_token_id"] = json!([128001, 128008, 128009]);
        let c = parse(value).unwrap();
        assert_eq!(c.rope.theta, 500_000.0);
        assert_eq!(
            c.rope.scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }
        );
        assert_eq!(c.eos_token_ids, [128001, 128008, 128009]);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn legacy_type_key_and_rope_parameters_theta() {
        let mut value = llama_json();
        value["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        assert_eq!(parse(value).unwrap().rope.scaling, RopeScaling::Linear { factor: 2.0 });

        let mut value = llama_json();
        value["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1234.0});
        assert_eq!(parse(value).unwrap().rope.theta, 1234.0);
    }

    #[test]
    fn family_defaults_follow_transformers() {
        let mut value = llama_json();
        let map = value.as_object_mut().unwrap();
        for key in ["num_key_value_heads", "rope_theta", "hidden_act", "torch_dtype"] {
            map.remove(key);
        }
        let c = parse(value.clone()).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim), (4, 16));
        assert_eq!((c.rope.theta, c.max_position_embeddings, c.rms_norm_eps), (10_000.0, 2048, 1e-6));
        assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice(), c.dtype), (Some(1), &[2][..], None));

        value["architectures"] = json!(["Qwen3ForCausalLM"]);
        let message = error_message(value.clone());
        assert!(message.contains("`num_key_value_heads` = 32 (the default)"), "{message}");
        value["num_attention_heads"] = json!(64);
        let c = parse(value).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim, c.max_position_embeddings), (32, 128, 32768));
        assert_eq!((c.bos_token_id, c.eos_token_ids.len()), (None, 0));
    }

    #[test]
    fn unsupported_architecture_is_named() {
        let mut value = llama_json();
        value["architectures"] = json!(["MistralForCausalLM"]);
        let message = error_message(value);
        assert!(message.contains("test/config.json") && message.contains("MistralForCausalLM"), "{message}");

        let mut value = llama_json();
        value.as_object_mut().unwrap().remove("architectures");
        value["model_type"] = json!("gemma");
        assert!(error_message(value).contains("`gemma`"));
    }

    #[test]
    fn unsupported_values_name_key_and_value() {
        let mut value = llama_json();
        value["hidden_act"] = json!("gelu");
        let message = error_message(value);
        assert!(message.contains("`hidden_act` = \"gelu\""), "{message}");

        let mut value = llama_json();
        value["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let message = error_message(value);
        assert!(message.contains("`rope_scaling.rope_type` = \"yarn\""), "{message}");

        let mut value = llama_json();
        value["rope_parameters"] = json!({"rope_type": "llama3", "factor": 8.0});
        let message = error_message(value);
        assert!(message.contains("`rope_parameters.low_freq_factor`"), "{message}");

        let mut value = llama_json();
        value["use_sliding_window"] = json!(true);
        assert!(error_message(value).contains("`use_sliding_window` = true"));

        let mut value = llama_json();
        value["num_key_value_heads"] = json!(3);
        assert!(error_message(value).contains("`num_key_value_heads` = 3"));
    }

    #[test]
    fn missing_and_mistyped_keys_are_named() {
        let mut value = llama_json();
        value.as_object_mut().unwrap().remove("hidden_size");
        let message = error_message(value);
        assert!(message.contains("test/config.json") && message.contains("`hidden_size`"), "{message}");
        assert!(message.contains("missing"), "{message}");

        let mut value = llama_json();
        value["vocab_size"] = json!("many");
        assert!(error_message(value).contains("`vocab_size` = \"many\""));

        let message = error_message(json!([1, 2]));
        assert!(message.contains("expected a JSON object"), "{message}");
    }

    #[test]
    fn missing_config_file_is_named() {
        let err = ModelConfig::load(kart_testing::model("no-such-model")).unwrap_err();
        assert!(matches!(err, ModelError::File(kart_tokenizer::file::FileError::Missing { .. })), "{err}");
        assert!(err.to_string().contains("no-such-model"), "{err}");
    }

    fn sizes() -> QwenSizes {
        QwenSizes {
            vocab_size: 1000,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 3,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 256,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        }
    }

    #[test]
    fn qwen2_from_sizes() {
        let c = ModelConfig::qwen2(sizes()).unwrap();
        assert_eq!(c.family, Family::Qwen2);
        assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size), (1000, 64, 128));
        assert_eq!(
            (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            (3, 4, 2, 16)
        );
        assert_eq!((c.max_position_embeddings, c.tie_word_embeddings), (256, true));
        assert_eq!(c.rope, Rope { theta: 10_000.0, scaling: RopeScaling::Default });
        assert_eq!((c.rms_norm_eps, c.initializer_range()), (1e-6, 0.02));
        assert!(c.qkv_bias() && !c.o_proj_bias());
        assert_eq!(c.to_json_with_dtype("float32")["layer_types"].as_array().unwrap().len(), 3);
        assert_eq!((c.eos_token_ids.len(), c.pad_token_id), (0, None));
        let named = c.clone().with_special_tokens(Some(2), Some(0));
        assert_eq!((named.eos_token_ids.as_slice(), named.pad_token_id), (&[2][..], Some(0)));
        let json = named.to_json_with_dtype("float32");
        assert_eq!((&json["eos_token_id"], &json["pad_token_id"]), (&json!(2), &json!(0)));

        let message =
            ModelConfig::qwen2(QwenSizes { num_key_value_heads: 3, ..sizes() }).unwrap_err().to_string();
        assert!(
            message.contains("(Qwen2 sizes)") && message.contains("`num_key_value_heads` = 3"),
            "{message}"
        );
    }

    #[test]
    fn initializer_range_defaults_like_transformers() {
        let mut value = llama_json();
        assert_eq!(parse(value.clone()).unwrap().initializer_range(), 0.02);
        value["initializer_range"] = json!(0.0);
        assert_eq!(parse(value.clone()).unwrap().initializer_range(), 0.02);
        value["initializer_range"] = json!(0.1);
        assert_eq!(parse(value).unwrap().initializer_range(), 0.1);
    }

    #[test]
    fn dtype_is_updated_in_the_style_of_the_config() {
        let classic = ModelConfig::load(kart_testing::model("tiny-qwen2")).unwrap();
        let json = classic.to_json_with_dtype("bfloat16");
        assert_eq!((&json["torch_dtype"], json.get("dtype")), (&json!("bfloat16"), None));
        assert_eq!(json["architectures"], json!(["Qwen2ForCausalLM"]));

        let new = ModelConfig::load(kart_testing::model("tiny-llama")).unwrap();
        let json = new.to_json_with_dtype("bfloat16");
        assert_eq!((&json["dtype"], json.get("torch_dtype")), (&json!("bfloat16"), None));
        assert_eq!(json["rope_parameters"], json!({"rope_theta": 10000.0, "rope_type": "default"}));
    }
}
