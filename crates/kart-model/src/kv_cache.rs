//! The key/value cache of a batch of sequences being generated together.
//!
//! Sequences are right-aligned: every row's newest token sits in the same (last) column, and shorter
//! rows are padded on the left. A per-column validity mask says which entries are real. This makes a
//! decoding step a single in-place write of one column for the whole batch, and lets sequences join
//! ([`KvCache::merge`]) and leave ([`KvCache::retain_rows`]) between steps: continuous batching
//! without a paged allocator. Storage grows by doubling, so appends are amortised O(1) copies.

use tch::{Device, Kind, Tensor};

/// Keys and values of every layer for a batch of right-aligned sequences.
#[derive(Debug)]
pub struct KvCache {
    /// Per layer, `(B, kv_heads, capacity, head_dim)`; columns `[0, len)` are in use.
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// `(B, capacity)` bool: whether a column of a row holds a real token.
    valid: Tensor,
    len: i64,
}

impl KvCache {
    /// An empty cache for `batch` rows.
    pub fn new(layers: usize, batch: i64, kv_heads: i64, head_dim: i64, kind: Kind, device: Device) -> Self {
        let empty = || Tensor::zeros([batch, kv_heads, 0, head_dim], (kind, device));
        KvCache {
            keys: (0..layers).map(|_| empty()).collect(),
            values: (0..layers).map(|_| empty()).collect(),
            valid: Tensor::zeros([batch, 0], (Kind::Bool, device)),
            len: 0,
        }
    }

    /// Number of rows (sequences).
    pub fn batch(&self) -> i64 {
        self.valid.size()[0]
    }

    /// Number of columns in use (the longest row, padding included).
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether no column is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `(B, len)` bool mask of the columns holding real tokens.
    pub fn valid(&self) -> Tensor {
        self.valid.narrow(1, 0, self.len)
    }

    /// Marks `t` new columns with their validity `(B, t)` and makes room for them; call once per
    /// forward pass, before the layers [`append`](Self::append) their keys and values.
    pub fn push_columns(&mut self, valid: &Tensor) {
        let t = valid.size()[1];
        self.reserve(self.len + t);
        self.valid.narrow(1, self.len, t).copy_(valid);
        self.len += t;
    }

    /// Writes a layer's keys and values `(B, kv_heads, t, head_dim)` into the `t` columns reserved by
    /// the last [`push_columns`](Self::push_columns) and returns that layer's keys and values of all
    /// `len` columns.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.size()[2];
        let start = self.len - t;
        self.keys[layer].narrow(2, start, t).copy_(k);
        self.values[layer].narrow(2, start, t).copy_(v);
        (self.keys[layer].narrow(2, 0, self.len), self.values[layer].narrow(2, 0, self.len))
    }

    /// Keeps only the rows in `rows` (in that order) and drops leading columns no remaining row uses.
    pub fn retain_rows(&mut self, rows: &[i64]) {
        let device = self.valid.device();
        let index = Tensor::from_slice(rows).to_device(device);
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = t.narrow(2, 0, self.len).index_select(0, &index);
        }
        self.valid = self.valid.narrow(1, 0, self.len).index_select(0, &index);
        self.trim_leading_padding();
    }

    /// Appends the rows of `other` below this cache's rows, right-aligning the two.
    pub fn merge(&mut self, other: KvCache) {
        if self.batch() == 0 {
            *self = other;
            return;
        }
        let len = self.len.max(other.len);
        let (a, b) = (self.left_padded(len), other.left_padded(len));
        self.keys = a.keys.iter().zip(&b.keys).map(|(x, y)| Tensor::cat(&[x, y], 0)).collect();
        self.values = a.values.iter().zip(&b.values).map(|(x, y)| Tensor::cat(&[x, y], 0)).collect();
        self.valid = Tensor::cat(&[&a.valid, &b.valid], 0);
        self.len = len;
    }

    /// A copy whose rows are left-padded to `len` columns, trimmed to exactly `len` columns.
    fn left_padded(&self, len: i64) -> KvCache {
        let pad = len - self.len;
        let pad_kv = |t: &Tensor| {
            let used = t.narrow(2, 0, self.len);
            if pad == 0 {
                return used;
            }
            let mut shape = used.size();
            shape[2] = pad;
            Tensor::cat(&[&Tensor::zeros(shape, (used.kind(), used.device())), &used], 2)
        };
        let used_valid = self.valid.narrow(1, 0, self.len);
        let valid = if pad == 0 {
            used_valid
        } else {
            Tensor::cat(
                &[&Tensor::zeros([self.batch(), pad], (Kind::Bool, used_valid.device())), &used_valid],
                1,
            )
        };
        KvCache {
            keys: self.keys.iter().map(pad_kv).collect(),
            values: self.values.iter().map(pad_kv).collect(),
            valid,
            len,
        }
    }

    /// Drops leading columns that are padding in every row.
    fn trim_leading_padding(&mut self) {
        let used = self.valid.narrow(1, 0, self.len).any_dim(0, false);
        let first = Vec::<bool>::try_from(&used).expect("bool column mask").iter().position(|&u| u);
        let drop = first.map_or(self.len, |f| f as i64);
        if drop == 0 {
            return;
        }
        let keep = self.len - drop;
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = t.narrow(2, drop, keep).contiguous();
        }
        self.valid = self.valid.narrow(1, drop, keep).contiguous();
        self.len = keep;
    }

    /// Ensures storage for `needed` columns, doubling the capacity when it grows.
    fn reserve(&mut self, needed: i64) {
        let capacity = self.valid.size()[1];
        if needed <= capacity {
            return;
        }
        let new_capacity = needed.max(2 * capacity).max(16);
        let grow = |t: &Tensor, dim: usize| {
            let mut shape = t.size();
            shape[dim] = new_capacity;
            let bigger = Tensor::zeros(shape, (t.kind(), t.device()));
            bigger.narrow(dim as i64, 0, self.len).copy_(&t.narrow(dim as i64, 0, self.len));
            bigger
        };
        self.keys = self.keys.iter().map(|t| grow(t, 2)).collect();
        self.values = self.values.iter().map(|t| grow(t, 2)).collect();
        self.valid = grow(&self.valid, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(batch: i64, valid_rows: &[&[bool]]) -> KvCache {
        let mut c = KvCache::new(1, batch, 1, 2, Kind::Float, Device::Cpu);
        let t = valid_rows[0].len() as i64;
        let flat: Vec<bool> = valid_rows.iter().flat_map(|r| r.iter().copied()).collect();
        c.push_columns(&Tensor::from_slice(&flat).view([batch, t]));
        let k = Tensor::arange(batch * t * 2, (Kind::Float, Device::Cpu)).view([batch, 1, t, 2]);
        let _ = c.append(0, &k, &k);
        c
    }

    #[test]
    fn append_grows_and_returns_all_columns() {
        let mut c = filled(2, &[&[true, true], &[false, true]]);
        c.push_columns(&Tensor::from_slice(&[true, true]).view([2, 1]));
        let new = Tensor::full([2, 1, 1, 2], 100.0, (Kind::Float, Device::Cpu));
        let (k, _) = c.append(0, &new, &new);
        assert_eq!(k.size(), [2, 1, 3, 2]);
        assert_eq!(k.double_value(&[1, 0, 2, 1]), 100.0);
        assert_eq!(k.double_value(&[1, 0, 1, 0]), 6.0);
        assert_eq!(
            Vec::<bool>::try_from(c.valid().reshape([-1])).unwrap(),
            [true, true, true, false, true, true]
        );
    }

    #[test]
    fn merge_right_aligns_rows_of_different_lengths() {
        let mut a = filled(1, &[&[true]]);
        let b = filled(1, &[&[true, true, true]]);
        a.merge(b);
        assert_eq!(a.len(), 3);
        assert_eq!(
            Vec::<bool>::try_from(a.valid().reshape([-1])).unwrap(),
            [false, false, true, true, true, true]
        );
        let (k, _) = a.append_view(0);
        assert_eq!(k.double_value(&[0, 0, 2, 1]), 1.0, "row 0's only token sits in the last column");
        assert_eq!(k.double_value(&[0, 0, 0, 1]), 0.0, "left padding");
        assert_eq!(k.double_value(&[1, 0, 0, 1]), 1.0, "row 1 unchanged");
    }

    #[test]
    fn retaining_rows_trims_shared_padding() {
        let mut a = filled(1, &[&[true]]);
        a.merge(filled(1, &[&[true, true, true]]));
        a.retain_rows(&[0]);
        assert_eq!(a.batch(), 1);
        assert_eq!(a.len(), 1, "the two padding columns of the remaining row are dropped");
        a.retain_rows(&[]);
        assert_eq!((a.batch(), a.len()), (0, 0));
    }

    impl KvCache {
        fn append_view(&self, layer: usize) -> (Tensor, Tensor) {
            (self.keys[layer].narrow(2, 0, self.len), self.values[layer].narrow(2, 0, self.len))
        }
    }
}
