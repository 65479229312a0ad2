//! The exact scan of a dense index: every embedding scored against each query by a matrix
//! product and top-k, the embeddings sharded over devices.
//!
//! On the CPU the embeddings are one f32 shard. With CUDA they are split into one contiguous
//! shard per visible GPU and held in f16, as Search-R1's faiss GPU index holds them
//! (`index_cpu_to_all_gpus` with `shard` and `useFloat16`): wiki-18's 21M x 768 embeddings take
//! 32 GB in f16, on one 80 GB GPU or spread over several (`CUDA_VISIBLE_DEVICES` chooses which).
//! Every shard scores the queries and keeps its best `k` on its own device, all shards at once;
//! their candidates are merged on the host.

use crate::RetrieverError;
use crate::dense::for_each_chunk;
use kart_model::ModelError;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Most scores materialised at once while searching (queries x passages of one corpus slice).
const SCORE_BUDGET: i64 = 1 << 26;

/// Where the shards of a flat index live, and the precision they are held and scored in.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// One shard per device, in this order (contiguous row ranges of equal size).
    pub devices: Vec<Device>,
    /// The embeddings' element type.
    pub kind: Kind,
}

impl Placement {
    /// For searching on `device`: every visible GPU in f16 when it is a CUDA device, else `device`
    /// alone in f32.
    pub fn for_device(device: Device) -> Self {
        match device {
            Device::Cuda(_) => {
                let count = tch::Cuda::device_count().max(1) as usize;
                Placement { devices: (0..count).map(Device::Cuda).collect(), kind: Kind::Half }
            }
            device => Placement { devices: vec![device], kind: Kind::Float },
        }
    }
}

/// The embeddings of a dense index, sharded for the exact scan.
pub struct FlatIndex {
    shards: Vec<Shard>,
}

/// Contiguous rows of the embeddings on one device.
struct Shard {
    /// `(rows, D)` in the placement's kind.
    embeddings: Tensor,
    /// The ordinal of its first row.
    first_row: i64,
}

impl FlatIndex {
    /// Reads the embeddings file `path` of `rows` x `dim` little-endian f32 into the shards of
    /// `placement`, refusing a file of another size, or whose CRC-32 is not `crc32` (when given).
    pub fn read(
        path: &Path,
        rows: u64,
        dim: usize,
        crc32: Option<u32>,
        placement: &Placement,
    ) -> Result<Self, RetrieverError> {
        let rows = rows as i64;
        let per_shard = (rows + placement.devices.len() as i64 - 1) / placement.devices.len().max(1) as i64;
        let shards: Vec<Shard> = placement
            .devices
            .iter()
            .enumerate()
            .map(|(i, &device)| (i as i64 * per_shard, device))
            .take_while(|&(first_row, _)| first_row < rows)
            .map(|(first_row, device)| {
                let len = per_shard.min(rows - first_row);
                Shard { embeddings: Tensor::empty([len, dim as i64], (placement.kind, device)), first_row }
            })
            .collect();
        for_each_chunk(path, rows as u64, dim, crc32, |start, values| {
            let (start, len) = (start as i64, (values.len() / dim) as i64);
            let chunk = Tensor::from_slice(values).view([len, dim as i64]);
            for shard in &shards {
                let from = start.max(shard.first_row);
                let to = (start + len).min(shard.first_row + shard.embeddings.size()[0]);
                if from < to {
                    let mut rows = shard.embeddings.narrow(0, from - shard.first_row, to - from);
                    rows.copy_(&chunk.narrow(0, from - start, to - from));
                }
            }
            Ok(())
        })?;
        tracing::info!(
            rows,
            shards = shards.len(),
            devices = ?placement.devices,
            kind = ?placement.kind,
            "dense embeddings loaded for the exact scan"
        );
        Ok(FlatIndex { shards })
    }

    /// The `k` highest inner products of each query `(Q, D)` (f32, on any device) with every
    /// embedding, best first, as `(ordinal, score)`.
    pub fn search(&self, queries: &Tensor, k: usize) -> Result<Vec<Vec<(u64, f32)>>, ModelError> {
        let q = queries.size()[0];
        if self.shards.is_empty() || k == 0 {
            return Ok(vec![Vec::new(); q as usize]);
        }
        // Every shard's search is queued on its device before any result is waited for.
        let candidates: Vec<(Tensor, Tensor)> = self
            .shards
            .iter()
            .map(|shard| {
                let queries = queries.to_device(shard.embeddings.device()).to_kind(shard.embeddings.kind());
                let (scores, rows) = exact_top_k(&queries, &shard.embeddings, k as i64);
                (scores, rows + shard.first_row)
            })
            .collect();
        let (scores, rows): (Vec<Tensor>, Vec<Tensor>) = candidates
            .into_iter()
            .map(|(scores, rows)| {
                (scores.to_device(Device::Cpu).to_kind(Kind::Float), rows.to_device(Device::Cpu))
            })
            .unzip();
        let (scores, rows) = best_of(scores, rows, k as i64);
        let width = scores.size()[1] as usize;
        let scores = Vec::<f32>::try_from(scores.flatten(0, -1))?;
        let rows = Vec::<i64>::try_from(rows.flatten(0, -1))?;
        Ok(scores
            .chunks(width)
            .zip(rows.chunks(width))
            .map(|(s, r)| r.iter().map(|&r| r as u64).zip(s.iter().copied()).collect())
            .collect())
    }
}

/// The exact scan: the `k` highest inner products of each query `(Q, D)` with the embeddings
/// `(N, D)`, best first, as `(scores, rows)`, both `(Q, min(k, N))`, with no more than a fixed
/// budget of scores materialised at once whatever the corpus size.
fn exact_top_k(queries: &Tensor, embeddings: &Tensor, k: i64) -> (Tensor, Tensor) {
    top_k(queries, embeddings, k, SCORE_BUDGET / queries.size()[0].max(1))
}

/// The `k` highest inner products of each query `(Q, D)` with the embeddings `(N, D)`, best
/// first, as `(scores, rows)`, both `(Q, min(k, N))`. The corpus is scored `slice` rows at a time.
fn top_k(queries: &Tensor, embeddings: &Tensor, k: i64, slice: i64) -> (Tensor, Tensor) {
    let n = embeddings.size()[0];
    let k = k.min(n);
    let slice = slice.max(k);
    let (mut scores, mut rows) = (Vec::new(), Vec::new());
    for start in (0..n).step_by(slice as usize) {
        let len = slice.min(n - start);
        let slice_scores = queries.matmul(&embeddings.narrow(0, start, len).tr());
        let (best, best_rows) = slice_scores.topk(k.min(len), 1, true, true);
        scores.push(best);
        rows.push(best_rows + start);
    }
    best_of(scores, rows, k)
}

/// The `k` best of candidate `(scores, rows)` pairs, each `(Q, k_i)` and best first, as one
/// `(Q, min(k, sum k_i))` pair, best first.
fn best_of(mut scores: Vec<Tensor>, mut rows: Vec<Tensor>, k: i64) -> (Tensor, Tensor) {
    if scores.len() == 1 {
        return (scores.remove(0), rows.remove(0));
    }
    let all = Tensor::cat(&scores, 1);
    let (best, position) = all.topk(k.min(all.size()[1]), 1, true, true);
    (best, Tensor::cat(&rows, 1).gather(1, &position, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Crc;

    #[test]
    fn slicing_the_corpus_does_not_change_the_top_k() {
        // Fixed, distinct values: a matrix product over a slice may round differently in the last
        // bit, so the scores are compared within rounding and the rows exactly.
        let fixed = |n: i64, step: f64| {
            (Tensor::arange(n * 8, (Kind::Float, Device::Cpu)) * step).sin().reshape([n, 8])
        };
        let (embeddings, queries) = (fixed(1000, 0.77), fixed(3, 1.31));
        let (whole, whole_rows) = top_k(&queries, &embeddings, 5, 1000);
        let (sliced, sliced_rows) = top_k(&queries, &embeddings, 5, 37);
        assert!(whole_rows.equal(&sliced_rows), "{whole_rows} vs {sliced_rows}");
        assert!(whole.allclose(&sliced, 1e-5, 1e-6, false), "{whole} vs {sliced}");
        let (_, exact) = queries.matmul(&embeddings.tr()).topk(5, 1, true, true);
        assert!(exact.equal(&whole_rows));
    }

    /// Writes `rows` x `dim` small integers (exact in f16, as are their inner products) as an
    /// embeddings file; returns them and the file's CRC-32.
    fn embeddings_file(path: &Path, rows: usize, dim: usize) -> (Tensor, u32) {
        let values: Vec<f32> =
            (0..rows * dim).map(|i| ((i * 7919 + i / dim * 31) % 7) as f32 - 3.0).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, &bytes).unwrap();
        let mut crc = Crc::new();
        crc.update(&bytes);
        (Tensor::from_slice(&values).view([rows as i64, dim as i64]), crc.sum())
    }

    #[test]
    fn shards_in_f16_find_what_one_f32_scan_finds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("embeddings.f32");
        // More rows than one read, so chunks straddle the shard boundaries.
        let (rows, dim) = (2 * crate::dense::READ_ROWS + 1001, 8);
        let (embeddings, crc32) = embeddings_file(&path, rows, dim);
        let queries = embeddings.narrow(0, 5, 4) - embeddings.narrow(0, 17_000, 4);
        let k = 20;

        let single = Placement { devices: vec![Device::Cpu], kind: Kind::Float };
        let single = FlatIndex::read(&path, rows as u64, dim, Some(crc32), &single).unwrap();
        let sharded = Placement { devices: vec![Device::Cpu; 3], kind: Kind::Half };
        let sharded = FlatIndex::read(&path, rows as u64, dim, Some(crc32), &sharded).unwrap();
        let first_rows: Vec<i64> = sharded.shards.iter().map(|s| s.first_row).collect();
        assert_eq!(first_rows, [0, 11_257, 22_514]);
        assert_eq!(sharded.shards[2].embeddings.size(), [11_255, 8]);
        assert_eq!(sharded.shards[1].embeddings.kind(), Kind::Half);

        let expected = single.search(&queries, k).unwrap();
        let found = sharded.search(&queries, k).unwrap();
        let exact = Vec::<f32>::try_from(queries.matmul(&embeddings.tr()).flatten(0, -1)).unwrap();
        for (q, (found, expected)) in found.iter().zip(&expected).enumerate() {
            assert_eq!(found.len(), k);
            // Integer scores tie, so rows may come in another order among equals: the scores are
            // the same, each is its row's exact inner product, and no row comes twice.
            let scores = |hits: &[(u64, f32)]| hits.iter().map(|&(_, s)| s).collect::<Vec<_>>();
            assert_eq!(scores(found), scores(expected), "query {q}");
            for &(row, score) in found {
                assert_eq!(score, exact[q * rows + row as usize], "query {q}, row {row}");
            }
            let distinct: std::collections::HashSet<u64> = found.iter().map(|&(row, _)| row).collect();
            assert_eq!(distinct.len(), k);
            assert!(found.iter().any(|&(row, _)| row >= 11_257), "later shards contribute: {found:?}");
        }
    }

    #[test]
    fn fewer_rows_than_devices_and_k_beyond_the_corpus() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("embeddings.f32");
        let (embeddings, crc32) = embeddings_file(&path, 2, 4);
        let placement = Placement { devices: vec![Device::Cpu; 4], kind: Kind::Float };
        let index = FlatIndex::read(&path, 2, 4, Some(crc32), &placement).unwrap();
        assert_eq!(index.shards.len(), 2, "no empty shards");
        let hits = index.search(&embeddings, 10).unwrap();
        assert!(hits.iter().all(|hits| hits.len() == 2), "{hits:?}");
        assert_eq!(index.search(&embeddings, 0).unwrap(), vec![Vec::new(); 2]);

        std::fs::write(&path, []).unwrap();
        let empty = FlatIndex::read(&path, 0, 4, None, &placement).unwrap();
        assert_eq!(empty.search(&embeddings, 3).unwrap(), vec![Vec::new(); 2]);
    }

    #[test]
    fn cuda_places_f16_shards_on_every_gpu() {
        assert_eq!(
            Placement::for_device(Device::Cpu),
            Placement { devices: vec![Device::Cpu], kind: Kind::Float }
        );
        if tch::Cuda::is_available() {
            let placement = Placement::for_device(Device::Cuda(0));
            assert_eq!(placement.devices.len(), tch::Cuda::device_count() as usize);
            assert_eq!(placement.kind, Kind::Half);
        }
    }
}
