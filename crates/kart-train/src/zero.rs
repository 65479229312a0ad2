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
//!
//! `full` (FSDP) shards the decoder layers' parameters too: each layer is a bucket of its own
//! whose slices a [`LayerShards`] gathers into the layer only while it runs and whose gradients
//! it reduce-scatters as soon as the layer's backward pass is done; the other parameters
//! (embeddings, final norm, LM head, a critic's value head) stay whole and are handled as with
//! `gradients`.

use super::data_parallel::{DataParallel, flatten, unflatten};
use super::layer_shards::{Fault, LayerShard, LayerShards, layer_members};
use super::optim::{AdamW, NamedState, StateError, Update, clip_scale};
use kart_core::config::memory::Sharding;
use kart_core::config::train::OptimConfig;
use kart_torch::{DistError, ProcessGroup, ReduceOp};
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
        matches!(self, Optimizer::Sharded(o) if o.sharding != Sharding::Optimizer)
    }

    /// After a micro-batch's backward pass: ZeRO-2 (and `full`, for the parameters outside the
    /// decoder layers) reduce-scatters the gradients into this rank's slice and drops them.
    pub fn after_micro_batch(&mut self, parallel: Option<&DataParallel>) -> Result<(), DistError> {
        match (self, parallel) {
            (Optimizer::Sharded(o), Some(p)) if o.sharding != Sharding::Optimizer => o.reduce(p),
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

/// AdamW with its state sharded over the ranks (ZeRO-1, ZeRO-2, or with `full` the decoder
/// layers' parameters too).
pub struct ShardedAdamW {
    sharding: Sharding,
    names: Vec<String>,
    /// The model's parameters, of kind `kind`: whole on every rank, but for `full` the decoder
    /// layers', which are empty unless gathered.
    params: Vec<Tensor>,
    shapes: Vec<Vec<i64>>,
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
    /// Whether its parameters stay whole on every rank (all but `full`'s decoder layers).
    resident: bool,
}

impl ShardedAdamW {
    /// Shards the optimiser of the f32 `params` (identical on every rank) over `parallel`'s
    /// ranks: each keeps f32 master weights of its slices, then the parameters are lowered to
    /// `kind` in place. With `full`, each decoder layer (`model.layers.{i}.…`) is a bucket of its
    /// own, to be handed to [`Self::layer_shards`].
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
        let layers = match sharding {
            Sharding::Full => layer_members(&names),
            _ => Vec::new(),
        };
        let in_layers: std::collections::HashSet<usize> = layers.iter().flatten().copied().collect();
        let rest: Vec<usize> = (0..params.len()).filter(|i| !in_layers.contains(i)).collect();
        let rest_params: Vec<Tensor> = rest.iter().map(|&i| params[i].shallow_clone()).collect();
        let resident =
            parallel.buckets(&rest_params).into_iter().map(|b| b.iter().map(|&j| rest[j]).collect());
        let members = resident.map(|m| (m, true)).chain(layers.into_iter().map(|m| (m, false)));
        let buckets = tch::no_grad(|| {
            members
                .map(|(members, resident)| {
                    let numel = members.iter().map(|&i: &usize| params[i].numel() as i64).sum::<i64>();
                    let shard = (numel + world - 1) / world;
                    let master = slice_of(&flatten(&params, &members).to_kind(Kind::Float), shard, rank);
                    Bucket {
                        members,
                        numel,
                        shard,
                        exp_avg: master.zeros_like(),
                        exp_avg_sq: master.zeros_like(),
                        grad: master.zeros_like(),
                        master,
                        resident,
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
        let shapes = params.iter().map(Tensor::size).collect();
        ShardedAdamW { sharding, names, params, shapes, kind, buckets, config, steps: 0, rank }
    }

    /// The decoder layers' slices (`full`), for the model's [`LayerShards`] over `group` (a handle
    /// on the optimiser's group): it gathers the master weights and sums the gradients this
    /// optimiser updates. The layers are released.
    pub fn layer_shards(&self, group: ProcessGroup, fault: Fault) -> LayerShards {
        let layers = self
            .buckets
            .iter()
            .filter(|b| !b.resident)
            .map(|b| LayerShard {
                params: b.members.iter().map(|&i| self.params[i].shallow_clone()).collect(),
                shapes: b.members.iter().map(|&i| self.shapes[i].clone()).collect(),
                numel: b.numel,
                shard: b.shard,
                weights: b.master.shallow_clone(),
                grad: Some(b.grad.shallow_clone()),
            })
            .collect();
        LayerShards::new(group, layers, self.kind, fault)
    }

    fn zero_grad(&mut self) {
        for p in &self.params {
            kart_torch::grad::clear(p);
        }
        for b in &mut self.buckets {
            let _ = b.grad.zero_();
        }
    }

    /// Reduce-scatters the gradients of the resident parameters (zeros where a rank computed
    /// none) into the buckets' slices, adding to them, and drops the full gradients.
    fn reduce(&mut self, parallel: &DataParallel) -> Result<(), DistError> {
        for b in self.buckets.iter().filter(|b| b.resident) {
            let grads = Gradients { params: &self.params, shapes: &self.shapes, kind: self.kind };
            grads.reduce_scatter(parallel.group(), &b.members, b.shard, &b.grad)?;
        }
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
                if !b.resident {
                    continue;
                }
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
                        let n = self.shapes[i].iter().product::<i64>();
                        let value = whole.narrow(0, at, n).view(self.shapes[i].as_slice()).copy();
                        named.push((format!("{}.{suffix}", self.names[i]), value));
                        at += n;
                    }
                }
            }
            Ok::<_, DistError>(())
        })?;
        Ok(named)
    }

    /// Takes this rank's slices of a whole state, in place (a model's [`LayerShards`] shares
    /// them). f32 parameters are their own masters: those the optimiser was built from (loaded
    /// from the same checkpoint).
    fn load_state(&mut self, tensors: Vec<(String, Tensor)>, steps: i64) -> Result<(), StateError> {
        let mut state = NamedState::new(tensors);
        let ShardedAdamW { names, shapes, kind, buckets, rank, .. } = self;
        tch::no_grad(|| {
            for b in buckets.iter_mut() {
                let device = b.master.device();
                let mut take = |suffix: &str| -> Result<Tensor, StateError> {
                    let parts = b
                        .members
                        .iter()
                        .map(|&i| {
                            let name = format!("{}.{suffix}", names[i]);
                            Ok(state.take(&name, &shapes[i], device)?.reshape([-1]))
                        })
                        .collect::<Result<Vec<_>, StateError>>()?;
                    Ok(slice_of(&Tensor::cat(&parts, 0), b.shard, *rank))
                };
                let (exp_avg, exp_avg_sq) = (take("exp_avg")?, take("exp_avg_sq")?);
                if *kind != Kind::Float {
                    b.master.copy_(&take("master")?);
                }
                b.exp_avg.copy_(&exp_avg);
                b.exp_avg_sq.copy_(&exp_avg_sq);
            }
            Ok::<_, StateError>(())
        })?;
        state.finish()?;
        self.steps = steps;
        Ok(())
    }
}

/// The gradients of some parameters, for a reduce-scatter.
pub(crate) struct Gradients<'a> {
    pub(crate) params: &'a [Tensor],
    /// The parameters' shapes (a released layer's parameters are empty).
    pub(crate) shapes: &'a [Vec<i64>],
    /// The parameters' kind.
    pub(crate) kind: Kind,
}

impl Gradients<'_> {
    /// Reduce-scatters the flattened gradients of `params[members]` (zeros where none was
    /// computed), padded to a multiple of the ranks, over `group`, and adds this rank's slice of
    /// `shard` elements to the f32 `sum`.
    pub(crate) fn reduce_scatter(
        &self,
        group: &ProcessGroup,
        members: &[usize],
        shard: i64,
        sum: &Tensor,
    ) -> Result<(), DistError> {
        tch::no_grad(|| {
            let grads: Vec<Tensor> = members
                .iter()
                .map(|&i| match self.params[i].grad() {
                    g if g.defined() => g,
                    _ => Tensor::zeros(self.shapes[i].as_slice(), (self.kind, self.params[i].device())),
                })
                .collect();
            let all: Vec<usize> = (0..grads.len()).collect();
            let flat = padded(&flatten(&grads, &all), shard * group.world_size() as i64);
            let mut mine = Tensor::zeros([shard], (flat.kind(), flat.device()));
            group.reduce_scatter(&mut mine, &flat, ReduceOp::Sum)?;
            let _ = sum.shallow_clone().g_add_(&mine.to_kind(Kind::Float));
            Ok(())
        })
    }
}

/// Every rank's `slice`, in rank order, `len` elements.
fn gather(parallel: &DataParallel, slice: &Tensor, len: i64) -> Result<Tensor, DistError> {
    let mut whole = Tensor::zeros([len], (slice.kind(), slice.device()));
    parallel.group().all_gather(&mut whole, slice)?;
    Ok(whole)
}

/// `flat` with zeros appended up to `len` elements.
pub(crate) fn padded(flat: &Tensor, len: i64) -> Tensor {
    let missing = len - flat.numel() as i64;
    match missing {
        0 => flat.shallow_clone(),
        _ => Tensor::cat(&[flat.shallow_clone(), Tensor::zeros([missing], (flat.kind(), flat.device()))], 0),
    }
}

/// Rank `rank`'s slice of `shard` elements of the flat `whole` (zeros past its end).
pub(crate) fn slice_of(whole: &Tensor, shard: i64, rank: i64) -> Tensor {
    let len = (rank + 1) * shard;
    padded(whole, len.max(whole.numel() as i64)).narrow(0, rank * shard, shard).copy()
}
