//! Weights kept packed for oneDNN while generating on the CPU.
//!
//! A decoding step multiplies a few rows by every weight matrix, and a CPU matrix product packs its
//! weight into the layout its kernels read on every call: at batch 32 that packing costs about as
//! much as the product itself. Generation ([`Kernels::Prepacked`]) instead multiplies through
//! oneDNN by a copy packed once ([`kart_torch::onednn::PackedWeight`]). The copy follows its
//! weight: it is packed anew whenever the weight has changed since, whether replaced (another
//! storage, kind or shape) or written in place (loaded weights, an optimiser step), which
//! PyTorch's version counter records. Training and every pass with gradients keep
//! [`Kernels::Standard`].

use std::sync::{Mutex, Once};

use kart_torch::onednn::PackedWeight;
use tch::{Device, Kind, Tensor};

/// Which kernels a forward pass's linear layers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// `Tensor::linear`, with gradients where they are enabled.
    Standard,
    /// oneDNN over packed weights where it applies (f32 on the CPU, oneDNN built in, no gradient
    /// wanted), else as `Standard`.
    Prepacked,
}

/// The packed copy of one weight, made when first needed.
#[derive(Debug, Default)]
pub(crate) struct Prepacked(Mutex<Slot>);

#[derive(Debug, Default)]
enum Slot {
    #[default]
    Empty,
    Packed {
        of: Stamp,
        weight: PackedWeight,
    },
    /// Packing failed (a torch without oneDNN): the standard product from now on.
    Unavailable,
}

/// What identifies the state of a weight: its data, kind and shape, and how often it was written.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    data: usize,
    kind: Kind,
    size: Vec<i64>,
    version: i64,
}

impl Stamp {
    fn of(weight: &Tensor) -> Stamp {
        Stamp {
            data: weight.data_ptr() as usize,
            kind: weight.kind(),
            size: weight.size(),
            version: weight.internal_version(),
        }
    }
}

impl Prepacked {
    /// `x weight^T + bias` through the packed copy of `weight` (packed first when missing or
    /// stale); `None` where oneDNN does not apply: not f32 on the CPU, `x` needing a gradient, or
    /// no oneDNN in this torch.
    pub(crate) fn linear(&self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Option<Tensor> {
        let cpu_f32 = |t: &Tensor| t.device() == Device::Cpu && t.kind() == Kind::Float;
        if !cpu_f32(x) || !cpu_f32(weight) || x.requires_grad() {
            return None;
        }
        let mut slot = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let stamp = match &*slot {
            Slot::Unavailable => return None,
            Slot::Packed { of, .. } => Some(Stamp::of(weight)).filter(|stamp| stamp != of),
            Slot::Empty => Some(Stamp::of(weight)),
        };
        if let Some(stamp) = stamp {
            *slot = match PackedWeight::new(weight) {
                Ok(packed) => Slot::Packed { of: stamp, weight: packed },
                Err(error) => unavailable(&error),
            };
        }
        let Slot::Packed { weight: packed, .. } = &*slot else { return None };
        match packed.linear(x, bias) {
            Ok(y) => Some(y),
            Err(error) => {
                *slot = unavailable(&error);
                None
            }
        }
    }

    /// Whether a packed copy is held (for tests).
    #[cfg(test)]
    pub(crate) fn is_packed(&self) -> bool {
        matches!(*self.0.lock().unwrap(), Slot::Packed { .. })
    }
}

/// Gives up on oneDNN for one weight, saying why once per process.
fn unavailable(error: &str) -> Slot {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| tracing::warn!(%error, "oneDNN's packed linear layer is unavailable; generating with the standard kernels"));
    Slot::Unavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &Tensor, b: &Tensor) -> bool {
        (a - b).abs().max().double_value(&[]) < 1e-5
    }

    #[test]
    fn the_copy_follows_writes_to_its_weight() {
        tch::manual_seed(1);
        let mut weight = Tensor::randn([48, 32], (Kind::Float, Device::Cpu));
        let x = Tensor::randn([5, 32], (Kind::Float, Device::Cpu));
        let packed = Prepacked::default();
        let y = packed.linear(&x, &weight, None).expect("f32 on the CPU");
        assert!(close(&y, &x.linear(&weight, None::<Tensor>)));
        // Written in place, as an optimiser step or loaded weights write it.
        tch::no_grad(|| weight.copy_(&Tensor::randn([48, 32], (Kind::Float, Device::Cpu))));
        let y = packed.linear(&x, &weight, None).unwrap();
        assert!(close(&y, &x.linear(&weight, None::<Tensor>)), "repacked after the write");
        let _ = weight.g_mul_scalar_(2.0);
        assert!(close(&packed.linear(&x, &weight, None).unwrap(), &x.linear(&weight, None::<Tensor>)));
        // Replaced by another tensor.
        let other = Tensor::randn([48, 32], (Kind::Float, Device::Cpu));
        assert!(close(&packed.linear(&x, &other, None).unwrap(), &x.linear(&other, None::<Tensor>)));
    }

    #[test]
    fn passes_that_need_gradients_or_another_kind_are_left_to_the_standard_product() {
        let weight = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        let packed = Prepacked::default();
        let x = Tensor::ones([1, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        assert!(packed.linear(&x, &weight, None).is_none());
        let x = Tensor::ones([1, 4], (Kind::Double, Device::Cpu));
        assert!(packed.linear(&x, &weight.to_kind(Kind::Double), None).is_none());
        assert!(!packed.is_packed(), "nothing was packed for them");
    }
}
