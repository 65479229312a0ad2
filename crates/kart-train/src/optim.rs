//! AdamW with decoupled weight decay (PyTorch's `torch.optim.AdamW` update), global gradient-norm
//! clipping and the learning-rate schedule, with its state exposed as named tensors so checkpoints
//! hold it.
//!
//! Parameters that are not f32 (bf16 on CUDA) get f32 master copies: the update runs in f32 and
//! is rounded into the parameter, as mixed-precision trainers do.

use kart_core::config::train::{OptimConfig, Schedule};
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// One parameter with its optimiser state.
struct Slot {
    name: String,
    param: Tensor,
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// AdamW over a set of named parameters.
pub struct AdamW {
    slots: Vec<Slot>,
    config: OptimConfig,
    steps: i64,
}

/// A checkpointed state that does not fit the parameters.
#[derive(Debug, thiserror::Error)]
#[error("optimizer state: {0}")]
pub struct StateError(pub(crate) String);

impl AdamW {
    /// An optimiser of `params` (trainable tensors, named) with `config`.
    pub fn new(params: Vec<(String, Tensor)>, config: OptimConfig) -> Self {
        let slots = params
            .into_iter()
            .map(|(name, param)| {
                let master = (param.kind() != Kind::Float).then(|| param.detach().to_kind(Kind::Float));
                let zeros = Tensor::zeros_like(&param.detach().to_kind(Kind::Float));
                Slot { name, param, master, exp_avg: zeros.zeros_like(), exp_avg_sq: zeros }
            })
            .collect();
        AdamW { slots, config, steps: 0 }
    }

    /// An optimiser of f32 `params` that keeps their f32 values as master copies and lowers the
    /// parameters themselves (the model's tensors, in place) to `kind`: the updates run on the
    /// masters, which start from the exact f32 weights rather than from their rounding.
    pub fn mixed(params: Vec<(String, Tensor)>, config: OptimConfig, kind: Kind) -> Self {
        let mut optimizer = Self::new(params, config);
        if kind != Kind::Float {
            tch::no_grad(|| {
                for slot in &mut optimizer.slots {
                    slot.master = Some(slot.param.detach().to_kind(Kind::Float).copy());
                    let lowered = slot.param.to_kind(kind);
                    slot.param.set_data(&lowered);
                }
            });
        }
        optimizer
    }

    /// The parameters it updates, in order.
    pub fn parameters(&self) -> Vec<Tensor> {
        self.slots.iter().map(|s| s.param.shallow_clone()).collect()
    }

    /// Updates taken so far.
    pub fn steps(&self) -> i64 {
        self.steps
    }

    /// Clears the gradients of all parameters.
    pub fn zero_grad(&mut self) {
        for slot in &mut self.slots {
            let mut grad = slot.param.grad();
            if grad.defined() {
                let _ = grad.detach_().zero_();
            }
        }
    }

    /// The global L2 norm of the gradients.
    pub fn grad_norm(&self) -> f64 {
        tch::no_grad(|| {
            self.slots
                .iter()
                .map(|s| s.param.grad())
                .filter(Tensor::defined)
                .map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[]))
                .sum::<f64>()
                .sqrt()
        })
    }

    /// Clips the gradients to the configured global norm and applies one AdamW update at `lr`.
    /// Returns the gradient norm before clipping; a non-finite norm skips the update.
    pub fn step(&mut self, lr: f64) -> f64 {
        let norm = self.grad_norm();
        let Some(scale) = clip_scale(norm, self.config.grad_clip) else { return norm };
        self.steps += 1;
        let update = Update::new(&self.config, lr, self.steps, scale);
        tch::no_grad(|| {
            for slot in &mut self.slots {
                let grad = slot.param.grad();
                if !grad.defined() {
                    continue;
                }
                let mut param = match &slot.master {
                    Some(master) => master.shallow_clone(),
                    None => slot.param.shallow_clone(),
                };
                update.apply(&mut param, &grad, &mut slot.exp_avg, &mut slot.exp_avg_sq);
                if let Some(master) = &slot.master {
                    slot.param.copy_(master);
                }
            }
        });
        norm
    }

    /// The state as named tensors (`{name}.exp_avg`, `{name}.exp_avg_sq`, `{name}.master`) plus the
    /// step count, for a checkpoint.
    pub fn state(&self) -> (Vec<(String, Tensor)>, i64) {
        let mut named = Vec::new();
        for s in &self.slots {
            named.push((format!("{}.exp_avg", s.name), s.exp_avg.shallow_clone()));
            named.push((format!("{}.exp_avg_sq", s.name), s.exp_avg_sq.shallow_clone()));
            if let Some(m) = &s.master {
                named.push((format!("{}.master", s.name), m.shallow_clone()));
            }
        }
        (named, self.steps)
    }

    /// Restores a state written by [`Self::state`].
    pub fn load_state(&mut self, tensors: Vec<(String, Tensor)>, steps: i64) -> Result<(), StateError> {
        let mut state = NamedState::new(tensors);
        tch::no_grad(|| {
            for s in &mut self.slots {
                let (shape, device) = (s.param.size(), s.param.device());
                s.exp_avg = state.take(&format!("{}.exp_avg", s.name), &shape, device)?;
                s.exp_avg_sq = state.take(&format!("{}.exp_avg_sq", s.name), &shape, device)?;
                if s.master.is_some() {
                    s.master = Some(state.take(&format!("{}.master", s.name), &shape, device)?);
                }
            }
            Ok::<_, StateError>(())
        })?;
        state.finish()?;
        self.steps = steps;
        Ok(())
    }
}

/// A checkpointed optimiser state by name, taken tensor by tensor.
pub(crate) struct NamedState(HashMap<String, Tensor>);

impl NamedState {
    pub(crate) fn new(tensors: Vec<(String, Tensor)>) -> Self {
        NamedState(tensors.into_iter().collect())
    }

    /// The f32 tensor `name`, of shape `shape`, on `device`.
    pub(crate) fn take(&mut self, name: &str, shape: &[i64], device: Device) -> Result<Tensor, StateError> {
        let t = self.0.remove(name).ok_or_else(|| StateError(format!("`{name}` is missing")))?;
        if t.size() != shape {
            return Err(StateError(format!("`{name}` has shape {:?}, expected {shape:?}", t.size())));
        }
        Ok(t.to_kind(Kind::Float).to_device(device))
    }

    /// An error for a tensor nothing took.
    pub(crate) fn finish(self) -> Result<(), StateError> {
        match self.0.keys().next() {
            Some(extra) => Err(StateError(format!("`{extra}` belongs to no parameter"))),
            None => Ok(()),
        }
    }
}

/// The factor that brings gradients of global norm `norm` within `clip` (0: no clipping); `None`
/// for a non-finite norm, whose update is skipped.
pub fn clip_scale(norm: f64, clip: f64) -> Option<f64> {
    if !norm.is_finite() {
        tracing::warn!(grad_norm = norm, "non-finite gradient norm; update skipped");
        return None;
    }
    Some(if clip > 0.0 && norm > clip { clip / (norm + 1e-6) } else { 1.0 })
}

/// One AdamW update (PyTorch's `torch.optim.AdamW`): the element-wise arithmetic shared by
/// [`AdamW`] and the sharded optimiser.
pub(crate) struct Update {
    lr: f64,
    scale: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    decay: f64,
    bias1: f64,
    bias2_sqrt: f64,
}

impl Update {
    /// The update at `lr` of step `step` (1-based), gradients multiplied by `scale`.
    pub(crate) fn new(config: &OptimConfig, lr: f64, step: i64, scale: f64) -> Self {
        let (b1, b2) = (config.beta1, config.beta2);
        Update {
            lr,
            scale,
            b1,
            b2,
            eps: config.eps,
            decay: 1.0 - lr * config.weight_decay,
            bias1: 1.0 - b1.powi(step as i32),
            bias2_sqrt: (1.0 - b2.powi(step as i32)).sqrt(),
        }
    }

    /// Updates the f32 `param` in place from `grad` (any kind) and its moments.
    pub(crate) fn apply(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        exp_avg: &mut Tensor,
        exp_avg_sq: &mut Tensor,
    ) {
        let grad = grad.to_kind(Kind::Float) * self.scale;
        let _ = param.g_mul_scalar_(self.decay);
        let _ = exp_avg.g_mul_scalar_(self.b1).g_add_(&(&grad * (1.0 - self.b1)));
        let _ = exp_avg_sq.g_mul_scalar_(self.b2).g_add_(&(grad.square() * (1.0 - self.b2)));
        let denom = exp_avg_sq.sqrt() / self.bias2_sqrt + self.eps;
        let _ = param.g_sub_(&(&*exp_avg / denom * (self.lr / self.bias1)));
    }
}

/// The learning rate at `step` (0-based) of `total` steps: linear warm-up over
/// `warmup_ratio * total` steps, then constant or cosine decay to `min_lr_ratio * lr`.
pub fn learning_rate(config: &OptimConfig, step: u64, total: u64) -> f64 {
    let warmup = (config.warmup_ratio * total as f64).floor() as u64;
    if step < warmup {
        return config.lr * (step + 1) as f64 / warmup as f64;
    }
    match config.schedule {
        Schedule::Constant => config.lr,
        Schedule::Cosine => {
            let span = total.saturating_sub(warmup).max(1) as f64;
            let progress = ((step - warmup) as f64 / span).min(1.0);
            let floor = config.lr * config.min_lr_ratio;
            floor + (config.lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_adamw_formula() {
        // One parameter, two steps, against the update written out by hand (PyTorch's AdamW).
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let config = OptimConfig { lr: 0.1, weight_decay: 0.01, grad_clip: 0.0, ..OptimConfig::default() };
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], config.clone());
        let (mut expect, mut m, mut v) = ([1.0f64, -2.0], [0.0f64; 2], [0.0f64; 2]);
        for step in 1..=2 {
            opt.zero_grad();
            (&p * &p).sum(Kind::Float).backward();
            opt.step(0.1);
            for i in 0..2 {
                let g = 2.0 * expect[i];
                expect[i] *= 1.0 - 0.1 * 0.01;
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.999 * v[i] + 0.001 * g * g;
                let denom = (v[i].sqrt() / (1.0 - 0.999f64.powi(step)).sqrt()) + 1e-8;
                expect[i] -= 0.1 / (1.0 - 0.9f64.powi(step)) * m[i] / denom;
            }
        }
        let got = Vec::<f32>::try_from(&p).unwrap();
        for i in 0..2 {
            assert!((f64::from(got[i]) - expect[i]).abs() < 1e-5, "{got:?} vs {expect:?}");
        }
    }

    #[test]
    fn clipping_bounds_the_update_and_state_round_trips() {
        let p = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        let config = OptimConfig { grad_clip: 1.0, ..OptimConfig::default() };
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], config.clone());
        (&p * 1.0).sum(Kind::Float).backward();
        let _ = p.grad().g_mul_scalar_(100.0);
        let norm = opt.step(1e-3);
        assert!((norm - 100.0 * 2f64.sqrt()).abs() < 1e-3, "{norm}");
        let (state, steps) = opt.state();
        let q = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        let mut restored = AdamW::new(vec![("p".into(), q)], config);
        restored.load_state(state.iter().map(|(n, t)| (n.clone(), t.copy())).collect(), steps).unwrap();
        assert_eq!(restored.steps(), 1);
        let err = restored.load_state(vec![], 1).err().unwrap().to_string();
        assert!(err.contains("p.exp_avg"), "{err}");
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let c = OptimConfig {
            lr: 1.0,
            warmup_ratio: 0.1,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            ..OptimConfig::default()
        };
        assert!((learning_rate(&c, 0, 100) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&c, 9, 100) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&c, 10, 100) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&c, 100, 100) - 0.1).abs() < 1e-12);
        let constant = OptimConfig { lr: 2.0, ..OptimConfig::default() };
        assert_eq!(learning_rate(&constant, 50, 100), 2.0);
    }
}
