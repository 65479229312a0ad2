//! Data parallelism over a c10d process group, as PyTorch's DistributedDataParallel does it:
//! parameters broadcast from rank 0 at start, each rank computing its share of every
//! mini-batch's samples, gradients summed across ranks in buckets before every optimiser step.
//!
//! The losses are normalised by the whole mini-batch's token and sequence counts (computed from
//! all samples on every rank), so the summed gradient is the one a single process computes, and
//! every rank takes the same optimiser step.

use super::batch::{Field, Sample};
use kart_torch::{DistError, ProcessGroup, ReduceOp};
use tch::{Device, Kind, Tensor};

/// This rank's part in a data-parallel run.
pub struct DataParallel {
    group: ProcessGroup,
    bucket_bytes: usize,
}

impl DataParallel {
    /// Data parallelism over `group`, gradients reduced in buckets of `bucket_mb` MiB.
    pub fn new(group: ProcessGroup, bucket_mb: f64) -> DataParallel {
        let bucket_bytes = (bucket_mb * f64::from(1u32 << 20)).max(1.0) as usize;
        DataParallel { group, bucket_bytes }
    }

    /// The process group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// `params`' gradient buckets: consecutive parameters of at most `bucket_mb` MiB.
    pub fn buckets(&self, params: &[Tensor]) -> Vec<Vec<usize>> {
        buckets(params, self.bucket_bytes)
    }

    /// The largest of the ranks' `count`s.
    pub fn max(&self, count: usize) -> Result<usize, DistError> {
        let mut t = Tensor::from_slice(&[count as i64]).to_device(self.group.device());
        self.group.all_reduce(&mut t, ReduceOp::Max)?;
        Ok(t.int64_value(&[0]) as usize)
    }

    /// The rows of `rows` this rank computes, balanced by tokens: longest first, each row goes to
    /// the rank with the fewest tokens so far (the lowest rank on a tie). Every rank computes the
    /// same assignment.
    pub fn share(&self, samples: &[Sample], rows: &[usize]) -> Vec<usize> {
        balance(samples, rows, self.group.world_size()).swap_remove(self.group.rank())
    }

    /// Overwrites `params` with rank 0's, bucket by bucket.
    pub fn broadcast_parameters(&self, params: &[Tensor]) -> Result<(), DistError> {
        tch::no_grad(|| {
            for bucket in buckets(params, self.bucket_bytes) {
                let mut flat = flatten(params, &bucket);
                self.group.broadcast(&mut flat, 0)?;
                unflatten(&flat, params, &bucket, |p, v| p.detach().copy_(v));
            }
            Ok(())
        })
    }

    /// Sums the gradients of `params` across ranks: all buckets are started, then waited on, so
    /// the transfers overlap each other. A parameter this rank computed no gradient for (it had
    /// no samples) contributes zeros.
    pub fn all_reduce_gradients(&self, params: &[Tensor]) -> Result<(), DistError> {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = params.iter().map(|p| p.grad()).collect();
            let missing: Vec<&Tensor> =
                params.iter().zip(&grads).filter(|(_, g)| !g.defined()).map(|(p, _)| p).collect();
            if !missing.is_empty() {
                define_zero_gradients(&missing);
                return self.all_reduce_gradients(params);
            }
            let buckets = buckets(params, self.bucket_bytes);
            let mut flats: Vec<Tensor> = buckets.iter().map(|b| flatten(&grads, b)).collect();
            let works = flats
                .iter_mut()
                .map(|f| self.group.start_all_reduce(f, ReduceOp::Sum))
                .collect::<Result<Vec<_>, _>>()?;
            for work in works {
                work.wait()?;
            }
            for (flat, bucket) in flats.iter().zip(&buckets) {
                unflatten(flat, &grads, bucket, |g, v| g.copy_(v));
            }
            Ok(())
        })
    }

    /// Sums `values` across ranks.
    pub fn sum(&self, values: &mut [f64]) -> Result<(), DistError> {
        let mut t = Tensor::from_slice(values).to_device(self.group.device());
        self.group.all_reduce(&mut t, ReduceOp::Sum)?;
        let summed = Vec::<f64>::try_from(t.to_device(Device::Cpu)).expect("f64 values");
        values.copy_from_slice(&summed);
        Ok(())
    }

    /// Makes `fields` of every sample whole on every rank, where each rank filled its share's
    /// entries and left the rest 0.
    pub fn combine(&self, samples: &mut [Sample], fields: &[Field]) -> Result<(), DistError> {
        let mut flat: Vec<f32> = Vec::new();
        for s in samples.iter() {
            for &f in fields {
                flat.extend_from_slice(f.of(s));
            }
        }
        let mut t = Tensor::from_slice(&flat).to_device(self.group.device());
        self.group.all_reduce(&mut t, ReduceOp::Sum)?;
        let summed = Vec::<f32>::try_from(t.to_device(Device::Cpu)).expect("f32 values");
        let mut at = 0;
        for s in samples.iter_mut() {
            for &f in fields {
                let dst = f.of_mut(s);
                let n = dst.len();
                dst.copy_from_slice(&summed[at..at + n]);
                at += n;
            }
        }
        Ok(())
    }
}

/// `rows` dealt to `ranks` ranks by tokens, longest first to the least loaded.
fn balance(samples: &[Sample], rows: &[usize], ranks: usize) -> Vec<Vec<usize>> {
    let mut sorted = rows.to_vec();
    sorted.sort_by_key(|&i| std::cmp::Reverse(samples[i].len()));
    let mut shares = vec![(0usize, Vec::new()); ranks.max(1)];
    for i in sorted {
        let (tokens, share) = shares.iter_mut().min_by_key(|(tokens, _)| *tokens).expect("at least one rank");
        *tokens += samples[i].len();
        share.push(i);
    }
    shares.into_iter().map(|(_, share)| share).collect()
}

/// Consecutive runs of parameter indices of at most `bucket_bytes` each (a larger tensor is a
/// bucket of its own).
pub(crate) fn buckets(params: &[Tensor], bucket_bytes: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for (i, p) in params.iter().enumerate() {
        let size = p.numel() * p.kind().elt_size_in_bytes();
        match buckets.last_mut() {
            Some(b) if bytes + size <= bucket_bytes => b.push(i),
            _ => {
                buckets.push(vec![i]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    buckets
}

/// Gives `params` zero gradients (what a rank without samples contributes).
fn define_zero_gradients(params: &[&Tensor]) {
    tch::with_grad(|| {
        let zero: Tensor = params.iter().map(|p| (*p * 0.0).sum(Kind::Float)).sum();
        zero.backward();
    });
}

/// The tensors of `bucket`, flattened and concatenated.
pub(crate) fn flatten(tensors: &[Tensor], bucket: &[usize]) -> Tensor {
    let parts: Vec<Tensor> = bucket.iter().map(|&i| tensors[i].detach().reshape([-1])).collect();
    Tensor::cat(&parts, 0)
}

/// Hands each tensor of `bucket` its slice of `flat` through `write`.
pub(crate) fn unflatten(
    flat: &Tensor,
    tensors: &[Tensor],
    bucket: &[usize],
    write: impl Fn(&mut Tensor, &Tensor),
) {
    let mut at = 0;
    for &i in bucket {
        let mut t = tensors[i].shallow_clone();
        let (n, shape) = (t.numel() as i64, t.size());
        write(&mut t, &flat.narrow(0, at, n).view(shape.as_slice()));
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_like_numbers_of_tokens_not_of_samples() {
        let sample = |len: usize| Sample {
            group: 0,
            token_ids: vec![1; len],
            prompt_len: 1,
            loss_mask: vec![1.0; len],
            rollout_logprobs: vec![0.0; len],
            reward: 0.0,
            truncated: false,
            old_logprobs: vec![0.0; len],
            ref_logprobs: vec![0.0; len],
            values: vec![0.0; len],
            advantages: vec![0.0; len],
            returns: vec![0.0; len],
        };
        let samples: Vec<Sample> = [100, 10, 10, 10, 10, 10, 50, 40].into_iter().map(sample).collect();
        let shares = balance(&samples, &(0..8).collect::<Vec<_>>(), 2);
        let tokens: Vec<usize> = shares.iter().map(|s| s.iter().map(|&i| samples[i].len()).sum()).collect();
        assert_eq!(tokens, [120, 120], "{shares:?}");
        assert_eq!(shares[0], [0, 2, 4], "the long sample and two short ones");
        assert_eq!(balance(&samples, &[1], 3), [vec![1], vec![], vec![]]);
    }

    #[test]
    fn buckets_hold_consecutive_parameters_up_to_their_size() {
        let params: Vec<Tensor> =
            [256, 256, 1024, 16].iter().map(|&n| Tensor::zeros([n], (Kind::Float, Device::Cpu))).collect();
        assert_eq!(buckets(&params, 2048), vec![vec![0, 1], vec![2], vec![3]]);
        assert_eq!(buckets(&params, 1 << 20), vec![vec![0, 1, 2, 3]]);
        assert_eq!(buckets(&params, 1), vec![vec![0], vec![1], vec![2], vec![3]]);
    }
}
