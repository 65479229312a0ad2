//! The tensors of a Hugging Face checkpoint, in safetensors files.
//!
//! A model folder holds either one `model.safetensors` or shards `model-00001-of-0000N.safetensors`
//! listed by `model.safetensors.index.json` (its `weight_map` names the shard of each tensor).
//! [`Weights::load`] reads only the headers; [`Weights::take`] then reads one tensor at a time,
//! checks its shape, and converts it to the requested kind and device, so host memory never holds
//! more than one tensor of the checkpoint. [`Weights::finish`] reports the tensors no one took,
//! which is how a config that does not match its checkpoint is caught.
//!
//! [`Weights::from_tensors`] serves tensors already in memory (a freshly initialised model, weights
//! received from a trainer) through the same checks.
//!
//! [`save_safetensors`] writes the same format, with the `{"format": "pt"}` metadata transformers
//! writes and some of its versions require.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorView};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::error::ModelError;
use kart_tokenizer::file::{FileError, require_json};

/// The single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The safetensors crate's bound on header size, applied before allocating for a header.
const MAX_HEADER_SIZE: u64 = 100_000_000;

/// The tensors of a checkpoint not yet taken, read on demand.
#[derive(Debug)]
pub struct Weights {
    /// What errors name for the checkpoint as a whole: `model.safetensors`, the index, or the
    /// label of in-memory tensors.
    source: PathBuf,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, Entry>,
    /// The device and kind tensors read from files are converted to.
    device: Device,
    kind: Kind,
}

/// One open safetensors file.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    file: File,
    /// Where the data section starts: after the 8-byte length and the JSON header.
    data_start: u64,
}

/// Where a tensor is and what it is.
#[derive(Debug)]
enum Entry {
    /// In a safetensors file.
    Stored {
        shard: usize,
        dtype: Dtype,
        shape: Vec<i64>,
        /// Byte range within the shard's data section.
        offsets: (usize, usize),
    },
    /// Already in memory.
    InMemory(Tensor),
}

impl Entry {
    fn shape(&self) -> Vec<i64> {
        match self {
            Entry::Stored { shape, .. } => shape.clone(),
            Entry::InMemory(tensor) => tensor.size(),
        }
    }
}

impl Weights {
    /// Opens the checkpoint in `dir`; tensors will be returned as `kind` on `device`.
    ///
    /// `model.safetensors` is preferred over an index when both exist, as in transformers.
    pub fn load(dir: impl AsRef<Path>, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        if single.is_file() {
            return Self::open(single, device, kind);
        }
        if !index.is_file() {
            return Err(FileError::Missing { path: single }.into());
        }
        let mut weights =
            Weights { source: index, shards: Vec::new(), tensors: BTreeMap::new(), device, kind };
        weights.load_shards(dir)?;
        Ok(weights)
    }

    /// Opens the single safetensors file `file` (a PEFT adapter's, say); tensors will be
    /// returned as `kind` on `device`.
    pub fn open(file: impl AsRef<Path>, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let file = file.as_ref().to_path_buf();
        if !file.is_file() {
            return Err(FileError::Missing { path: file }.into());
        }
        let mut weights =
            Weights { source: file.clone(), shards: Vec::new(), tensors: BTreeMap::new(), device, kind };
        let (shard, metadata) = Shard::open(file)?;
        for (name, info) in metadata.tensors() {
            weights.insert(0, name, info.dtype, &info.shape, info.data_offsets);
        }
        weights.shards.push(shard);
        Ok(weights)
    }

    /// Serves `tensors`, held in memory, by name; `label` stands for them in errors. Tensors are
    /// returned as they are, on their own device and of their own kind.
    pub fn from_tensors(label: PathBuf, tensors: HashMap<String, Tensor>) -> Self {
        let tensors = tensors.into_iter().map(|(name, tensor)| (name, Entry::InMemory(tensor))).collect();
        Weights { source: label, shards: Vec::new(), tensors, device: Device::Cpu, kind: Kind::Float }
    }

    /// Opens the shards named by the index at `self.source`.
    fn load_shards(&mut self, dir: &Path) -> Result<(), ModelError> {
        let weight_map = read_weight_map(&self.source)?;
        let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, file) in &weight_map {
            by_file.entry(file).or_default().push(name);
        }
        for (file, names) in by_file {
            let (shard, metadata) = Shard::open(dir.join(file))?;
            let index = self.shards.len();
            for name in names {
                let info = metadata.info(name).ok_or_else(|| ModelError::MissingTensor {
                    path: shard.path.clone(),
                    name: name.to_owned(),
                })?;
                self.insert(index, name.to_owned(), info.dtype, &info.shape, info.data_offsets);
            }
            self.shards.push(shard);
        }
        Ok(())
    }

    fn insert(&mut self, shard: usize, name: String, dtype: Dtype, shape: &[usize], offsets: (usize, usize)) {
        let shape = shape.iter().map(|&d| d as i64).collect();
        self.tensors.insert(name, Entry::Stored { shard, dtype, shape, offsets });
    }

    /// The names of the tensors not yet taken, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Removes the tensor `name` from the checkpoint and returns it, after checking that its
    /// shape is `expected_shape`.
    pub fn take(&mut self, name: &str, expected_shape: &[i64]) -> Result<Tensor, ModelError> {
        let Some(entry) = self.tensors.get(name) else {
            return Err(ModelError::MissingTensor { path: self.source.clone(), name: name.to_owned() });
        };
        let path = match entry {
            Entry::Stored { shard, .. } => &self.shards[*shard].path,
            Entry::InMemory(_) => &self.source,
        };
        let shape = entry.shape();
        if shape != expected_shape {
            return Err(ModelError::TensorShape {
                path: path.clone(),
                name: name.to_owned(),
                expected: expected_shape.to_vec(),
                got: shape,
            });
        }
        let wrong_dtype =
            |dtype: String| ModelError::TensorDtype { path: path.clone(), name: name.to_owned(), dtype };
        let tensor = match entry {
            Entry::Stored { shard, dtype, offsets, .. } => {
                let stored_kind = match dtype {
                    Dtype::F16 => Kind::Half,
                    Dtype::BF16 => Kind::BFloat16,
                    Dtype::F32 => Kind::Float,
                    Dtype::F64 => Kind::Double,
                    dtype => return Err(wrong_dtype(format!("{dtype:?}"))),
                };
                let bytes = self.shards[*shard].read(*offsets)?;
                Tensor::f_from_data_size(&bytes, &shape, stored_kind)?.f_to_device_(
                    self.device,
                    self.kind,
                    false,
                    false,
                )?
            }
            Entry::InMemory(tensor) => match tensor.kind() {
                Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double => tensor.shallow_clone(),
                kind => return Err(wrong_dtype(format!("{kind:?}"))),
            },
        };
        self.tensors.remove(name);
        Ok(tensor)
    }

    /// Like [`Weights::take`], but `None` when the checkpoint has no tensor `name`.
    pub fn take_optional(
        &mut self,
        name: &str,
        expected_shape: &[i64],
    ) -> Result<Option<Tensor>, ModelError> {
        if self.tensors.contains_key(name) { self.take(name, expected_shape).map(Some) } else { Ok(None) }
    }

    /// Checks that every tensor was taken.
    ///
    /// Two leftovers are harmless and ignored: `*.rotary_emb.inv_freq` buffers that old
    /// checkpoints carry, and `lm_head.weight` saved next to tied embeddings.
    pub fn finish(self) -> Result<(), ModelError> {
        let names: Vec<String> = self
            .tensors
            .into_keys()
            .filter(|name| name != "lm_head.weight" && !name.ends_with("rotary_emb.inv_freq"))
            .collect();
        if names.is_empty() { Ok(()) } else { Err(ModelError::UnusedTensors { path: self.source, names }) }
    }
}

impl Shard {
    /// Opens a safetensors file and reads its header.
    fn open(path: PathBuf) -> Result<(Shard, Metadata), ModelError> {
        if !path.is_file() {
            return Err(FileError::Missing { path }.into());
        }
        let io = |source| ModelError::from(FileError::Io { path: path.clone(), source });
        let invalid = |reason: String| ModelError::Safetensors { path: path.clone(), reason };
        let mut file = File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut len = [0; 8];
        file.read_exact(&mut len)
            .map_err(|_| invalid("file shorter than its 8-byte header length".to_owned()))?;
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_HEADER_SIZE || 8 + header_len > file_len {
            return Err(invalid(format!("header length {header_len} does not fit a {file_len}-byte file")));
        }
        let mut header = vec![0; header_len as usize];
        file.read_exact(&mut header).map_err(io)?;
        let metadata: Metadata =
            serde_json::from_slice(&header).map_err(|e| invalid(format!("invalid header: {e}")))?;
        let data_start = 8 + header_len;
        let data_len = metadata.data_len() as u64;
        if data_start + data_len != file_len {
            return Err(invalid(format!(
                "header describes {data_len} bytes of data, the file has {}",
                file_len - data_start
            )));
        }
        let shard = Shard { path, file, data_start };
        Ok((shard, metadata))
    }

    /// Reads the bytes at `offsets` of the data section.
    fn read(&mut self, (start, end): (usize, usize)) -> Result<Vec<u8>, ModelError> {
        let mut bytes = vec![0; end - start];
        self.file
            .seek(SeekFrom::Start(self.data_start + start as u64))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(FileError::io(&self.path))?;
        Ok(bytes)
    }
}

/// The `weight_map` of an index: tensor name -> shard file name.
fn read_weight_map(path: &Path) -> Result<BTreeMap<String, String>, ModelError> {
    let index: Value = require_json(path)?;
    let invalid = |value: Option<&Value>, reason: &str| ModelError::Config {
        path: path.to_path_buf(),
        key: "weight_map".to_owned(),
        value: value.map_or_else(|| "(missing)".to_owned(), Value::to_string),
        reason: reason.to_owned(),
    };
    let Some(Value::Object(map)) = index.get("weight_map") else {
        return Err(invalid(index.get("weight_map"), "expected an object of tensor names to files"));
    };
    map.iter()
        .map(|(name, file)| match file.as_str() {
            // A plain file name: an index cannot point outside its folder.
            Some(file) if Path::new(file).file_name() == Some(file.as_ref()) => {
                Ok((name.clone(), file.to_owned()))
            }
            _ => Err(invalid(Some(file), &format!("`{name}` must map to a file in the folder"))),
        })
        .collect()
}

/// Writes `tensors` to the safetensors file `path`, converted to `kind`, with the metadata
/// `{"format": "pt"}` that transformers writes.
///
/// Tensors are copied to host memory one at a time, so the file's size bounds the memory used.
pub fn save_safetensors<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    kind: Kind,
) -> Result<(), ModelError> {
    let dtype = match kind {
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        kind => {
            return Err(ModelError::Safetensors {
                path: path.to_path_buf(),
                reason: format!("cannot save tensors as {kind:?}: only floating-point kinds"),
            });
        }
    };
    let mut host = Vec::new();
    for (name, tensor) in tensors {
        let tensor = tensor.f_detach()?.f_to_device_(Device::Cpu, kind, false, false)?.f_contiguous()?;
        let numel = tensor.numel();
        let mut bytes = vec![0; numel * kind.elt_size_in_bytes()];
        tensor.f_copy_data_u8(&mut bytes, numel)?;
        let shape: Vec<usize> = tensor.size().iter().map(|&d| d as usize).collect();
        host.push((name, shape, bytes));
    }
    let invalid = |e: safetensors::SafeTensorError| ModelError::Safetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let views = host
        .iter()
        .map(|(name, shape, bytes)| Ok((*name, TensorView::new(dtype, shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::transformer::{Parameter, parameters};

    #[test]
    fn fixtures_have_every_expected_tensor() {
        for model in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
            let config = ModelConfig::load(kart_testing::model(model)).unwrap();
            let mut weights = Weights::load(kart_testing::model(model), Device::Cpu, Kind::Float).unwrap();
            for Parameter { name, shape, .. } in parameters(&config) {
                let tensor = weights.take(&name, &shape).unwrap();
                assert_eq!((tensor.size(), tensor.kind()), (shape, Kind::Float), "{model}: {name}");
            }
            assert_eq!(weights.names().count(), 0, "{model}");
            weights.finish().unwrap();
        }
    }

    #[test]
    fn tensors_convert_to_the_requested_kind() {
        let mut weights =
            Weights::load(kart_testing::model("tiny-qwen2"), Device::Cpu, Kind::BFloat16).unwrap();
        let norm = weights.take("model.norm.weight", &[64]).unwrap();
        assert_eq!(norm.kind(), Kind::BFloat16);
        assert!(weights.take_optional("lm_head.weight", &[366, 64]).unwrap().is_none());
    }

    #[test]
    fn wrong_shape_names_tensor_file_and_shapes() {
        let mut weights = Weights::load(kart_testing::model("tiny-qwen2"), Device::Cpu, Kind::Float).unwrap();
        let err = weights.take("model.layers.0.self_attn.k_proj.weight", &[64, 64]).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ModelError::TensorShape { .. }), "{message}");
        assert!(message.contains("tiny-qwen2/model.safetensors"), "{message}");
        assert!(message.contains("`model.layers.0.self_attn.k_proj.weight`"), "{message}");
        assert!(message.contains("[32, 64]") && message.contains("[64, 64]"), "{message}");
    }

    #[test]
    fn missing_tensor_names_tensor_and_file() {
        let mut weights = Weights::load(kart_testing::model("tiny-llama"), Device::Cpu, Kind::Float).unwrap();
        let err = weights.take("model.layers.0.self_attn.q_norm.weight", &[16]).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ModelError::MissingTensor { .. }), "{message}");
        assert!(message.contains("tiny-llama/model.safetensors"), "{message}");
        assert!(message.contains("`model.layers.0.self_attn.q_norm.weight`"), "{message}");
    }

    #[test]
    fn unused_tensors_are_reported_except_harmless_ones() {
        let mut weights = Weights::load(kart_testing::model("tiny-llama"), Device::Cpu, Kind::Float).unwrap();
        let names: Vec<String> = weights.names().map(str::to_owned).collect();
        for name in names.iter().filter(|n| *n != "lm_head.weight" && *n != "model.norm.weight") {
            let shape = weights.tensors[name].shape();
            let _ = weights.take(name, &shape).unwrap();
        }
        let message = weights.finish().unwrap_err().to_string();
        assert!(message.contains("model.norm.weight") && !message.contains("lm_head"), "{message}");
    }

    #[test]
    fn missing_checkpoint_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = Weights::load(dir.path(), Device::Cpu, Kind::Float).unwrap_err();
        assert!(
            matches!(&err, ModelError::File(FileError::Missing { path }) if path.ends_with(SINGLE_FILE)),
            "{err}"
        );
    }

    #[test]
    fn truncated_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = std::fs::read(kart_testing::model("tiny-qwen2").join(SINGLE_FILE)).unwrap();
        std::fs::write(dir.path().join(SINGLE_FILE), &bytes[..bytes.len() - 4]).unwrap();
        let err = Weights::load(dir.path(), Device::Cpu, Kind::Float).unwrap_err();
        assert!(matches!(err, ModelError::Safetensors { .. }), "{err}");
    }

    #[test]
    fn sharded_checkpoint_loads_like_the_single_file() {
        let source = kart_testing::model("tiny-qwen3");
        let tensors = Tensor::read_safetensors(source.join(SINGLE_FILE)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut weight_map = serde_json::Map::new();
        for (i, chunk) in tensors.chunks(10).enumerate() {
            let file = format!("model-{:05}-of-00003.safetensors", i + 1);
            let chunk = chunk.iter().map(|(name, tensor)| (name.as_str(), tensor));
            save_safetensors(&dir.path().join(&file), chunk.clone(), Kind::Float).unwrap();
            for (name, _) in chunk {
                weight_map.insert(name.to_owned(), Value::from(file.as_str()));
            }
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();

        let mut sharded = Weights::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
        assert_eq!(sharded.shards.len(), 3);
        for (name, tensor) in &tensors {
            assert!(sharded.take(name, &tensor.size()).unwrap().equal(tensor), "{name}");
        }
        sharded.finish().unwrap();

        // A tensor the index lists but its shard lacks is named with the shard.
        weight_map.insert("model.extra".to_owned(), Value::from("model-00001-of-00003.safetensors"));
        let index = serde_json::json!({"weight_map": weight_map});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        let message = Weights::load(dir.path(), Device::Cpu, Kind::Float).unwrap_err().to_string();
        assert!(
            message.contains("model-00001-of-00003.safetensors: missing tensor `model.extra`"),
            "{message}"
        );
    }

    #[test]
    fn in_memory_tensors_are_checked_like_stored_ones() {
        let label = PathBuf::from("(test tensors)");
        let tensors = HashMap::from([
            ("w".to_owned(), Tensor::ones([2, 3], (Kind::Float, Device::Cpu))),
            ("ids".to_owned(), Tensor::zeros([2], (Kind::Int64, Device::Cpu))),
            ("left".to_owned(), Tensor::zeros([1], (Kind::Float, Device::Cpu))),
        ]);
        let mut weights = Weights::from_tensors(label, tensors);
        let message = weights.take("w", &[3, 2]).unwrap_err().to_string();
        assert_eq!(message, "(test tensors): tensor `w` has shape [2, 3], expected [3, 2]");
        assert!(weights.take("w", &[2, 3]).unwrap().equal(&Tensor::ones([2, 3], (Kind::Float, Device::Cpu))));
        let message = weights.take("ids", &[2]).unwrap_err().to_string();
        assert!(message.starts_with("(test tensors): tensor `ids` has dtype Int64"), "{message}");
        let message = weights.take("bias", &[2]).unwrap_err().to_string();
        assert_eq!(message, "(test tensors): missing tensor `bias`");
        let message = weights.finish().unwrap_err().to_string();
        assert_eq!(message, "(test tensors): unused tensors in checkpoint: ids, left");
    }

    #[test]
    fn saved_files_carry_pt_metadata_and_round_trip_bf16() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE_FILE);
        let tensor = Tensor::from_slice(&[1.0f32, -2.5, 3.25, 0.0]).view([2, 2]);
        save_safetensors(&path, [("w", &tensor)], Kind::BFloat16).unwrap();
        let (_, metadata) = Shard::open(path).unwrap();
        assert_eq!(metadata.metadata().as_ref().unwrap()["format"], "pt");
        let mut weights = Weights::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
        assert!(weights.take("w", &[2, 2]).unwrap().equal(&tensor));
    }
}
