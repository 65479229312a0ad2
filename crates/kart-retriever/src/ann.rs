//! An approximate nearest-neighbour graph over a dense index's embeddings: HNSW, built and
//! searched by [usearch](https://github.com/unum-cloud/usearch), for corpora a flat scan cannot
//! serve (Search-R1's wiki-18: 21M passages x 768 dimensions, 64 GB of f32, all of it read per
//! query).
//!
//! usearch was chosen over faiss (whose C API is not on crates.io and would be a system library
//! to build) and the pure-Rust HNSW crates because it is one well-kept C++ header library built
//! by `cargo` with the crate, adds from many threads at once, stores vectors as f32, f16, i8 or
//! one bit a dimension, and searches a saved graph in place: [`Graph::open`] reads the file into
//! memory advised for huge pages and searches those bytes as they are.
//!
//! The one-bit graph ([`AnnQuantization::B1`]) is the compressed index, for corpora whose
//! embeddings do not fit in memory: each vector is its dimensions' signs, compared by Hamming
//! distance (binary quantisation), so the graph holds 96 bytes of a 768-dimensional vector
//! beside its links, and the candidates it finds are re-scored against the f32 embeddings, which
//! stay on disk and are read a few rows per query.
//!
//! The graph sits in the dense index folder beside the embeddings it was built from, and the
//! manifest records how it was built ([`AnnConfig`]):
//!
//! ```text
//! DIR/ann.usearch                 the graph, keys = passage ordinals
//! DIR/ann.usearch.partial         while building: the graph up to the last checkpoint
//! DIR/ann.usearch.partial.json    while building: the settings of that partial graph
//! ```
//!
//! [`build`] reads the embeddings a few thousand rows at a time and adds them on every core,
//! saving a checkpoint every [`CHECKPOINT_ROWS`] rows: a build that stops is resumed from its
//! last checkpoint by running it again with the same settings.

use crate::RetrieverError;
use crate::dense::{EMBEDDINGS, for_each_chunk};
use crate::docstore::{Manifest, write_manifest};
use kart_core::config::retriever::{AnnConfig, AnnQuantization, Method};
use rayon::prelude::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use usearch::{Index, IndexOptions, MetricKind, ScalarKind, b1x8};

/// The graph's file name inside a dense index folder.
pub const GRAPH: &str = "ann.usearch";

/// Rows added between two checkpoints of a build.
pub const CHECKPOINT_ROWS: u64 = 1 << 20;

/// Builds the approximate graph of the dense index in `dir` with `config`, resuming from a
/// checkpoint of the same settings when one is there. `progress(rows_added, rows)` is called after
/// every chunk of rows. The manifest names the graph once it is complete.
pub fn build(dir: &Path, config: &AnnConfig, progress: impl Fn(u64, u64)) -> Result<(), RetrieverError> {
    build_with_checkpoints(dir, config, CHECKPOINT_ROWS, progress)
}

fn build_with_checkpoints(
    dir: &Path,
    config: &AnnConfig,
    checkpoint_rows: u64,
    progress: impl Fn(u64, u64),
) -> Result<(), RetrieverError> {
    let mut manifest = Manifest::read(dir)?;
    let (rows, dim) = dense_shape(dir, &manifest)?;
    let graph = dir.join(GRAPH);
    let partial = dir.join(format!("{GRAPH}.partial"));
    let settings = dir.join(format!("{GRAPH}.partial.json"));
    let threads = rayon::current_num_threads();
    let index = match resumable(&partial, &settings, config, dim)? {
        Some(index) => index,
        None => Index::new(&options(dim, config)).map_err(|e| usearch_error(&partial, e))?,
    };
    index.reserve_capacity_and_threads(rows as usize, threads).map_err(|e| usearch_error(&partial, e))?;
    let start = index.size() as u64;
    let mut since_checkpoint = 0;
    for_each_chunk(&dir.join(EMBEDDINGS), rows, dim, manifest.embeddings_crc32, |first, values| {
        let first = first as u64;
        let end = first + (values.len() / dim) as u64;
        if end > start {
            let skip = start.saturating_sub(first) as usize;
            values[skip * dim..].par_chunks(dim).enumerate().try_for_each(|(i, vector)| {
                let key = first + (skip + i) as u64;
                match config.quantization {
                    AnnQuantization::B1 => index.add(key, &signs(vector)),
                    _ => index.add(key, vector),
                }
                .map_err(|e| usearch_error(&graph, e))
            })?;
            since_checkpoint += end - first.max(start);
            if since_checkpoint >= checkpoint_rows && end < rows {
                checkpoint(&index, &partial, &settings, config)?;
                since_checkpoint = 0;
            }
        }
        progress(end, rows);
        Ok(())
    })?;
    save(&index, &graph)?;
    for path in [&partial, &settings] {
        if path.exists() {
            std::fs::remove_file(path).map_err(|source| RetrieverError::Io { path: path.clone(), source })?;
        }
    }
    manifest.ann = Some(*config);
    write_manifest(dir, &manifest)
}

/// A built graph, searched in memory.
pub struct Graph {
    /// A view of `_memory`'s bytes: declared first, so it is dropped before them.
    index: Index,
    /// Held for `index`, which reads it.
    _memory: GraphMemory,
    dim: usize,
    /// The f32 embeddings, memory-mapped: candidates are re-scored against them.
    exact: memmap2::Mmap,
    rerank: usize,
    /// The graph holds the vectors' signs ([`AnnQuantization::B1`]).
    binary: bool,
}

impl Graph {
    /// Opens the graph of the dense index `dir` described by `manifest`, exploring
    /// `expansion_search` candidates per query and re-scoring the best `rerank` of them (at least
    /// the `k` asked for, so scores are always exact inner products) against the f32 embeddings.
    pub fn open(
        dir: &Path,
        manifest: &Manifest,
        expansion_search: usize,
        rerank: usize,
    ) -> Result<Self, RetrieverError> {
        let (rows, dim) = dense_shape(dir, manifest)?;
        let path = dir.join(GRAPH);
        if !path.exists() {
            return Err(RetrieverError::Index {
                path,
                reason: "the manifest names an approximate graph but the file is missing; build it \
                         again with `kart retriever index --method dense --ann hnsw`"
                    .into(),
            });
        }
        let memory = GraphMemory::read(&path)?;
        let index = Index::metadata_from_buffer(&memory.bytes)
            .and_then(|metadata| Index::new(&metadata.into()))
            // SAFETY: the index keeps a pointer to `memory`'s bytes; both live in the `Graph`,
            // which drops the index first, and the bytes are read-only.
            .and_then(|index| unsafe { index.view_from_buffer(&memory.bytes) }.map(|()| index))
            .map_err(|e| usearch_error(&path, e))?;
        if index.dimensions() != dim || index.size() as u64 != rows {
            return Err(RetrieverError::Index {
                path,
                reason: format!(
                    "holds {} vectors of dimension {}, but the index has {rows} of dimension {dim}",
                    index.size(),
                    index.dimensions()
                ),
            });
        }
        index.change_expansion_search(expansion_search.max(1));
        let path = dir.join(EMBEDDINGS);
        let io_error = |source| RetrieverError::Io { path: path.clone(), source };
        let file = std::fs::File::open(&path).map_err(io_error)?;
        // SAFETY: the embeddings file is written once, before the manifest names the graph, and
        // never modified after; a reader mapping it sees fixed bytes.
        let exact = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error)?;
        if exact.len() as u64 != rows * dim as u64 * 4 {
            return Err(RetrieverError::Index {
                path,
                reason: format!(
                    "{} bytes, expected {rows} embeddings of dimension {dim} as f32",
                    exact.len()
                ),
            });
        }
        let binary = manifest.ann.is_some_and(|ann| ann.quantization == AnnQuantization::B1);
        Ok(Graph { index, _memory: memory, dim, exact, rerank, binary })
    }

    /// The `k` passages of highest inner product with each query of `queries` (rows of the
    /// graph's dimension, one after another), best first, as `(ordinal, score)`; queries are
    /// searched on all cores.
    pub fn search(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<(u64, f32)>>, RetrieverError> {
        queries.par_chunks(self.dim).map(|query| self.search_one(query, k)).collect()
    }

    /// The `k` passages of highest inner product with `query`, best first, on this thread.
    pub fn search_one(&self, query: &[f32], k: usize) -> Result<Vec<(u64, f32)>, RetrieverError> {
        let count = k.max(self.rerank);
        let found = match self.binary {
            true => self.index.search(&signs(query), count),
            false => self.index.search(query, count),
        }
        .map_err(|e| RetrieverError::Internal { what: "approximate search", reason: e.to_string() })?;
        let exact = &self.exact;
        let row_bytes = self.dim * 4;
        let mut scored: Vec<(u64, f32)> = found
            .keys
            .into_iter()
            .map(|key| (key, dot(&exact[key as usize * row_bytes..][..row_bytes], query)))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        Ok(scored)
    }

    /// Re-scores the best `n` candidates (at least the `k` asked for) from now on.
    pub fn set_rerank(&mut self, n: usize) {
        self.rerank = n;
    }

    /// Explores `n` candidates per query from now on.
    pub fn set_expansion_search(&self, n: usize) {
        self.index.change_expansion_search(n.max(1));
    }
}

/// A graph file's bytes in anonymous memory that the kernel is asked to back with huge pages
/// (2 MiB, where transparent huge pages are `always` or `madvise`). A search walks a few thousand
/// rows scattered over the whole graph, and with 4 KiB pages almost every row is a TLB miss: at 1M
/// passages (a graph of 1 GB) huge pages search 1.35x as many queries a second as the file
/// memory-mapped. The price is reading the file at start (22 GB at wiki-18's size), and memory
/// the kernel cannot evict, which the graph needed resident anyway to be searched at speed.
struct GraphMemory {
    bytes: memmap2::Mmap,
}

impl GraphMemory {
    fn read(path: &Path) -> Result<Self, RetrieverError> {
        let io_error = |source| RetrieverError::Io { path: path.to_path_buf(), source };
        let mut file = std::fs::File::open(path).map_err(io_error)?;
        let len = file.metadata().map_err(io_error)?.len() as usize;
        let mut memory = memmap2::MmapMut::map_anon(len.max(1)).map_err(io_error)?;
        // Advice: where the kernel has no transparent huge pages the memory stays in 4 KiB pages.
        if let Err(error) = memory.advise(memmap2::Advice::HugePage) {
            tracing::debug!(%error, "huge pages not advised for the approximate graph");
        }
        file.read_exact(&mut memory[..len]).map_err(io_error)?;
        Ok(GraphMemory { bytes: memory.make_read_only().map_err(io_error)? })
    }
}

/// The inner product of a row of little-endian f32 `bytes` with `query`, in eight running sums
/// (one sum is a chain of dependent additions the CPU cannot overlap).
fn dot(bytes: &[u8], query: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let mut rows = bytes.chunks_exact(32);
    let mut queries = query.chunks_exact(8);
    for (row, q) in (&mut rows).zip(&mut queries) {
        for lane in 0..8 {
            let x = f32::from_le_bytes(row[lane * 4..lane * 4 + 4].try_into().expect("4 bytes"));
            sums[lane] += x * q[lane];
        }
    }
    let tail: f32 = rows
        .remainder()
        .chunks_exact(4)
        .zip(queries.remainder())
        .map(|(b, q)| f32::from_le_bytes(b.try_into().expect("4 bytes")) * q)
        .sum();
    sums.iter().sum::<f32>() + tail
}

/// A vector's signs, one bit a dimension (set where positive), as a one-bit graph stores it.
fn signs(vector: &[f32]) -> Vec<b1x8> {
    vector
        .chunks(8)
        .map(|chunk| {
            b1x8(chunk.iter().enumerate().fold(0u8, |bits, (i, &x)| bits | (u8::from(x > 0.0) << i)))
        })
        .collect()
}

/// The rows and dimension of the dense index `dir`, refusing other kinds.
fn dense_shape(dir: &Path, manifest: &Manifest) -> Result<(u64, usize), RetrieverError> {
    match (manifest.method, manifest.dim) {
        (Method::Dense, Some(dim)) => Ok((manifest.documents, dim)),
        _ => Err(RetrieverError::Index {
            path: dir.to_path_buf(),
            reason: "an approximate graph is built over a dense index's embeddings (`--method dense`)".into(),
        }),
    }
}

/// usearch's options for `config`: inner product, as the flat scan ranks, or Hamming distance
/// between signs for the one-bit graph.
fn options(dim: usize, config: &AnnConfig) -> IndexOptions {
    let (metric, quantization) = match config.quantization {
        AnnQuantization::F32 => (MetricKind::IP, ScalarKind::F32),
        AnnQuantization::F16 => (MetricKind::IP, ScalarKind::F16),
        AnnQuantization::I8 => (MetricKind::IP, ScalarKind::I8),
        AnnQuantization::B1 => (MetricKind::Hamming, ScalarKind::B1),
    };
    IndexOptions {
        dimensions: dim,
        metric,
        quantization,
        connectivity: config.connectivity,
        expansion_add: config.expansion_add,
        expansion_search: 64,
        multi: false,
    }
}

/// The checkpoint at `partial`, when it was built with `config` (another build's is set aside).
fn resumable(
    partial: &Path,
    settings: &Path,
    config: &AnnConfig,
    dim: usize,
) -> Result<Option<Index>, RetrieverError> {
    let Ok(text) = std::fs::read_to_string(settings) else { return Ok(None) };
    if !partial.exists() || serde_json::from_str::<AnnConfig>(&text).ok().as_ref() != Some(config) {
        tracing::info!(path = %partial.display(), "a checkpoint of other settings is not resumed");
        return Ok(None);
    }
    let index = Index::restore(&utf8(partial)?).map_err(|e| usearch_error(partial, e))?;
    if index.dimensions() != dim {
        return Ok(None);
    }
    index.change_expansion_add(config.expansion_add);
    tracing::info!(path = %partial.display(), rows = index.size(), "resuming the approximate graph");
    Ok(Some(index))
}

/// Saves `index` at `partial` (through a temporary file) with the settings beside it.
fn checkpoint(
    index: &Index,
    partial: &Path,
    settings: &Path,
    config: &AnnConfig,
) -> Result<(), RetrieverError> {
    save(index, partial)?;
    let json = serde_json::to_vec(config).expect("settings serialise");
    std::fs::write(settings, json)
        .map_err(|source| RetrieverError::Io { path: settings.to_path_buf(), source })
}

/// Writes `index` to `path` through a temporary file, so `path` is either absent or complete.
fn save(index: &Index, path: &Path) -> Result<(), RetrieverError> {
    let temporary = PathBuf::from(format!("{}.tmp", path.display()));
    index.save(&utf8(&temporary)?).map_err(|e| usearch_error(&temporary, e))?;
    std::fs::rename(&temporary, path)
        .map_err(|source| RetrieverError::Io { path: path.to_path_buf(), source })
}

fn utf8(path: &Path) -> Result<String, RetrieverError> {
    path.to_str().map(str::to_string).ok_or_else(|| RetrieverError::Index {
        path: path.to_path_buf(),
        reason: "usearch needs a UTF-8 path".into(),
    })
}

fn usearch_error(path: &Path, error: impl std::fmt::Display) -> RetrieverError {
    RetrieverError::Index { path: path.to_path_buf(), reason: format!("usearch: {error}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docstore::FORMAT;
    use rand::{Rng, SeedableRng};

    const DIM: usize = 16;

    /// A dense index folder of `rows` random unit vectors (manifest and embeddings, as the graph
    /// reads them), and the vectors.
    fn folder(rows: usize) -> (tempfile::TempDir, Vec<f32>) {
        let dir = tempfile::tempdir().unwrap();
        let vectors = unit_vectors(rows, 7);
        let bytes: Vec<u8> = vectors.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut crc = flate2::Crc::new();
        crc.update(&bytes);
        std::fs::write(dir.path().join(EMBEDDINGS), &bytes).unwrap();
        let manifest = Manifest {
            format: FORMAT,
            method: Method::Dense,
            documents: rows as u64,
            encoder: None,
            dim: Some(DIM),
            embeddings_crc32: Some(crc.sum()),
            ann: None,
        };
        write_manifest(dir.path(), &manifest).unwrap();
        (dir, vectors)
    }

    fn unit_vectors(rows: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut v: Vec<f32> = (0..rows * DIM).map(|_| rng.random_range(-1.0..1.0)).collect();
        for row in v.chunks_mut(DIM) {
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x /= norm);
        }
        v
    }

    /// The exact top `k` ordinals of each query by inner product.
    fn exact(vectors: &[f32], queries: &[f32], k: usize) -> Vec<Vec<u64>> {
        queries
            .chunks(DIM)
            .map(|q| {
                let mut scored: Vec<(f32, u64)> = vectors
                    .chunks(DIM)
                    .enumerate()
                    .map(|(i, v)| (q.iter().zip(v).map(|(a, b)| a * b).sum(), i as u64))
                    .collect();
                scored.sort_by(|a, b| b.0.total_cmp(&a.0));
                scored.into_iter().take(k).map(|(_, i)| i).collect()
            })
            .collect()
    }

    fn recall(found: &[Vec<(u64, f32)>], truth: &[Vec<u64>]) -> f64 {
        let hits: usize =
            found.iter().zip(truth).map(|(f, t)| f.iter().filter(|(o, _)| t.contains(o)).count()).sum();
        hits as f64 / truth.iter().map(Vec::len).sum::<usize>() as f64
    }

    #[test]
    fn the_graph_is_searched_from_memory_advised_for_huge_pages() {
        let (dir, vectors) = folder(3000);
        build(dir.path(), &AnnConfig::default(), |_, _| {}).unwrap();
        let manifest = Manifest::read(dir.path()).unwrap();
        let graph = Graph::open(dir.path(), &manifest, 64, 10).unwrap();
        // The bytes are the file's, and the index searches them.
        assert_eq!(&graph._memory.bytes[..], &std::fs::read(dir.path().join(GRAPH)).unwrap()[..]);
        let found = graph.search(&vectors[..DIM], 1).unwrap();
        assert_eq!(found[0][0].0, 0, "a stored vector finds itself");
        if !Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            return; // a kernel without transparent huge pages refuses the advice
        }
        // The kernel marks a mapping advised for huge pages `hg` in its VmFlags.
        let start = format!("{:x}-", graph._memory.bytes.as_ptr() as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let flags = smaps
            .lines()
            .skip_while(|line| !line.starts_with(&start))
            .find(|line| line.starts_with("VmFlags:"))
            .expect("the graph's mapping");
        assert!(flags.split_whitespace().any(|flag| flag == "hg"), "{flags}");
    }

    #[test]
    fn the_graph_finds_the_exact_neighbours_and_scores_them_by_inner_product() {
        let (dir, vectors) = folder(3000);
        let config = AnnConfig { quantization: AnnQuantization::F32, ..AnnConfig::default() };
        build(dir.path(), &config, |_, _| {}).unwrap();
        let manifest = Manifest::read(dir.path()).unwrap();
        assert_eq!(manifest.ann, Some(config), "the manifest names the graph");
        let graph = Graph::open(dir.path(), &manifest, 256, 0).unwrap();
        let queries = unit_vectors(50, 99);
        let found = graph.search(&queries, 10).unwrap();
        let truth = exact(&vectors, &queries, 10);
        assert!(recall(&found, &truth) >= 0.98, "recall {}", recall(&found, &truth));
        let (ordinal, score) = found[0][0];
        let row = &vectors[ordinal as usize * DIM..][..DIM];
        let dot: f32 = queries[..DIM].iter().zip(row).map(|(a, b)| a * b).sum();
        assert!((score - dot).abs() < 1e-4, "{score} vs {dot}");
        assert!(found.iter().all(|f| f.windows(2).all(|w| w[0].1 >= w[1].1)), "best first");
    }

    #[test]
    fn search_candidates_and_re_scoring_decide_how_close_to_exact() {
        let (dir, vectors) = folder(3000);
        build(dir.path(), &AnnConfig::default(), |_, _| {}).unwrap();
        let manifest = Manifest::read(dir.path()).unwrap();
        let queries = unit_vectors(100, 3);
        let truth = exact(&vectors, &queries, 10);
        let recall_of = |expansion_search, rerank| {
            let graph = Graph::open(dir.path(), &manifest, expansion_search, rerank).unwrap();
            recall(&graph.search(&queries, 10).unwrap(), &truth)
        };
        // Few candidates explored and only the 10 kept re-scored: the i8 graph's own ranking.
        let narrow = recall_of(1, 0);
        let wide = recall_of(256, 0);
        let rescored = recall_of(1, 200);
        let everything = recall_of(1, 3000);
        assert!(narrow < wide && wide >= 0.95, "ef 1: {narrow}, ef 256: {wide}");
        assert!(rescored > narrow, "re-scoring more candidates finds more neighbours: {rescored}");
        assert!(everything >= 0.99, "every vector re-scored: {everything}");
    }

    #[test]
    fn the_one_bit_graph_finds_candidates_that_re_scoring_ranks_exactly() {
        let (dir, vectors) = folder(3000);
        let config = AnnConfig { quantization: AnnQuantization::B1, ..AnnConfig::default() };
        build(dir.path(), &config, |_, _| {}).unwrap();
        let manifest = Manifest::read(dir.path()).unwrap();
        let mut graph = Graph::open(dir.path(), &manifest, 256, 0).unwrap();
        assert!(graph.binary);
        // 2 bytes of signs a vector of 16 dimensions, beside its links.
        let bytes = std::fs::metadata(dir.path().join(GRAPH)).unwrap().len();
        assert!(bytes < 3000 * (16 * 4 + 2 * 32 * 4), "{bytes} bytes");
        let queries = unit_vectors(100, 3);
        let truth = exact(&vectors, &queries, 10);
        let signs_only = recall(&graph.search(&queries, 10).unwrap(), &truth);
        graph.set_rerank(300);
        let found = graph.search(&queries, 10).unwrap();
        let rescored = recall(&found, &truth);
        assert!(
            rescored >= 0.9 && rescored > signs_only + 0.2,
            "signs alone {signs_only}, re-scored {rescored}"
        );
        // Scores are exact inner products, best first.
        let (ordinal, score) = found[0][0];
        let row = &vectors[ordinal as usize * DIM..][..DIM];
        let dot: f32 = queries[..DIM].iter().zip(row).map(|(a, b)| a * b).sum();
        assert!((score - dot).abs() < 1e-5, "{score} vs {dot}");
        assert!(found.iter().all(|f| f.windows(2).all(|w| w[0].1 >= w[1].1)));
    }

    #[test]
    fn signs_and_the_dot_product_of_stored_rows() {
        let v: Vec<f32> = (0..19).map(|i| if i % 3 == 0 { 0.5 } else { -0.25 }).collect();
        let bits = signs(&v);
        assert_eq!(bits.len(), 3);
        assert_eq!(bits[0].0, 0b0100_1001);
        assert_eq!(bits[1].0, 0b1001_0010);
        assert_eq!(bits[2].0, 0b0000_0100, "dimension 18 is positive");
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let expected: f32 = v.iter().map(|x| x * x).sum();
        assert!((dot(&bytes, &v) - expected).abs() < 1e-6);
    }

    #[test]
    fn a_stopped_build_resumes_from_its_checkpoint() {
        // Three chunks of embeddings; the build stops after the second, checkpointed one.
        let rows = 2 * crate::dense::READ_ROWS + 100;
        let (dir, vectors) = folder(rows);
        let config = AnnConfig::default();
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            build_with_checkpoints(dir.path(), &config, 1000, |added, _| {
                assert!(added < 2 * crate::dense::READ_ROWS as u64, "stopped");
            })
        }));
        assert!(stopped.is_err());
        let partial = dir.path().join(format!("{GRAPH}.partial"));
        let saved = Index::restore(partial.to_str().unwrap()).unwrap();
        assert_eq!(saved.size(), 2 * crate::dense::READ_ROWS, "two chunks were checkpointed");
        assert!(Manifest::read(dir.path()).unwrap().ann.is_none(), "no graph named yet");
        // Marks the checkpoint, so the resumed graph shows whether it grew from it.
        saved.rename(0, 4_000_000).unwrap();
        saved.save(partial.to_str().unwrap()).unwrap();

        build_with_checkpoints(dir.path(), &config, 1000, |_, _| {}).unwrap();
        assert!(!partial.exists(), "the checkpoint is removed once the graph is complete");
        let manifest = Manifest::read(dir.path()).unwrap();
        let graph = Graph::open(dir.path(), &manifest, 128, 40).unwrap();
        assert_eq!(graph.index.size(), rows);
        assert!(graph.index.contains(4_000_000) && !graph.index.contains(0), "resumed, not rebuilt");
        let queries = unit_vectors(20, 5);
        let found = graph.search(&queries, 10).unwrap();
        assert!(recall(&found, &exact(&vectors, &queries, 10)) >= 0.9);
    }

    #[test]
    fn a_graph_of_other_vectors_or_none_is_refused() {
        let (dir, _) = folder(200);
        build(dir.path(), &AnnConfig::default(), |_, _| {}).unwrap();
        let mut manifest = Manifest::read(dir.path()).unwrap();
        manifest.documents = 201;
        let err = Graph::open(dir.path(), &manifest, 64, 0).err().unwrap().to_string();
        assert!(err.contains("holds 200 vectors of dimension 16, but the index has 201"), "{err}");
        std::fs::remove_file(dir.path().join(GRAPH)).unwrap();
        let err = Graph::open(dir.path(), &manifest, 64, 0).err().unwrap().to_string();
        assert!(err.contains("ann.usearch") && err.contains("missing"), "{err}");
        manifest.method = Method::Bm25;
        write_manifest(dir.path(), &manifest).unwrap();
        let err = build(dir.path(), &AnnConfig::default(), |_, _| {}).err().unwrap().to_string();
        assert!(err.contains("--method dense") || err.contains("dense index"), "{err}");
    }
}
