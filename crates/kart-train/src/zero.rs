//! ZeRO over the data-parallel ranks: each rank keeps the AdamW state (both moments and the f32
//! master weights) of one slice of every gradient bucket, and with `sharding: gradients` only
//! that slice of the gradients between micro-batches.
//!
//! A bucket (the parameters of one gradient all-reduce bucket) is flattened and padded to a
//! multiple of the world size `W`; rank `r` owns its elements `[r S, (r + 1) S)`, `S` = padded
//! length / `W`.
//! - `optimizer` (ZeRO-1): gradients accumulate whole over a mini-batch's micro-batches; at the
//!   update each bucket is reduce-scattered, leaving each rank the sum of its slice.
//! - `gradients` (ZeRO-2): after every micro-batch each bucket is reduce-scattered into an f32
//!   accumulator of the rank's slice and the full gradients are dropped, so they live only while a
//!   micro-batch's backward pass runs. Every rank runs as many micro-batches as the busiest (the
//!   others reduce zeros), since each is a collective.
//!
//! Then every rank clips with the global norm (its slice's squares summed over the ranks),
//! updates its slice of the master weights with AdamW's arithmetic ([`Update`]), and all-gathers
//! the slices, in the parameters' kind, into the parameters. The update is element for element
//! AdamW's, so any number of ranks reaches the unsharded update. For a checkpoint the state is
//! gathered whole under [`AdamW`]'s names; a checkpoint is sliced on load, so a run resumes onto
//! any number of ranks.

use super::data_parallel::{DataParallel, flatten, unflatten};
use super::optim::{AdamW, NamedState, StateError, Update, clip_scale};
use kart_core::config::memory::Sharding;
use kart_core::config::train::OptimConfig;
use kart_torch::{DistError, ReduceOp};
use tch::{Kind, Tensor};

/// A model's optimiser: AdamW on every rank, or sharded over the ranks.
pub enum Optimizer {
    /// Every rank holds the whole state; gradients are all-reduced (DDP).
    Replicated(AdamW),
    /// Each rank holds a slice of the state.
    Sharded(ShardedAdamW),
}

impl Optimizer {
    /// The parameters it updates, in order.
    pub fn parameters(&self) -> Vec<Tensor> {
        match self {
            Optimizer::Replicated(o) => o.parameters(),
            Optimizer::Sharded(o) => o.params.iter().map(Tensor::shallow_clone).collect(),
        }
    }

    /// Updates taken so far.
    pub fn steps(&self) -> i64 {
        match self {
            Optimizer::Replicated(o) => o.steps(),
            Optimizer::Sharded(o) => o.steps,
        }
    }

    /// Clears the gradients before a mini-batch.
    pub fn zero_grad(&mut self) {
        match self {
            Optimizer::Replicated(o) => o.zero_grad(),
            Optimizer::Sharded(o) => o.zero_grad(),
        }
    }

    /// Whether every micro-batch ends in a collective ([`Self::after_micro_batch`]), so the ranks
    /// must run equally many.
    pub fn reduces_per_micro_batch(&self) -> bool {
        matches!(self, Optimizer::Sharded(o) if o.sharding == Sharding::Gradients)
    }

    /// After a micro-batch's backward pass: ZeRO-2 reduce-scatters the gradients into this rank's
    /// slice and drops them.
    pub fn after_micro_batch(&mut self, parallel: Option<&DataParallel>) -> Result<(), DistError> {
        match (self, parallel) {
            (Optimizer::Sharded(o), Some(p)) if o.sharding == Sharding::Gradients => o.reduce(p),
            _ => Ok(()),
        }
    }

    /// Sums the gradients over the ranks and applies one update at `lr`; returns the global
    /// gradient norm before clipping.
    pub fn step(&mut self, parallel: Option<&DataParallel>, lr: f64) -> Result<f64, DistError> {
        match (self, parallel) {
            (Optimizer::Sharded(o), Some(p)) => o.step(p, lr),
            (Optimizer::Replicated(o), parallel) => {
                if let Some(p) = parallel {
                    p.all_reduce_gradients(&o.parameters())?;
                }
                Ok(o.step(lr))
            }
            (Optimizer::Sharded(_), None) => unreachable!("a sharded optimiser is built with its ranks"),
        }
    }

    /// The whole state under [`AdamW::state`]'s names, and the update count. Sharded, every rank
    /// must call it (the slices are all-gathered).
    pub fn state(&self, parallel: Option<&DataParallel>) -> Result<(Vec<(String, Tensor)>, i64), DistError> {
        match (self, parallel) {
            (Optimizer::Replicated(o), _) => Ok(o.state()),
            (Optimizer::Sharded(o), Some(p)) => Ok((o.state(p)?, o.steps)),
            (Optimizer::Sharded(_), None) => unreachable!("a sharded optimiser is built with its ranks"),
        }
    }

    /// Restores a state written by [`Self::state`] (by any number of ranks).
    pub fn load_state(&mut self, tensors: Vec<(String, Tensor)>, steps: i64) -> Result<(), StateError> {
        match self {
            Optimizer::Replicated(o) => o.load_state(tensors, steps),
            Optimizer::Sharded(o) => o.load_state(tensors, steps),
        }
    }
}

/// AdamW with its state sharded over the ranks (ZeRO-1 or ZeRO-2).
pub struct ShardedAdamW {
    sharding: Sharding,
    names: Vec<String>,
    /// The model's parameters, whole on every rank, of kind `kind`.
    params: Vec<Tensor>,
    kind: Kind,
    buckets: Vec<Bucket>,
    config: OptimConfig,
    steps: i64,
    rank: i64,
}

/// One bucket's slice of the state.
struct Bucket {
    /// Indices of its parameters.
    members: Vec<usize>,
    /// Elements of its parameters.
    numel: i64,
    /// Elements of each rank's slice.
    shard: i64,
    master: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// The slice of the summed gradients (f32).
    grad: Tensor,
}

impl ShardedAdamW {
    /// Shards the optimiser of the f32 `params` (identical on every rank) over `parallel`'s
    /// ranks: each keeps f32 master weights of its slices, then the parameters are lowered to
    /// `kind` in place.
    pub fn new(
        params: Vec<(String, Tensor)>,
        config: OptimConfig,
        kind: Kind,
        sharding: Sharding,
        parallel: &DataParallel,
    ) -> Self {
        let (names, params): (Vec<String>, Vec<Tensor>) = params.into_iter().unzip();
        let group = parallel.group();
        let (rank, world) = (group.rank() as i64, group.world_size() as i64);
        let buckets = tch::no_grad(|| {
            parallel
                .buckets(&params)
                .into_iter()
                .map(|members| {
                    let numel = members.iter().map(|&i| params[i].numel() as i64).sum::<i64>();
                    let shard = (numel + world - 1) / world;
                    let flat = padded(&flatten(&params, &members).to_kind(Kind::Float), shard * world);
                    let master = flat.narrow(0, rank * shard, shard).copy();
                    Bucket {
                        members,
                        numel,
                        shard,
                        exp_avg: master.zeros_like(),
                        exp_avg_sq: master.zeros_like(),
                        grad: master.zeros_like(),
                        master,
                    }
                })
                .collect()
        });
        if kind != Kind::Float {
            tch::no_grad(|| {
                for p in &params {
                    let mut p = p.shallow_clone();
                    let lowered = p.to_kind(kind);
                    p.set_data(&lowered);
                }
            });
        }
        ShardedAdamW { sharding, names, params, kind, buckets, config, steps: 0, rank }
    }

    fn zero_grad(&mut self) {
        for p in &self.params {
            kart_torch::grad::clear(p);
        }
        for b in &mut self.buckets {
            let _ = b.grad.zero_();
        }
    }

    /// Reduce-scatters the parameters' gradients (zeros where a rank computed none) into the
    /// buckets' slices, adding to them, and drops the full gradients.
    fn reduce(&mut self, parallel: &DataParallel) -> Result<(), DistError> {
        let world = parallel.group().world_size() as i64;
        tch::no_grad(|| {
            let grads: Vec<Tensor> = self
                .params
                .iter()
                .map(|p| match p.grad() {
                    g if g.defined() => g,
                    _ => p.detach().zeros_like(),
                })
                .collect();
            for b in &mut self.buckets {
                let flat = padded(&flatten(&grads, &b.members), b.shard * world);
                let mut mine = Tensor::zeros([b.shard], (flat.kind(), flat.device()));
                parallel.group().reduce_scatter(&mut mine, &flat, ReduceOp::Sum)?;
                let _ = b.grad.g_add_(&mine.to_kind(Kind::Float));
            }
            Ok::<_, DistError>(())
        })?;
        for p in &self.params {
            kart_torch::grad::clear(p);
        }
        Ok(())
    }

    fn step(&mut self, parallel: &DataParallel, lr: f64) -> Result<f64, DistError> {
        if self.sharding == Sharding::Optimizer {
            self.reduce(parallel)?;
        }
        let mut squares =
            [self.buckets.iter().map(|b| b.grad.square().sum(Kind::Double).double_value(&[])).sum()];
        parallel.sum(&mut squares)?;
        let norm = squares[0].sqrt();
        let Some(scale) = clip_scale(norm, self.config.grad_clip) else { return Ok(norm) };
        self.steps += 1;
        let update = Update::new(&self.config, lr, self.steps, scale);
        let world = parallel.group().world_size() as i64;
        tch::no_grad(|| {
            for b in &mut self.buckets {
                update.apply(&mut b.master, &b.grad, &mut b.exp_avg, &mut b.exp_avg_sq);
                let whole = gather(parallel, &b.master.to_kind(self.kind), b.shard * world)?;
                unflatten(&whole.narrow(0, 0, b.numel), &self.params, &b.members, |p, v| {
                    p.copy_(v);
                });
            }
            Ok::<_, DistError>(())
        })?;
        Ok(norm)
    }

    /// The state gathered whole, under [`AdamW::state`]'s names.
    fn state(&self, parallel: &DataParallel) -> Result<Vec<(String, Tensor)>, DistError> {
        let world = parallel.group().world_size() as i64;
        let mut named = Vec::new();
        tch::no_grad(|| {
            for b in &self.buckets {
                let mut parts = vec![("exp_avg", &b.exp_avg), ("exp_avg_sq", &b.exp_avg_sq)];
                if self.kind != Kind::Float {
                    parts.push(("master", &b.master));
                }
                for (suffix, slice) in parts {
                    let whole = gather(parallel, slice, b.shard * world)?;
                    let mut at = 0;
                    for &i in &b.members {
                        let n = self.params[i].numel() as i64;
                        let value = whole.narrow(0, at, n).view(self.params[i].size().as_slice()).copy();
                        named.push((format!("{}.{suffix}", self.names[i]), value));
                        at += n;
                    }
                }
            }
            Ok::<_, DistError>(())
        })?;
        Ok(named)
    }

    /// Takes this rank's slices of a whole state. f32 parameters are their own masters (the
    /// policy was loaded from the same checkpoint).
    fn load_state(&mut self, tensors: Vec<(String, Tensor)>, steps: i64) -> Result<(), StateError> {
        let mut state = NamedState::new(tensors);
        let ShardedAdamW { names, params, kind, buckets, rank, .. } = self;
        tch::no_grad(|| {
            for b in buckets.iter_mut() {
                let mut take = |suffix: &str| -> Result<Tensor, StateError> {
                    let parts = b
                        .members
                        .iter()
                        .map(|&i| {
                            Ok(state.take(&format!("{}.{suffix}", names[i]), &params[i])?.reshape([-1]))
                        })
                        .collect::<Result<Vec<_>, StateError>>()?;
                    Ok(slice_of(&Tensor::cat(&parts, 0), b.shard, *rank))
                };
                let (exp_avg, exp_avg_sq) = (take("exp_avg")?, take("exp_avg_sq")?);
                let master = match *kind {
                    Kind::Float => {
                        slice_of(&flatten(params, &b.members).to_kind(Kind::Float), b.shard, *rank)
                    }
                    _ => take("master")?,
                };
                (b.exp_avg, b.exp_avg_sq, b.master) = (exp_avg, exp_avg_sq, master);
            }
            Ok::<_, StateError>(())
        })?;
        state.finish()?;
        self.steps = steps;
        Ok(())
    }
}

/// Every rank's `slice`, in rank order, `len` elements.
fn gather(parallel: &DataParallel, slice: &Tensor, len: i64) -> Result<Tensor, DistError> {
    let mut whole = Tensor::zeros([len], (slice.kind(), slice.device()));
    parallel.group().all_gather(&mut whole, slice)?;
    Ok(whole)
}

/// `flat` with zeros appended up to `len` elements.
fn padded(flat: &Tensor, len: i64) -> Tensor {
    let missing = len - flat.numel() as i64;
    match missing {
        0 => flat.shallow_clone(),
        _ => Tensor::cat(&[flat.shallow_clone(), Tensor::zeros([missing], (flat.kind(), flat.device()))], 0),
    }
}

/// Rank `rank`'s slice of `shard` elements of the flat `whole` (zeros past its end).
fn slice_of(whole: &Tensor, shard: i64, rank: i64) -> Tensor {
    let len = (rank + 1) * shard;
    padded(whole, len.max(whole.numel() as i64)).narrow(0, rank * shard, shard).copy()
}
