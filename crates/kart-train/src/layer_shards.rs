//! Fully sharded decoder layers (`sharding: full`, FSDP's full sharding): each rank keeps a slice
//! of every layer's flattened weights; a layer is all-gathered just before it runs and dropped
//! right after ([`Residency`]), so a rank holds the whole weights of one layer at a time. In the
//! recomputed backward pass of activation checkpointing, the layer's gradients are
//! reduce-scattered into the rank's f32 slice as soon as its backward pass is done, and dropped.
//!
//! A trained model's slices are its optimiser's f32 master weights and gradient sums (the same
//! tensors, updated in place by [`ShardedAdamW`](super::zero::ShardedAdamW)); gathered, they are
//! lowered to the run's parameter kind. A frozen model (the reference policy) keeps its slices in
//! its own kind.
//!
//! A collective that fails inside a pass cannot return its error through the model's passes: it
//! is kept in a [`Fault`], the layer gets zeros of its shape so the pass finishes, and the learner
//! returns the error once the pass is over.

use super::data_parallel::flatten;
use super::zero::{Gradients, slice_of};
use kart_model::{CausalLm, Residency};
use kart_torch::{DistError, ProcessGroup};
use std::sync::{Arc, Mutex};
use tch::{Kind, Tensor};

/// The first collective error of a sharded pass, kept until the learner looks.
#[derive(Debug, Clone, Default)]
pub struct Fault(Arc<Mutex<Option<DistError>>>);

impl Fault {
    fn record(&self, error: DistError) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(error);
    }

    fn failed(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The error recorded since the last check, if any.
    pub fn check(&self) -> Result<(), DistError> {
        match self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// One decoder layer's slice on this rank.
#[derive(Debug)]
pub(crate) struct LayerShard {
    /// The layer's parameters (the model's tensors), empty while released.
    pub(crate) params: Vec<Tensor>,
    pub(crate) shapes: Vec<Vec<i64>>,
    /// Elements of the layer's flattened weights.
    pub(crate) numel: i64,
    /// Elements of each rank's slice (the flattened weights padded to a multiple of the ranks).
    pub(crate) shard: i64,
    /// This rank's slice of the weights: f32 masters of a trained model, else of the model's kind.
    pub(crate) weights: Tensor,
    /// This rank's slice of the summed gradients (f32) of a trained model.
    pub(crate) grad: Option<Tensor>,
}

/// A model's decoder layers sharded over the ranks of `group`.
#[derive(Debug)]
pub struct LayerShards {
    group: ProcessGroup,
    layers: Vec<LayerShard>,
    /// The kind the gathered weights take.
    kind: Kind,
    fault: Fault,
}

/// The parameter indices of each decoder layer among `names` (Hugging Face names,
/// `model.layers.{i}.…`), by layer.
pub(crate) fn layer_members(names: &[String]) -> Vec<Vec<usize>> {
    let mut layers: Vec<Vec<usize>> = Vec::new();
    for (at, name) in names.iter().enumerate() {
        let Some(i) = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        if layers.len() <= i {
            layers.resize(i + 1, Vec::new());
        }
        layers[i].push(at);
    }
    layers
}

impl LayerShards {
    /// Shards over `group` the layers a trained model's optimiser already holds slices of.
    pub(crate) fn new(group: ProcessGroup, layers: Vec<LayerShard>, kind: Kind, fault: Fault) -> Self {
        let shards = LayerShards { group, layers, kind, fault };
        for i in 0..shards.layers.len() {
            shards.release(i);
        }
        shards
    }

    /// Shards the frozen `model`'s layers over `group` (its parameters identical on every rank),
    /// each rank keeping its slice in the model's kind; the layers are released.
    pub fn frozen(model: &CausalLm, group: ProcessGroup, fault: Fault) -> Self {
        let (names, params): (Vec<String>, Vec<Tensor>) = model.named_tensors().into_iter().unzip();
        let (rank, world) = (group.rank() as i64, group.world_size() as i64);
        let layers = tch::no_grad(|| {
            layer_members(&names)
                .into_iter()
                .map(|members| {
                    let numel = members.iter().map(|&i| params[i].numel() as i64).sum::<i64>();
                    let shard = (numel + world - 1) / world;
                    LayerShard {
                        params: members.iter().map(|&i| params[i].shallow_clone()).collect(),
                        shapes: members.iter().map(|&i| params[i].size()).collect(),
                        numel,
                        shard,
                        weights: slice_of(&flatten(&params, &members), shard, rank),
                        grad: None,
                    }
                })
                .collect()
        });
        LayerShards::new(group, layers, model.kind(), fault)
    }

    /// Puts zeros of their shapes in layer `i`'s parameters (after a failed gathering).
    fn zeros(&self, i: usize) {
        for (p, shape) in self.layers[i].params.iter().zip(&self.layers[i].shapes) {
            p.shallow_clone().set_data(&Tensor::zeros(shape.as_slice(), (self.kind, p.device())));
        }
    }

    fn gather(&self, i: usize) -> Result<(), DistError> {
        let layer = &self.layers[i];
        let world = self.group.world_size() as i64;
        let mut whole = Tensor::zeros([layer.shard * world], (self.kind, layer.weights.device()));
        self.group.all_gather(&mut whole, &layer.weights.to_kind(self.kind))?;
        let mut at = 0;
        for (p, shape) in layer.params.iter().zip(&layer.shapes) {
            let n = shape.iter().product::<i64>();
            p.shallow_clone().set_data(&whole.narrow(0, at, n).view(shape.as_slice()));
            at += n;
        }
        debug_assert_eq!(at, layer.numel);
        Ok(())
    }

    fn reduce(&self, i: usize) -> Result<(), DistError> {
        let layer = &self.layers[i];
        let Some(sum) = &layer.grad else { return Ok(()) };
        let grads = Gradients { params: &layer.params, shapes: &layer.shapes, kind: self.kind };
        let all: Vec<usize> = (0..layer.params.len()).collect();
        grads.reduce_scatter(&self.group, &all, layer.shard, sum)
    }
}

impl Residency for LayerShards {
    fn fetch(&self, layer: usize) {
        if self.fault.failed() {
            return self.zeros(layer);
        }
        if let Err(e) = tch::no_grad(|| self.gather(layer)) {
            self.fault.record(e);
            self.zeros(layer);
        }
    }

    fn release(&self, layer: usize) {
        for p in &self.layers[layer].params {
            p.shallow_clone().set_data(&Tensor::empty([0], (self.kind, p.device())));
        }
    }

    fn backward_done(&self, layer: usize) {
        if !self.fault.failed()
            && let Err(e) = tch::no_grad(|| self.reduce(layer))
        {
            self.fault.record(e);
        }
        for p in &self.layers[layer].params {
            kart_torch::grad::clear(p);
        }
    }

    fn collective(&self) -> bool {
        true
    }
}
