//! Sentence embeddings from a BERT-family encoder (BERT, MiniLM, E5, BGE) in tch, computing what
//! sentence-transformers computes.
//!
//! [`Encoder::load`] reads a Hugging Face folder: `config.json` (a `bert` model), `tokenizer.json`
//! (WordPiece or BPE, with its post-processor adding `[CLS]` … `[SEP]`) and the safetensors
//! checkpoint, whose tensor names may carry a `bert.` prefix. Tensors outside the encoder (the
//! pooler, pre-training heads) are ignored. The settings come from the folder when it is a
//! sentence-transformers folder, else from the [`EncoderConfig`]:
//! - `modules.json` lists the modules (a `Transformer`, a `Pooling` whose `config.json` chooses mean
//!   or CLS pooling, and optionally `Normalize`, which turns L2 normalisation on);
//! - `sentence_bert_config.json` gives `max_seq_length`.
//!
//! Query and passage prefixes (E5's `query: ` / `passage: `) and the batch size always come from
//! the [`EncoderConfig`]. Inputs longer than the maximum length are truncated (special tokens
//! included, never beyond the model's `max_position_embeddings`).
//!
//! [`Encoder::encode`] tokenises a call's texts in parallel, sorts them by length so that batches
//! hold similar lengths and little padding, runs the batches and returns the embeddings in the
//! order of the texts. Weights are f32 on the CPU and bf16 on CUDA; embeddings are always f32.
//!
//! The encoder drives the `tokenizers` crate directly rather than [`kart_tokenizer::Tokenizer`]: it
//! needs the backend's truncation and parallel batch encoding, and none of the generation-side
//! special-token handling.
//!
//! ```no_run
//! # use kart_core::config::retriever::EncoderConfig;
//! # use kart_retriever::encoder::{Encoder, TextKind};
//! let dir = std::path::Path::new("models/all-MiniLM-L6-v2");
//! let encoder = Encoder::load(dir, &EncoderConfig::default(), tch::Device::Cpu)?;
//! let embeddings = encoder.encode(&["Who wrote Hamlet?".to_string()], TextKind::Query)?;
//! assert_eq!(embeddings.size(), [1, encoder.dim() as i64]);
//! # Ok::<(), kart_retriever::RetrieverError>(())
//! ```

use std::cmp::Reverse;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};
use tokenizers::{PostProcessor, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::RetrieverError;
use kart_core::config::retriever::{EncoderConfig, Pooling};
use kart_model::{ModelError, Weights};
use kart_tokenizer::TokenizerError;
use kart_tokenizer::file::{FileError, read_json, require_json};

/// Whether a text is a query or a passage, which chooses its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    Query,
    Passage,
}

/// A sentence encoder loaded from a Hugging Face folder.
#[derive(Debug)]
pub struct Encoder {
    /// The settings in effect: the folder's where it has them, else the caller's.
    config: EncoderConfig,
    tokenizer: tokenizers::Tokenizer,
    tokenizer_path: PathBuf,
    bert: Bert,
    device: Device,
}

impl Encoder {
    /// Loads the encoder in `dir` onto `device`: f32 on the CPU, bf16 on CUDA.
    pub fn load(dir: &Path, config: &EncoderConfig, device: Device) -> Result<Self, RetrieverError> {
        if config.batch_size == 0 {
            return Err(RetrieverError::BadRequest {
                field: "encoder.batch_size",
                reason: "must be at least 1, got 0".into(),
            });
        }
        let (model_dir, mut config) = settings(dir, config)?;
        let bert_config = BertConfig::load(&model_dir)?;
        config.max_length = config.max_length.min(bert_config.max_position_embeddings);

        let tokenizer_path = model_dir.join("tokenizer.json");
        let tokenizer = load_tokenizer(&tokenizer_path, config.max_length)?;
        let kind = if device.is_cuda() { Kind::BFloat16 } else { Kind::Float };
        let mut weights = Weights::load(&model_dir, device, kind)?;
        let bert = Bert::load(&mut weights, &bert_config, &model_dir)?;
        Ok(Encoder { config, tokenizer, tokenizer_path, bert, device })
    }

    /// The settings in effect, with `model` set to the folder loaded.
    pub fn config(&self) -> &EncoderConfig {
        &self.config
    }

    /// The embedding dimension.
    pub fn dim(&self) -> usize {
        self.bert.hidden as usize
    }

    /// The number of tokens the encoder runs on for `text`: with its prefix and special tokens,
    /// after truncation.
    pub fn token_count(&self, text: &str, kind: TextKind) -> Result<usize, RetrieverError> {
        let encoding =
            self.tokenizer.encode_fast(self.prefixed(text, kind), true).map_err(|e| self.error(e))?;
        Ok(encoding.len())
    }

    /// The embeddings `(N, D)` of `texts` (f32, on the encoder's device), in order.
    pub fn encode(&self, texts: &[String], kind: TextKind) -> Result<Tensor, RetrieverError> {
        let _no_grad = tch::no_grad_guard();
        let inputs: Vec<String> = texts.iter().map(|text| self.prefixed(text, kind)).collect();
        let encodings = self.tokenizer.encode_batch_fast(inputs, true).map_err(|e| self.error(e))?;
        if encodings.is_empty() {
            return Ok(Tensor::zeros([0, self.bert.hidden], (Kind::Float, self.device)));
        }

        // Longest first, so that the largest batch is met at once and batches hold similar lengths.
        let mut order: Vec<usize> = (0..encodings.len()).collect();
        order.sort_by_key(|&i| Reverse(encodings[i].len()));
        let batches = order
            .chunks(self.config.batch_size)
            .map(|rows| self.encode_batch(&rows.iter().map(|&i| &encodings[i]).collect::<Vec<_>>()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut position = vec![0i64; order.len()];
        for (sorted, &original) in order.iter().enumerate() {
            position[original] = sorted as i64;
        }
        let position = Tensor::from_slice(&position).to_device(self.device);
        Ok(Tensor::cat(&batches, 0).index_select(0, &position))
    }

    fn prefixed(&self, text: &str, kind: TextKind) -> String {
        let prefix = match kind {
            TextKind::Query => &self.config.query_prefix,
            TextKind::Passage => &self.config.passage_prefix,
        };
        format!("{prefix}{text}")
    }

    fn error(&self, e: tokenizers::Error) -> ModelError {
        ModelError::Tokenizer(TokenizerError::Tokenizer {
            path: self.tokenizer_path.clone(),
            reason: e.to_string(),
        })
    }

    /// Pads one batch of tokenised texts, runs the encoder and pools.
    fn encode_batch(&self, encodings: &[&tokenizers::Encoding]) -> Result<Tensor, RetrieverError> {
        let rows = encodings.len();
        let width = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
        // Padding is masked out of attention and pooling, so its id does not matter.
        let mut ids = vec![0i64; rows * width];
        let mut type_ids = vec![0i64; rows * width];
        let mut valid = vec![false; rows * width];
        for (row, encoding) in encodings.iter().enumerate() {
            let start = row * width;
            for (j, (&id, &type_id)) in encoding.get_ids().iter().zip(encoding.get_type_ids()).enumerate() {
                ids[start + j] = id.into();
                type_ids[start + j] = type_id.into();
                valid[start + j] = true;
            }
        }
        let shape = [rows as i64, width as i64];
        let to_device = |t: Tensor| t.f_view(shape)?.f_to_device(self.device);
        let ids = to_device(Tensor::from_slice(&ids)).map_err(ModelError::from)?;
        let type_ids = to_device(Tensor::from_slice(&type_ids)).map_err(ModelError::from)?;
        let valid = to_device(Tensor::from_slice(&valid)).map_err(ModelError::from)?;

        // Without padding, attention needs no mask (and takes the fastest kernel).
        let padded = encodings.iter().any(|e| e.len() < width);
        let attention_mask = padded.then(|| valid.view([shape[0], 1, 1, shape[1]]));
        let hidden = self.bert.forward(&ids, &type_ids, attention_mask.as_ref()).to_kind(Kind::Float);
        let pooled = match self.config.pooling {
            Pooling::Cls => hidden.select(1, 0),
            Pooling::Mean => {
                let weights = valid.to_kind(Kind::Float).unsqueeze(-1);
                (hidden * &weights).sum_dim_intlist(1, false, Kind::Float)
                    / weights.sum_dim_intlist(1, false, Kind::Float).clamp_min(1e-9)
            }
        };
        Ok(if self.config.normalize {
            // torch.nn.functional.normalize: x / max(||x||, eps).
            let norm = pooled.norm_scalaropt_dim(2, [-1], true).clamp_min(1e-12);
            pooled / norm
        } else {
            pooled
        })
    }
}

/// The folder holding the model's files and the settings in effect (see the module docs).
fn settings(dir: &Path, config: &EncoderConfig) -> Result<(PathBuf, EncoderConfig), ModelError> {
    let mut config = EncoderConfig { model: Some(dir.to_path_buf()), ..config.clone() };
    let mut model_dir = dir.to_path_buf();
    let modules_path = dir.join("modules.json");
    if let Some(modules) = read_json::<Vec<Module>>(&modules_path)? {
        config.normalize = false;
        for module in modules {
            match module.kind.rsplit('.').next().unwrap_or_default() {
                "Transformer" => model_dir = dir.join(&module.path),
                "Pooling" => config.pooling = pooling(&dir.join(&module.path).join("config.json"))?,
                "Normalize" => config.normalize = true,
                _ => {
                    return Err(ModelError::Config {
                        path: modules_path,
                        key: "type".into(),
                        value: module.kind,
                        reason: "kart supports the Transformer, Pooling and Normalize modules".into(),
                    });
                }
            }
        }
    }
    #[derive(Deserialize)]
    struct SentenceBertConfig {
        max_seq_length: Option<usize>,
    }
    let sentence_bert = read_json::<SentenceBertConfig>(&model_dir.join("sentence_bert_config.json"))?;
    if let Some(max_length) = sentence_bert.and_then(|c| c.max_seq_length) {
        config.max_length = max_length;
    }
    Ok((model_dir, config))
}

/// An entry of a sentence-transformers `modules.json`.
#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

/// The pooling of a sentence-transformers `Pooling` module's `config.json`.
fn pooling(path: &Path) -> Result<Pooling, ModelError> {
    let config: Map<String, Value> = require_json(path)?;
    let modes: Vec<&str> = config
        .iter()
        .filter(|(key, value)| key.starts_with("pooling_mode_") && **value == Value::Bool(true))
        .map(|(key, _)| key.as_str())
        .collect();
    match modes.as_slice() {
        ["pooling_mode_mean_tokens"] => Ok(Pooling::Mean),
        ["pooling_mode_cls_token"] => Ok(Pooling::Cls),
        _ => Err(ModelError::Config {
            path: path.to_path_buf(),
            key: "pooling_mode_*".into(),
            value: format!("[{}]", modes.join(", ")),
            reason: "kart supports exactly one of pooling_mode_mean_tokens and pooling_mode_cls_token".into(),
        }),
    }
}

/// `tokenizer.json`, truncating to `max_length` tokens (special tokens included) and not padding:
/// batches are padded to their longest text, whatever the file says.
fn load_tokenizer(path: &Path, max_length: usize) -> Result<tokenizers::Tokenizer, ModelError> {
    let error = |reason: String| {
        ModelError::Tokenizer(TokenizerError::Tokenizer { path: path.to_path_buf(), reason })
    };
    if !path.is_file() {
        return Err(FileError::Missing { path: path.to_path_buf() }.into());
    }
    let mut tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|e| error(e.to_string()))?;
    let special = tokenizer.get_post_processor().map_or(0, |p| p.added_tokens(false));
    if max_length <= special {
        return Err(error(format!(
            "max_length {max_length} leaves no room for text after the {special} special tokens"
        )));
    }
    let truncation = TruncationParams {
        max_length,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
        direction: TruncationDirection::Right,
    };
    tokenizer.with_truncation(Some(truncation)).map_err(|e| error(e.to_string()))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// The keys of a BERT `config.json` the encoder uses.
#[derive(Debug, Deserialize)]
struct BertConfig {
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_hidden_act")]
    hidden_act: String,
    max_position_embeddings: usize,
    #[serde(default = "default_type_vocab_size")]
    type_vocab_size: usize,
    #[serde(default = "default_layer_norm_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    position_embedding_type: Option<String>,
}

fn default_hidden_act() -> String {
    "gelu".into()
}

fn default_type_vocab_size() -> usize {
    2
}

fn default_layer_norm_eps() -> f64 {
    1e-12
}

impl BertConfig {
    fn load(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: BertConfig = require_json(&path)?;
        let invalid = |key: &str, value: String, reason: &str| ModelError::Config {
            path: path.clone(),
            key: key.into(),
            value,
            reason: reason.into(),
        };
        if let Some(model_type) = config.model_type.as_deref().filter(|t| *t != "bert") {
            return Err(invalid(
                "model_type",
                model_type.into(),
                "kart's encoder supports BERT models (`bert`)",
            ));
        }
        if let Some(kind) = config.position_embedding_type.as_deref().filter(|t| *t != "absolute") {
            return Err(invalid("position_embedding_type", kind.into(), "only `absolute` is supported"));
        }
        if config.num_attention_heads == 0 || !config.hidden_size.is_multiple_of(config.num_attention_heads) {
            return Err(invalid(
                "num_attention_heads",
                config.num_attention_heads.to_string(),
                &format!("must divide hidden_size ({})", config.hidden_size),
            ));
        }
        Activation::parse(&config.hidden_act).ok_or_else(|| {
            invalid("hidden_act", config.hidden_act.clone(), "expected gelu, gelu_new or gelu_pytorch_tanh")
        })?;
        Ok(config)
    }
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy)]
enum Activation {
    /// Exact GELU (with erf), BERT's `gelu`.
    Gelu,
    /// The tanh approximation, `gelu_new` and `gelu_pytorch_tanh`.
    GeluTanh,
}

impl Activation {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "gelu" => Some(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            _ => None,
        }
    }

    fn forward(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Gelu => x.gelu("none"),
            Activation::GeluTanh => x.gelu("tanh"),
        }
    }
}

/// A linear layer `x W^T + b`.
#[derive(Debug)]
struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    fn load(w: &mut Weights, name: &str, out: i64, inp: i64) -> Result<Self, ModelError> {
        Ok(Linear {
            weight: w.take(&format!("{name}.weight"), &[out, inp])?,
            bias: w.take(&format!("{name}.bias"), &[out])?,
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, Some(&self.bias))
    }
}

/// Layer normalisation with a weight and a bias.
#[derive(Debug)]
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn load(w: &mut Weights, name: &str, dim: i64, eps: f64) -> Result<Self, ModelError> {
        Ok(LayerNorm {
            weight: w.take(&format!("{name}.weight"), &[dim])?,
            bias: w.take(&format!("{name}.bias"), &[dim])?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.layer_norm([self.weight.size()[0]], Some(&self.weight), Some(&self.bias), self.eps, true)
    }
}

/// One post-norm encoder layer: self-attention, add & norm, feed-forward, add & norm.
#[derive(Debug)]
struct Layer {
    /// `attention.self.{query,key,value}` fused into one projection.
    qkv: Linear,
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

impl Layer {
    fn load(w: &mut Weights, prefix: &str, c: &BertConfig) -> Result<Self, ModelError> {
        let (hidden, inter) = (c.hidden_size as i64, c.intermediate_size as i64);
        let eps = c.layer_norm_eps;
        let projection = |w: &mut Weights, name: &str| {
            Linear::load(w, &format!("{prefix}.attention.self.{name}"), hidden, hidden)
        };
        let (query, key, value) = (projection(w, "query")?, projection(w, "key")?, projection(w, "value")?);
        let qkv = Linear {
            weight: Tensor::cat(&[query.weight, key.weight, value.weight], 0),
            bias: Tensor::cat(&[query.bias, key.bias, value.bias], 0),
        };
        Ok(Layer {
            qkv,
            attention_output: Linear::load(w, &format!("{prefix}.attention.output.dense"), hidden, hidden)?,
            attention_norm: LayerNorm::load(w, &format!("{prefix}.attention.output.LayerNorm"), hidden, eps)?,
            intermediate: Linear::load(w, &format!("{prefix}.intermediate.dense"), inter, hidden)?,
            output: Linear::load(w, &format!("{prefix}.output.dense"), hidden, inter)?,
            output_norm: LayerNorm::load(w, &format!("{prefix}.output.LayerNorm"), hidden, eps)?,
        })
    }

    /// `x`: `(B, T, hidden)`; `mask`: `(B, 1, 1, T)`, true for the keys to attend to.
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, heads: i64, activation: Activation) -> Tensor {
        let (b, t, hidden) = x.size3().expect("(B, T, hidden)");
        let qkv = self.qkv.forward(x).view([b, t, 3, heads, hidden / heads]).permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2));
        let context = Tensor::scaled_dot_product_attention(&q, &k, &v, mask, 0.0, false, None, false)
            .transpose(1, 2)
            .reshape([b, t, hidden]);
        let h = self.attention_norm.forward(&(self.attention_output.forward(&context) + x));
        let inter = activation.forward(&self.intermediate.forward(&h));
        self.output_norm.forward(&(self.output.forward(&inter) + h))
    }
}

/// The BERT encoder: embeddings and post-norm layers.
#[derive(Debug)]
struct Bert {
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Tensor,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
    hidden: i64,
    heads: i64,
    activation: Activation,
}

impl Bert {
    /// Takes the encoder's tensors, under `bert.` or no prefix; `dir` names the checkpoint in errors.
    fn load(w: &mut Weights, c: &BertConfig, dir: &Path) -> Result<Self, ModelError> {
        let prefix =
            if w.names().any(|n| n == "bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
        let hidden = c.hidden_size as i64;
        let embedding = |w: &mut Weights, name: &str, rows: usize| {
            w.take(&format!("{prefix}embeddings.{name}.weight"), &[rows as i64, hidden])
        };
        let word_embeddings = embedding(w, "word_embeddings", c.vocab_size)?;
        let position_embeddings = embedding(w, "position_embeddings", c.max_position_embeddings)?;
        let token_type_embeddings = embedding(w, "token_type_embeddings", c.type_vocab_size)?;
        let embeddings_norm =
            LayerNorm::load(w, &format!("{prefix}embeddings.LayerNorm"), hidden, c.layer_norm_eps)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| Layer::load(w, &format!("{prefix}encoder.layer.{i}"), c))
            .collect::<Result<_, _>>()?;

        // Encoder tensors left over mean the config and the checkpoint disagree (e.g. on the layers).
        let unused: Vec<String> = w
            .names()
            .filter(|name| {
                name.strip_prefix(prefix).is_some_and(|n| {
                    (n.starts_with("embeddings.") || n.starts_with("encoder."))
                        && !n.ends_with("position_ids")
                })
            })
            .map(str::to_owned)
            .collect();
        if !unused.is_empty() {
            return Err(ModelError::UnusedTensors { path: dir.to_path_buf(), names: unused });
        }
        Ok(Bert {
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_norm,
            layers,
            hidden,
            heads: c.num_attention_heads as i64,
            activation: Activation::parse(&c.hidden_act).expect("checked by BertConfig::load"),
        })
    }

    /// The last hidden states `(B, T, hidden)` of `ids` and `type_ids` `(B, T)`.
    fn forward(&self, ids: &Tensor, type_ids: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let t = ids.size()[1];
        let embeddings = Tensor::embedding(&self.word_embeddings, ids, -1, false, false)
            + Tensor::embedding(&self.token_type_embeddings, type_ids, -1, false, false)
            + self.position_embeddings.narrow(0, 0, t);
        let mut h = self.embeddings_norm.forward(&embeddings);
        for layer in &self.layers {
            h = layer.forward(&h, mask, self.heads, self.activation);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use kart_testing::minilm;

    /// A folder with only the Hugging Face files of `model` (no sentence-transformers settings),
    /// so the [`EncoderConfig`] decides pooling, normalisation and length.
    fn plain(model: &Path) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for file in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::os::unix::fs::symlink(model.join(file), dir.path().join(file)).unwrap();
        }
        dir
    }

    fn fixture() -> (Vec<String>, Tensor) {
        let path = kart_testing::embeddings("all-minilm-l6-v2.json");
        #[derive(Deserialize)]
        struct Fixture {
            sentences: Vec<String>,
            embeddings: Vec<Vec<f32>>,
        }
        let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let rows = fixture.embeddings.len() as i64;
        (fixture.sentences, Tensor::from_slice(&fixture.embeddings.concat()).view([rows, -1]))
    }

    fn encode(encoder: &Encoder, texts: &[&str], kind: TextKind) -> Tensor {
        encoder.encode(&texts.iter().map(|t| t.to_string()).collect::<Vec<_>>(), kind).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn matches_sentence_transformers_in_any_batching() {
        let Some(model) = minilm() else { return };
        let (sentences, expected) = fixture();
        let mut embeddings = Vec::new();
        for batch_size in [1, 7, 64] {
            let config = EncoderConfig { batch_size, ..Default::default() };
            let encoder = Encoder::load(&model, &config, Device::Cpu).unwrap();
            let got = encoder.encode(&sentences, TextKind::Passage).unwrap();
            assert_eq!(got.size(), [50, 384]);
            let cosine = Tensor::cosine_similarity(&got, &expected, 1, 1e-8);
            let worst = cosine.min().double_value(&[]);
            assert!(worst >= 0.9999, "batch size {batch_size}: cosine {worst}");
            embeddings.push(got);
        }
        assert!(max_diff(&embeddings[0], &embeddings[1]) < 1e-5);
        assert!(max_diff(&embeddings[0], &embeddings[2]) < 1e-5);
    }

    #[test]
    fn sentence_transformers_settings_override_the_config() {
        let Some(model) = minilm() else { return };
        let config =
            EncoderConfig { pooling: Pooling::Cls, normalize: false, max_length: 16, ..Default::default() };
        let encoder = Encoder::load(&model, &config, Device::Cpu).unwrap();
        let effective = encoder.config();
        assert_eq!(
            (effective.pooling, effective.normalize, effective.max_length),
            (Pooling::Mean, true, 256)
        );
        assert_eq!(effective.model.as_deref(), Some(model.as_path()));
        assert_eq!(encoder.dim(), 384);
    }

    #[test]
    fn pooling_and_normalisation_follow_the_config_of_a_plain_folder() {
        let Some(model) = minilm() else { return };
        let dir = plain(&model);
        let load = |pooling, normalize| {
            let config = EncoderConfig { pooling, normalize, ..Default::default() };
            Encoder::load(dir.path(), &config, Device::Cpu).unwrap()
        };
        let texts = ["Who wrote Hamlet?", "Paris is the capital of France."];
        let mean = encode(&load(Pooling::Mean, false), &texts, TextKind::Passage);
        let cls = encode(&load(Pooling::Cls, false), &texts, TextKind::Passage);
        let normalized = encode(&load(Pooling::Mean, true), &texts, TextKind::Passage);
        let norms = |t: &Tensor| {
            Vec::<f64>::try_from(t.norm_scalaropt_dim(2, [1], false).to_kind(Kind::Double)).unwrap()
        };
        assert!(max_diff(&mean, &cls) > 0.1, "CLS and mean pooling give the same embeddings");
        assert!(norms(&mean).iter().all(|n| (n - 1.0).abs() > 1e-3), "{:?}", norms(&mean));
        assert!(norms(&normalized).iter().all(|n| (n - 1.0).abs() < 1e-5), "{:?}", norms(&normalized));
        let rescaled = &mean / mean.norm_scalaropt_dim(2, [1], true);
        assert!(max_diff(&rescaled, &normalized) < 1e-6);
    }

    #[test]
    fn prefixes_are_prepended_by_kind() {
        let Some(model) = minilm() else { return };
        let config = EncoderConfig {
            query_prefix: "query: ".into(),
            passage_prefix: "passage: ".into(),
            ..Default::default()
        };
        let encoder = Encoder::load(&model, &config, Device::Cpu).unwrap();
        let unprefixed = Encoder::load(&model, &EncoderConfig::default(), Device::Cpu).unwrap();
        let query = encode(&encoder, &["capital of france"], TextKind::Query);
        let passage = encode(&encoder, &["capital of france"], TextKind::Passage);
        assert!(
            max_diff(&query, &encode(&unprefixed, &["query: capital of france"], TextKind::Query)) < 1e-6
        );
        assert!(
            max_diff(&passage, &encode(&unprefixed, &["passage: capital of france"], TextKind::Query)) < 1e-6
        );
        assert!(max_diff(&query, &passage) > 1e-3);
    }

    #[test]
    fn inputs_are_truncated_at_max_length() {
        let Some(model) = minilm() else { return };
        let dir = plain(&model);
        let load = |max_length| {
            Encoder::load(dir.path(), &EncoderConfig { max_length, ..Default::default() }, Device::Cpu)
                .unwrap()
        };
        // Fourteen single-token words fill 16 tokens with [CLS] and [SEP]; what follows is cut.
        let head = "one two three four five six seven eight nine ten red blue green black";
        let long = format!("{head} and then a tail that changes the meaning entirely");
        let short = load(16);
        assert_eq!(short.token_count(&long, TextKind::Passage).unwrap(), 16);
        assert_eq!(short.token_count(head, TextKind::Passage).unwrap(), 16);
        assert!(
            max_diff(
                &encode(&short, &[head], TextKind::Passage),
                &encode(&short, &[&long], TextKind::Passage)
            ) < 1e-6
        );
        let full = load(256);
        assert!(
            max_diff(&encode(&full, &[head], TextKind::Passage), &encode(&full, &[&long], TextKind::Passage))
                > 1e-3
        );
        // Beyond the model's positions, the length is capped at max_position_embeddings.
        assert_eq!(load(4096).config().max_length, 512);
    }

    #[test]
    fn empty_input_gives_no_rows() {
        let Some(model) = minilm() else { return };
        let encoder = Encoder::load(&model, &EncoderConfig::default(), Device::Cpu).unwrap();
        assert_eq!(encoder.encode(&[], TextKind::Query).unwrap().size(), [0, 384]);
        assert_eq!(encode(&encoder, &[""], TextKind::Query).size(), [1, 384]);
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let err = Encoder::load(dir.path(), &EncoderConfig::default(), Device::Cpu).unwrap_err().to_string();
        assert_eq!(err, format!("{}: no such file", dir.path().join("config.json").display()));

        let config = serde_json::json!({
            "model_type": "roberta", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 32,
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let err = Encoder::load(dir.path(), &EncoderConfig::default(), Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("config.json: `model_type` = roberta: kart's encoder supports BERT"), "{err}");

        let zero = EncoderConfig { batch_size: 0, ..Default::default() };
        let err = Encoder::load(dir.path(), &zero, Device::Cpu).unwrap_err().to_string();
        assert_eq!(err, "encoder.batch_size: must be at least 1, got 0");

        std::fs::write(
            dir.path().join("modules.json"),
            r#"[{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}]"#,
        )
        .unwrap();
        let err = Encoder::load(dir.path(), &EncoderConfig::default(), Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("modules.json: `type` = sentence_transformers.models.Dense"), "{err}");
    }

    #[test]
    fn checkpoints_of_bert_heads_load_under_their_prefix() {
        let Some(model) = minilm() else { return };
        let dir = tempfile::tempdir().unwrap();
        for file in ["config.json", "tokenizer.json"] {
            std::os::unix::fs::symlink(model.join(file), dir.path().join(file)).unwrap();
        }
        let mut tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(model.join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(name, tensor)| (format!("bert.{name}"), tensor))
            .collect();
        tensors.push(("cls.predictions.bias".into(), Tensor::zeros([30522], (Kind::Float, Device::Cpu))));
        Tensor::write_safetensors(&tensors, dir.path().join("model.safetensors")).unwrap();
        let texts = ["Who wrote Hamlet?"];
        let prefixed = Encoder::load(dir.path(), &EncoderConfig::default(), Device::Cpu).unwrap();
        let plain_dir = plain(&model);
        let unprefixed = Encoder::load(plain_dir.path(), &EncoderConfig::default(), Device::Cpu).unwrap();
        let (a, b) =
            (encode(&prefixed, &texts, TextKind::Query), encode(&unprefixed, &texts, TextKind::Query));
        assert!(max_diff(&a, &b) < 1e-7);
    }

    #[test]
    fn checkpoint_errors_name_the_tensor() {
        let Some(model) = minilm() else { return };
        let dir = tempfile::tempdir().unwrap();
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
        config["num_hidden_layers"] = serde_json::json!(5);
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        for file in ["tokenizer.json", "model.safetensors"] {
            std::os::unix::fs::symlink(model.join(file), dir.path().join(file)).unwrap();
        }
        let err = Encoder::load(dir.path(), &EncoderConfig::default(), Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("unused tensors in checkpoint: encoder.layer.5."), "{err}");
    }
}
