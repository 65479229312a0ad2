//! Writing a Hugging Face model folder that transformers, vLLM and SGLang load.
//!
//! [`save_pretrained`] writes what transformers' `save_pretrained` writes: the weights as
//! `model.safetensors`, or as shards `model-00001-of-0000N.safetensors` with an index once they
//! exceed the maximum shard size; `config.json` with its dtype updated; `generation_config.json`;
//! and the tokenizer files of the folder the model came from.
//!
//! The folder is written next to its destination under a temporary name and renamed into place
//! only when complete, so a crash leaves either the previous folder or the new one, never a mix.
//! Saving over the folder the model was loaded from is safe: its files are copied before the
//! swap.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tch::{Kind, Tensor};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::weights::{INDEX_FILE, SINGLE_FILE, save_safetensors};
use kart_tokenizer::file::FileError;

/// The default maximum shard size in bytes: 5 GB, as in transformers 4 (transformers 5 uses
/// 50 GB; smaller shards load and upload more easily).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// Tokenizer files copied from the source folder when present.
const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

const GENERATION_CONFIG: &str = "generation_config.json";

/// Saves a model to `dir` in Hugging Face format, its weights converted to `dtype`, with shards
/// of at most [`DEFAULT_MAX_SHARD_SIZE`] bytes.
///
/// `tensors` are named as in the checkpoint (`model.layers.0.self_attn.q_proj.weight`);
/// `lm_head.weight` is left out when the config ties it to the embeddings. `source_dir`, the
/// folder the model was loaded from, provides the tokenizer files and `generation_config.json`;
/// without one, a generation config is derived from the model config.
pub fn save_pretrained(
    dir: impl AsRef<Path>,
    config: &ModelConfig,
    tensors: &[(String, Tensor)],
    source_dir: Option<&Path>,
    dtype: Kind,
) -> Result<(), ModelError> {
    save_pretrained_with_max_shard_size(dir, config, tensors, source_dir, dtype, DEFAULT_MAX_SHARD_SIZE)
}

/// [`save_pretrained`] with shards of at most `max_shard_size` bytes (a tensor larger than
/// that gets a shard of its own).
pub fn save_pretrained_with_max_shard_size(
    dir: impl AsRef<Path>,
    config: &ModelConfig,
    tensors: &[(String, Tensor)],
    source_dir: Option<&Path>,
    dtype: Kind,
    max_shard_size: u64,
) -> Result<(), ModelError> {
    let dir = dir.as_ref();
    let dtype_name = match dtype {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        kind => {
            return Err(ModelError::Config {
                path: dir.join("config.json"),
                key: "dtype".to_owned(),
                value: format!("{kind:?}"),
                reason: "weights can only be saved as float32, bfloat16, float16 or float64".to_owned(),
            });
        }
    };
    let tensors: Vec<(&str, &Tensor)> = tensors
        .iter()
        .filter(|(name, _)| config.stores(name))
        .map(|(name, tensor)| (name.as_str(), tensor))
        .collect();

    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    let staging = sibling(dir, "partial")?;
    fs::create_dir(&staging).map_err(io_error(&staging))?;
    let written = write_weights(&staging, &tensors, dtype, max_shard_size)
        .and_then(|()| write_json(&staging.join("config.json"), &config.to_json_with_dtype(dtype_name)))
        .and_then(|()| copy_source_files(&staging, config, source_dir))
        .and_then(|()| sync_files(&staging))
        .and_then(|()| replace_dir(&staging, dir));
    if written.is_err() {
        // Best effort: the error being returned matters more than a leftover temporary folder.
        let _ = fs::remove_dir_all(&staging);
    }
    written
}

/// Writes the weights: one file, or shards and their index.
fn write_weights(
    dir: &Path,
    tensors: &[(&str, &Tensor)],
    dtype: Kind,
    max_shard_size: u64,
) -> Result<(), ModelError> {
    let element_size = dtype.elt_size_in_bytes() as u64;
    let shards = split_into_shards(tensors, element_size, max_shard_size);
    if shards.len() == 1 {
        return save_safetensors(&dir.join(SINGLE_FILE), shards[0].iter().copied(), dtype);
    }
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len());
        save_safetensors(&dir.join(&file), shard.iter().copied(), dtype)?;
        for &(name, _) in shard {
            weight_map.insert(name, file.clone());
        }
    }
    let total_parameters: u64 = tensors.iter().map(|(_, t)| t.numel() as u64).sum();
    let index = json!({
        "metadata": {
            "total_parameters": total_parameters,
            "total_size": total_parameters * element_size,
        },
        "weight_map": weight_map,
    });
    write_json(&dir.join(INDEX_FILE), &index)
}

/// Groups tensors into shards as huggingface_hub's `split_torch_state_dict_into_shards` does:
/// in order, starting a new shard when the next tensor would push the current one past
/// `max_size`, and giving a tensor larger than `max_size` a shard of its own. Always at least
/// one shard.
fn split_into_shards<'a>(
    tensors: &[(&'a str, &'a Tensor)],
    element_size: u64,
    max_size: u64,
) -> Vec<Vec<(&'a str, &'a Tensor)>> {
    let mut shards = Vec::new();
    let mut current = Vec::new();
    let mut current_size = 0;
    for &(name, tensor) in tensors {
        let size = tensor.numel() as u64 * element_size;
        if size > max_size {
            shards.push(vec![(name, tensor)]);
            continue;
        }
        if current_size + size > max_size {
            shards.push(std::mem::take(&mut current));
            current_size = 0;
        }
        current.push((name, tensor));
        current_size += size;
    }
    if !current.is_empty() || shards.is_empty() {
        shards.push(current);
    }
    shards
}

/// Copies the tokenizer files and the generation config from `source_dir`, deriving the
/// generation config from `config` when the source has none.
fn copy_source_files(dir: &Path, config: &ModelConfig, source_dir: Option<&Path>) -> Result<(), ModelError> {
    let source = |file: &str| source_dir.map(|source| source.join(file)).filter(|path| path.is_file());
    let copy = |from: PathBuf, file: &str| fs::copy(&from, dir.join(file)).map(drop).map_err(io_error(&from));
    for file in TOKENIZER_FILES {
        if let Some(from) = source(file) {
            copy(from, file)?;
        }
    }
    match source(GENERATION_CONFIG) {
        Some(from) => copy(from, GENERATION_CONFIG),
        None => write_json(&dir.join(GENERATION_CONFIG), &generation_config(config)),
    }
}

/// The generation config transformers derives from a model config: its special token ids.
fn generation_config(config: &ModelConfig) -> Value {
    let mut map = Map::new();
    map.insert("_from_model_config".to_owned(), Value::Bool(true));
    if let Some(bos) = config.bos_token_id {
        map.insert("bos_token_id".to_owned(), bos.into());
    }
    match config.eos_token_ids.as_slice() {
        [] => {}
        [eos] => {
            map.insert("eos_token_id".to_owned(), (*eos).into());
        }
        ids => {
            map.insert("eos_token_id".to_owned(), ids.into());
        }
    }
    if let Some(pad) = config.pad_token_id {
        map.insert("pad_token_id".to_owned(), pad.into());
    }
    Value::Object(map)
}

/// Writes `value` as transformers does: indented by two spaces, with a final newline.
fn write_json(path: &Path, value: &Value) -> Result<(), ModelError> {
    let mut text = serde_json::to_string_pretty(value).map_err(FileError::json(path))?;
    text.push('\n');
    fs::write(path, text).map_err(io_error(path))
}

/// Flushes every file of `dir` to disk, so the renamed folder is complete after a power loss.
fn sync_files(dir: &Path) -> Result<(), ModelError> {
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        fs::File::open(&path).and_then(|file| file.sync_all()).map_err(io_error(&path))?;
    }
    Ok(())
}

/// Moves the complete folder `staging` to `dir`, replacing any previous `dir`.
///
/// The previous folder is renamed away first and restored if the second rename fails; between
/// the two renames `dir` briefly does not exist.
fn replace_dir(staging: &Path, dir: &Path) -> Result<(), ModelError> {
    if fs::symlink_metadata(dir).is_err() {
        return fs::rename(staging, dir).map_err(io_error(dir));
    }
    let previous = sibling(dir, "previous")?;
    fs::rename(dir, &previous).map_err(io_error(dir))?;
    if let Err(source) = fs::rename(staging, dir) {
        let _ = fs::rename(&previous, dir);
        return Err(io_error(dir)(source));
    }
    fs::remove_dir_all(&previous).map_err(io_error(&previous))
}

/// A fresh hidden path next to `dir`: `.{name}.{tag}-{pid}-{nanos}-{n}`.
fn sibling(dir: &Path, tag: &str) -> Result<PathBuf, ModelError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let Some(name) = dir.file_name() else {
        let source =
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "the destination must name a folder");
        return Err(io_error(dir)(source));
    };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let unique = format!(
        ".{}.{tag}-{}-{nanos}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    Ok(dir.with_file_name(unique))
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| FileError::Io { path: path.to_path_buf(), source }.into()
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;
    use crate::weights::Weights;

    fn fixture_tensors(name: &str) -> Vec<(String, Tensor)> {
        Tensor::read_safetensors(kart_testing::model(name).join(SINGLE_FILE)).unwrap()
    }

    /// Asserts that the checkpoint in `dir` holds exactly `expected`, as `kind` converted to f32.
    fn assert_checkpoint(dir: &Path, expected: &[(String, Tensor)], kind: Kind) {
        let mut weights = Weights::load(dir, Device::Cpu, Kind::Float).unwrap();
        for (name, tensor) in expected {
            let saved = weights.take(name, &tensor.size()).unwrap();
            assert!(saved.equal(&tensor.to_kind(kind).to_kind(Kind::Float)), "{name}");
        }
        assert_eq!(weights.names().collect::<Vec<_>>(), Vec::<&str>::new());
    }

    #[test]
    fn round_trip_keeps_tensors_config_and_tokenizer() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("checkpoint");
        let config = ModelConfig::load(kart_testing::model("tiny-llama")).unwrap();
        let tensors = fixture_tensors("tiny-llama");
        save_pretrained(&dir, &config, &tensors, Some(&kart_testing::model("tiny-llama")), Kind::Float)
            .unwrap();

        assert_eq!(ModelConfig::load(&dir).unwrap(), config);
        assert_checkpoint(&dir, &tensors, Kind::Float);
        for file in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", GENERATION_CONFIG] {
            assert_eq!(
                fs::read(dir.join(file)).unwrap(),
                fs::read(kart_testing::model("tiny-llama").join(file)).unwrap(),
                "{file}"
            );
        }
        assert!(!dir.join(INDEX_FILE).exists());
    }

    #[test]
    fn small_shards_come_with_an_index_and_load_back() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("sharded");
        let config = ModelConfig::load(kart_testing::model("tiny-qwen2")).unwrap();
        let tensors = fixture_tensors("tiny-qwen2");
        // The embedding (93,696 bytes) exceeds the limit and gets a shard of its own.
        save_pretrained_with_max_shard_size(&dir, &config, &tensors, None, Kind::Float, 40_000).unwrap();

        assert!(!dir.join(SINGLE_FILE).exists());
        let index: Value = serde_json::from_slice(&fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
        let shards: std::collections::BTreeSet<&str> =
            index["weight_map"].as_object().unwrap().values().filter_map(Value::as_str).collect();
        let n = shards.len();
        assert!(n > 2, "{shards:?}");
        for (i, shard) in shards.iter().enumerate() {
            assert_eq!(*shard, format!("model-{:05}-of-{n:05}.safetensors", i + 1));
        }
        let bytes: u64 = tensors.iter().map(|(_, t)| 4 * t.numel() as u64).sum();
        assert_eq!(index["metadata"]["total_size"], bytes);
        assert_checkpoint(&dir, &tensors, Kind::Float);
    }

    #[test]
    fn tied_head_is_not_written_and_dtype_is_recorded() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("bf16");
        let config = ModelConfig::load(kart_testing::model("tiny-qwen3")).unwrap();
        let mut tensors = fixture_tensors("tiny-qwen3");
        let embed = tensors.iter().find(|(n, _)| n == "model.embed_tokens.weight").unwrap();
        let head = ("lm_head.weight".to_owned(), embed.1.shallow_clone());
        tensors.push(head);
        save_pretrained(&dir, &config, &tensors, None, Kind::BFloat16).unwrap();

        tensors.pop();
        assert_checkpoint(&dir, &tensors, Kind::BFloat16);
        let saved = ModelConfig::load(&dir).unwrap();
        assert_eq!(saved.dtype.as_deref(), Some("bfloat16"));
        assert_eq!((saved.family, saved.rope), (config.family, config.rope));
        assert!(!dir.join("tokenizer.json").exists());
    }

    #[test]
    fn generation_config_is_derived_without_a_source() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("derived");
        let config = ModelConfig::load(kart_testing::model("tiny-llama")).unwrap();
        save_pretrained(&dir, &config, &fixture_tensors("tiny-llama"), None, Kind::Float).unwrap();
        let generation: Value =
            serde_json::from_slice(&fs::read(dir.join(GENERATION_CONFIG)).unwrap()).unwrap();
        assert_eq!(generation, json!({"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2}));
    }

    #[test]
    fn saving_over_a_folder_replaces_it_whole() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("policy");
        let config = ModelConfig::load(kart_testing::model("tiny-qwen2")).unwrap();
        let tensors = fixture_tensors("tiny-qwen2");
        save_pretrained_with_max_shard_size(
            &dir,
            &config,
            &tensors,
            Some(&kart_testing::model("tiny-qwen2")),
            Kind::Float,
            40_000,
        )
        .unwrap();
        // Save again over it, taking the tokenizer from the folder being replaced.
        save_pretrained(&dir, &config, &tensors, Some(&dir), Kind::BFloat16).unwrap();

        assert!(dir.join(SINGLE_FILE).exists() && !dir.join(INDEX_FILE).exists());
        assert_eq!(
            fs::read(dir.join("tokenizer.json")).unwrap(),
            fs::read(kart_testing::model("tiny-qwen2").join("tokenizer.json")).unwrap()
        );
        assert_checkpoint(&dir, &tensors, Kind::BFloat16);
        let entries: Vec<_> = fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries, ["policy"]);
    }

    #[test]
    fn unsupported_dtype_is_refused() {
        let out = tempfile::tempdir().unwrap();
        let config = ModelConfig::load(kart_testing::model("tiny-qwen2")).unwrap();
        let err = save_pretrained(out.path().join("x"), &config, &[], None, Kind::Int64).unwrap_err();
        assert!(err.to_string().contains("`dtype` = Int64"), "{err}");
        assert_eq!(fs::read_dir(out.path()).unwrap().count(), 0);
    }
}
