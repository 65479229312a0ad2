//! Dense retrieval: passages embedded by a BERT-family [`Encoder`] and searched by exact inner
//! product.
//!
//! An index folder is a [`DocStore`] holding the documents (found by ordinal), whose manifest
//! records the encoder's settings and the embedding dimension, plus the embeddings themselves:
//!
//! ```text
//! DIR/kart-index.json   {"format": 1, "method": "dense", "documents": N, "encoder": {...}, "dim": D,
//!                        "embeddings_crc32": C}
//! DIR/embeddings.f32    N x D little-endian f32, row i the embedding of the passage of ordinal i
//! DIR/meta.json, …      the document store
//! ```
//!
//! The manifest holds the CRC-32 of the embeddings file, checked as [`DenseIndex::open`] reads it:
//! a damaged file is an error naming it.
//!
//! [`build`] streams the corpus, encoding passages a few thousand at a time, so memory stays
//! bounded whatever the corpus size. [`DenseIndex`] loads the embeddings for the exact scan of
//! [`crate::flat`] (in f32 on the CPU; in f16, sharded over every GPU, with CUDA) and scores each
//! batch of queries against all of them; or, when the index has an approximate graph
//! ([`crate::ann`], built by `kart retriever index --ann hnsw`), leaves the embeddings on disk and
//! searches the graph.
//!
//! ```no_run
//! # use kart_core::config::retriever::EncoderConfig;
//! # use kart_retriever::{dense::{self, DenseIndex}, LocalIndex};
//! # use std::path::Path;
//! # fn main() -> Result<(), kart_retriever::RetrieverError> {
//! let e5 = Path::new("models/e5-base-v2");
//! let config = EncoderConfig {
//!     query_prefix: "query: ".into(),
//!     passage_prefix: "passage: ".into(),
//!     ..Default::default()
//! };
//! dense::build(Path::new("wiki-18.jsonl.gz"), Path::new("index"), e5, &config, |_, _, _| {})?;
//! let index = DenseIndex::open(Path::new("index"), tch::Device::cuda_if_available(), 64, 50)?;
//! let hits = index.search_batch(&["capital of france".to_string()], 3)?;
//! # Ok(())
//! # }
//! ```

use crate::ann::Graph;
use crate::corpus::CorpusReader;
use crate::docstore::{DocStore, DocStoreWriter, FORMAT, Manifest};
use crate::encoder::{Encoder, TextKind};
use crate::flat::{FlatIndex, Placement};
use crate::{LocalIndex, RetrieverError};
use flate2::Crc;
use kart_core::agent::search_r1::RetrievalResult;
use kart_core::config::retriever::{EncoderConfig, Method};
use kart_model::ModelError;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::sync::Mutex;
use tch::{Device, Tensor};

/// The embeddings' file name inside an index folder.
pub const EMBEDDINGS: &str = "embeddings.f32";

/// Passages per [`Encoder::encode`] call while building: enough for sorting by length to leave
/// little padding, few enough to bound memory.
const PASSAGES_PER_CALL: usize = 4096;

/// Memory of the document store's writer (documents are stored, not analysed).
const DOC_STORE_BUDGET: usize = 256 << 20;

/// Rows of the embeddings file read at a time.
pub(crate) const READ_ROWS: usize = 16_384;

/// Builds a dense index of `corpus` (Search-R1 JSON lines, optionally gzipped) in `out`, embedding
/// passages with the encoder in `encoder_dir` (on the GPU when there is one). `progress(bytes_read,
/// total_bytes, docs)` is called after every few thousand passages and once at the end. Returns
/// the number of passages.
pub fn build(
    corpus: &Path,
    out: &Path,
    encoder_dir: &Path,
    config: &EncoderConfig,
    progress: impl Fn(u64, u64, u64),
) -> Result<u64, RetrieverError> {
    // The manifest names the encoder by an absolute path, so the index opens from anywhere.
    let encoder_dir = std::fs::canonicalize(encoder_dir)
        .map_err(|source| RetrieverError::Io { path: encoder_dir.to_path_buf(), source })?;
    let encoder = Encoder::load(&encoder_dir, config, kart_torch::auto("dense index build"))?;
    let mut reader = CorpusReader::open(corpus)?;
    let total = reader.total_bytes();
    let mut store = DocStoreWriter::create(out, false, DOC_STORE_BUDGET)?;
    let path = out.join(EMBEDDINGS);
    let io_error = |source| RetrieverError::Io { path: path.clone(), source };
    let mut embeddings = BufWriter::new(File::create(&path).map_err(io_error)?);
    let mut crc = Crc::new();
    let mut pending = Vec::with_capacity(PASSAGES_PER_CALL);
    let mut docs = 0;
    while let Some(passage) = reader.next() {
        let passage = passage?;
        store.add(&passage)?;
        pending.push(passage.contents);
        if pending.len() == PASSAGES_PER_CALL {
            write_rows(&mut embeddings, &mut crc, &encoder.encode(&pending, TextKind::Passage)?, &path)?;
            docs += pending.len() as u64;
            pending.clear();
            progress(reader.bytes_read(), total, docs);
        }
    }
    if !pending.is_empty() {
        write_rows(&mut embeddings, &mut crc, &encoder.encode(&pending, TextKind::Passage)?, &path)?;
    }
    embeddings.into_inner().map_err(|e| io_error(e.into_error()))?.sync_all().map_err(io_error)?;
    let manifest = Manifest {
        format: FORMAT,
        method: Method::Dense,
        documents: 0,
        encoder: Some(encoder.config().clone()),
        dim: Some(encoder.dim()),
        embeddings_crc32: Some(crc.sum()),
        ann: None,
    };
    let docs = store.finish(manifest)?;
    progress(reader.bytes_read(), total, docs);
    Ok(docs)
}

/// Appends the rows of an `(N, D)` f32 tensor to the file `path` as little-endian f32, adding them
/// to the file's CRC-32.
fn write_rows(
    out: &mut impl Write,
    crc: &mut Crc,
    embeddings: &Tensor,
    path: &Path,
) -> Result<(), RetrieverError> {
    let host =
        Vec::<f32>::try_from(embeddings.to_device(Device::Cpu).flatten(0, -1)).map_err(ModelError::from)?;
    let bytes: Vec<u8> = host.iter().flat_map(|x| x.to_le_bytes()).collect();
    crc.update(&bytes);
    out.write_all(&bytes).map_err(|source| RetrieverError::Io { path: path.to_path_buf(), source })
}

/// A dense index opened for search: by an exact scan of its embeddings, or through its
/// approximate graph when it has one ([`crate::ann`]).
pub struct DenseIndex {
    store: DocStore,
    /// The encoder and the embeddings serve one search at a time (tch tensors are not `Sync`); each
    /// search runs on all cores or the GPU.
    search: Mutex<Search>,
}

struct Search {
    encoder: Encoder,
    scan: Scan,
}

/// How the embeddings are searched.
enum Scan {
    /// Every embedding, scored per query.
    Exact(FlatIndex),
    /// The approximate graph.
    Graph(Graph),
}

impl DenseIndex {
    /// Opens an index folder built by [`build`], loading its encoder onto `device`, and its
    /// embeddings too when it has no approximate graph ([`Placement::for_device`]: on CUDA, in f16
    /// over every GPU); a graph explores `expansion_search` candidates per query and re-scores
    /// `rerank` of them exactly.
    pub fn open(
        dir: &Path,
        device: Device,
        expansion_search: usize,
        rerank: usize,
    ) -> Result<Self, RetrieverError> {
        let store = DocStore::open(dir)?;
        let manifest = store.manifest();
        let invalid = |reason: String| RetrieverError::Index { path: dir.to_path_buf(), reason };
        if manifest.method != Method::Dense {
            let method = serde_json::json!(manifest.method);
            return Err(invalid(format!("the manifest's method is {method}, not \"dense\"")));
        }
        let (Some(config), Some(dim)) = (&manifest.encoder, manifest.dim) else {
            return Err(invalid("the manifest of a dense index lacks `encoder` or `dim`".into()));
        };
        let Some(model) = &config.model else {
            return Err(invalid("the manifest's encoder has no `model` folder".into()));
        };
        let encoder = Encoder::load(model, config, device)?;
        if encoder.dim() != dim {
            return Err(invalid(format!(
                "the embeddings have dimension {dim} but the encoder {} produces {}",
                model.display(),
                encoder.dim()
            )));
        }
        if manifest.ann.is_some() {
            let scan = Scan::Graph(Graph::open(dir, manifest, expansion_search, rerank)?);
            return Ok(DenseIndex { store, search: Mutex::new(Search { encoder, scan }) });
        }
        let path = dir.join(EMBEDDINGS);
        if manifest.embeddings_crc32.is_none() {
            tracing::warn!(
                path = %path.display(),
                "the manifest has no embeddings_crc32 (built by an older kart): the embeddings are not checked"
            );
        }
        let placement = Placement::for_device(device);
        let flat = FlatIndex::read(&path, store.len(), dim, manifest.embeddings_crc32, &placement)?;
        Ok(DenseIndex { store, search: Mutex::new(Search { encoder, scan: Scan::Exact(flat) }) })
    }

    /// The stored documents.
    pub fn store(&self) -> &DocStore {
        &self.store
    }

    /// Whether queries go through an approximate graph (otherwise an exact scan).
    pub fn is_approximate(&self) -> bool {
        let search = self.search.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        matches!(search.scan, Scan::Graph(_))
    }
}

impl LocalIndex for DenseIndex {
    fn search_batch(
        &self,
        queries: &[String],
        topk: usize,
    ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
        let k = topk.min(self.store.len() as usize);
        if queries.is_empty() || k == 0 {
            return Ok(vec![Vec::new(); queries.len()]);
        }
        let hits: Vec<Vec<(u64, f32)>> = {
            let search = self.search.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let queries = search.encoder.encode(queries, TextKind::Query)?;
            match &search.scan {
                Scan::Graph(graph) => {
                    let host = Vec::<f32>::try_from(queries.to_device(Device::Cpu).flatten(0, -1))
                        .map_err(ModelError::from)?;
                    graph.search(&host, k)?
                }
                Scan::Exact(flat) => flat.search(&queries, k)?,
            }
        };
        hits.into_iter()
            .map(|hits| {
                let ordinals: Vec<u64> = hits.iter().map(|&(o, _)| o).collect();
                let documents = self.store.get_many(&ordinals)?;
                Ok(documents
                    .into_iter()
                    .zip(hits)
                    .map(|(document, (_, score))| RetrievalResult { document, score: f64::from(score) })
                    .collect())
            })
            .collect()
    }

    fn num_docs(&self) -> u64 {
        self.store.len()
    }
}

/// Reads the embeddings file `path` of `rows` x `dim` little-endian f32 a few thousand rows at a
/// time, calling `f(first_row, values)` for each chunk. A file of another size is refused, and
/// one whose CRC-32 is not `crc32` (when given) too, once read.
pub(crate) fn for_each_chunk(
    path: &Path,
    rows: u64,
    dim: usize,
    crc32: Option<u32>,
    mut f: impl FnMut(usize, &[f32]) -> Result<(), RetrieverError>,
) -> Result<(), RetrieverError> {
    let io_error = |source| RetrieverError::Io { path: path.to_path_buf(), source };
    let mut file = File::open(path).map_err(io_error)?;
    let size = file.metadata().map_err(io_error)?.len();
    let expected = rows * dim as u64 * 4;
    if size != expected {
        return Err(RetrieverError::Index {
            path: path.to_path_buf(),
            reason: format!(
                "{size} bytes, expected {expected} ({rows} embeddings of dimension {dim} as f32): \
                 truncated, or not from this index's build"
            ),
        });
    }
    let mut bytes = vec![0u8; READ_ROWS * dim * 4];
    let mut values = Vec::with_capacity(READ_ROWS * dim);
    let mut crc = Crc::new();
    let mut start = 0;
    while start < rows {
        let len = (rows - start).min(READ_ROWS as u64) as usize;
        let bytes = &mut bytes[..len * dim * 4];
        file.read_exact(bytes).map_err(io_error)?;
        crc.update(bytes);
        values.clear();
        values.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))));
        f(start as usize, &values)?;
        start += len as u64;
    }
    match crc32 {
        Some(expected) if crc.sum() != expected => Err(RetrieverError::Index {
            path: path.to_path_buf(),
            reason: format!(
                "damaged: CRC-32 {:08x}, but the manifest says {expected:08x}; rebuild the index with \
                 `kart retriever index`",
                crc.sum()
            ),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bm25;
    use kart_testing::minilm;
    use std::path::PathBuf;

    const PASSAGES: [(&str, &str); 6] = [
        ("hamlet", "\"Hamlet\"\nHamlet is a tragedy written by William Shakespeare around 1600."),
        ("paris", "\"Paris\"\nParis is the capital and largest city of France."),
        ("everest", "\"Mount Everest\"\nMount Everest is Earth's highest mountain above sea level."),
        ("photosynthesis", "\"Photosynthesis\"\nPlants convert light energy into chemical energy."),
        ("python", "\"Python\"\nPython is a programming language created by Guido van Rossum."),
        ("nile", "\"Nile\"\nThe Nile is a major river flowing north through Africa into the Mediterranean."),
    ];

    fn corpus(dir: &Path) -> PathBuf {
        let path = dir.join("corpus.jsonl");
        let lines: Vec<String> = PASSAGES
            .iter()
            .map(|(id, contents)| serde_json::json!({"id": id, "contents": contents}).to_string())
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    }

    /// A dense index of [`PASSAGES`] built with all-MiniLM-L6-v2.
    fn index(model: &Path) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("index");
        let calls = std::cell::Cell::new(0);
        let docs = build(&corpus(dir.path()), &out, model, &EncoderConfig::default(), |read, total, docs| {
            calls.set(calls.get() + 1);
            assert_eq!((read, docs), (total, 6));
        })
        .unwrap();
        assert_eq!((docs, calls.get()), (6, 1));
        (dir, out)
    }

    fn ids(hits: &[RetrievalResult]) -> Vec<&str> {
        hits.iter().map(|hit| hit.document.id.as_str()).collect()
    }

    #[test]
    fn finds_the_passage_of_each_question() {
        let Some(model) = minilm() else { return };
        let (_dir, out) = index(&model);
        let index = DenseIndex::open(&out, Device::Cpu, 64, 0).unwrap();
        assert_eq!(index.num_docs(), 6);
        let manifest = index.store().manifest();
        assert_eq!((manifest.method, manifest.dim), (Method::Dense, Some(384)));
        assert!(manifest.embeddings_crc32.is_some());
        assert_eq!(manifest.encoder.as_ref().unwrap().model, Some(std::fs::canonicalize(&model).unwrap()));

        let queries: Vec<String> = [
            "who wrote hamlet",
            "what is the capital of france",
            "tallest mountain in the world",
            "how do plants make energy from sunlight",
            "who invented the python language",
            "longest river in africa",
        ]
        .map(String::from)
        .into();
        let hits = index.search_batch(&queries, 3).unwrap();
        let top: Vec<&str> = hits.iter().map(|h| h[0].document.id.as_str()).collect();
        assert_eq!(top, PASSAGES.map(|(id, _)| id));
        for hits in &hits {
            assert_eq!(hits.len(), 3);
            assert!(hits.windows(2).all(|w| w[0].score >= w[1].score), "{hits:?}");
        }
        assert_eq!(hits[1][0].document.title.as_deref(), Some("Paris"));

        // Scores are the inner products of the normalised embeddings.
        let search = index.search.lock().unwrap();
        let query = search.encoder.encode(&queries[..1], TextKind::Query).unwrap();
        assert!(matches!(search.scan, Scan::Exact(_)), "an index without a graph is scanned");
        let bytes = std::fs::read(out.join(EMBEDDINGS)).unwrap();
        let row: Vec<f32> =
            bytes[..384 * 4].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let passage = Tensor::from_slice(&row);
        let expected = query.get(0).dot(&passage).double_value(&[]);
        assert!((hits[0][0].score - expected).abs() < 1e-5, "{} vs {expected}", hits[0][0].score);
    }

    #[test]
    fn an_approximate_graph_answers_as_the_exact_scan() {
        let Some(model) = minilm() else { return };
        let (_dir, out) = index(&model);
        let queries: Vec<String> =
            ["who wrote hamlet", "capital of france", "river in africa"].map(String::from).into();
        let exact = DenseIndex::open(&out, Device::Cpu, 64, 0).unwrap();
        assert!(!exact.is_approximate());
        let expected = exact.search_batch(&queries, 6).unwrap();
        crate::ann::build(&out, &Default::default(), |_, _| {}).unwrap();
        let approximate = DenseIndex::open(&out, Device::Cpu, 64, 0).unwrap();
        assert!(approximate.is_approximate());
        let found = approximate.search_batch(&queries, 6).unwrap();
        for (found, expected) in found.iter().zip(&expected) {
            assert_eq!(ids(found), ids(expected));
            for (f, e) in found.iter().zip(expected) {
                assert!(
                    (f.score - e.score).abs() < 1e-2,
                    "f16 vectors score within rounding: {f:?} vs {e:?}"
                );
                assert_eq!(f.document, e.document);
            }
        }
    }

    #[test]
    fn batches_match_single_queries_and_topk_is_bounded() {
        let Some(model) = minilm() else { return };
        let (_dir, out) = index(&model);
        let index = DenseIndex::open(&out, Device::Cpu, 64, 0).unwrap();
        let queries = vec!["river".to_string(), "shakespeare".to_string(), String::new()];
        let batch = index.search_batch(&queries, 10).unwrap();
        for (query, hits) in queries.iter().zip(&batch) {
            let single = index.search_batch(std::slice::from_ref(query), 10).unwrap();
            assert_eq!(ids(&single[0]), ids(hits));
            assert_eq!(hits.len(), 6, "topk beyond the corpus size returns every passage");
        }
        assert_eq!(index.search_batch(&queries, 0).unwrap(), vec![Vec::new(); 3]);
        assert!(index.search_batch(&[], 3).unwrap().is_empty());
    }

    #[test]
    fn broken_indexes_are_named_with_their_sizes() {
        let Some(model) = minilm() else { return };
        let (_dir, out) = index(&model);
        let path = out.join(EMBEDDINGS);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let err = DenseIndex::open(&out, Device::Cpu, 64, 0).err().unwrap().to_string();
        assert!(err.starts_with(&format!("{}: damaged: CRC-32 ", path.display())), "{err}");
        bytes[100] ^= 0x01;
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = DenseIndex::open(&out, Device::Cpu, 64, 0).err().unwrap().to_string();
        assert_eq!(
            err,
            format!(
                "{}: 9212 bytes, expected 9216 (6 embeddings of dimension 384 as f32): truncated, or not \
                 from this index's build",
                path.display()
            )
        );

        let manifest_path = out.join(crate::docstore::MANIFEST);
        let mut manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
        manifest["dim"] = serde_json::json!(768);
        std::fs::write(&manifest_path, manifest.to_string()).unwrap();
        let err = DenseIndex::open(&out, Device::Cpu, 64, 0).err().unwrap().to_string();
        let model = std::fs::canonicalize(&model).unwrap();
        let expected =
            format!("the embeddings have dimension 768 but the encoder {} produces 384", model.display());
        assert!(err.starts_with(&out.display().to_string()) && err.contains(&expected), "{err}");
    }

    #[test]
    fn damaged_embeddings_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(EMBEDDINGS);
        let (rows, dim) = (40_000u64, 3usize);
        let values: Vec<f32> = (0..rows as usize * dim).map(|i| i as f32 * 0.5).collect();
        let mut file = BufWriter::new(File::create(&path).unwrap());
        let mut crc = Crc::new();
        write_rows(&mut file, &mut crc, &Tensor::from_slice(&values).view([rows as i64, dim as i64]), &path)
            .unwrap();
        file.into_inner().unwrap().sync_all().unwrap();
        let crc32 = crc.sum();

        let read = |crc32| {
            let mut read = Vec::new();
            for_each_chunk(&path, rows, dim, crc32, |first, values| {
                assert_eq!(first * dim, read.len());
                read.extend_from_slice(values);
                Ok(())
            })
            .map(|()| read)
        };
        assert_eq!(read(Some(crc32)).unwrap(), values);
        assert!(read(None).is_ok(), "an index without a checksum is read unchecked");

        // One flipped bit past the first slice of rows read.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[READ_ROWS * dim * 4 + 5] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
        let err = read(Some(crc32)).err().unwrap().to_string();
        let expected = format!("{}: damaged: CRC-32 ", path.display());
        assert!(err.starts_with(&expected), "{err}");
        assert!(err.contains(&format!("the manifest says {crc32:08x}")), "{err}");
    }

    #[test]
    fn refuses_bm25_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bm25");
        bm25::build(&corpus(dir.path()), &out, 50_000_000, |_, _, _| {}).unwrap();
        let err = DenseIndex::open(&out, Device::Cpu, 64, 0).err().unwrap().to_string();
        assert_eq!(err, format!("{}: the manifest's method is \"bm25\", not \"dense\"", out.display()));
    }

    #[test]
    fn a_missing_encoder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-model");
        let err = build(
            &corpus(dir.path()),
            &dir.path().join("index"),
            &missing,
            &EncoderConfig::default(),
            |_, _, _| {},
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with(&missing.display().to_string()), "{err}");
    }
}
