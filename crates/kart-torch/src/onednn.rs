//! oneDNN's CPU linear layer over weights reordered once.
//!
//! A CPU matrix product reorders ("packs") its weight matrix into the layout its kernels read on
//! every call; for the few rows of a decoding step that reordering costs as much as the product.
//! PyTorch registers the operators Inductor uses to do it once for inference
//! (`mkldnn::_reorder_linear_weight`, `mkldnn::_linear_pointwise`); this module reaches them
//! through the dispatcher, since tch does not wrap them. f32 (and bf16) tensors on the CPU only,
//! and without gradients: the packed weight is a copy, and the product has no backward.

use crate::ffi;
use std::ffi::c_void;
use tch::Tensor;

/// A linear layer's weight `(out, in)` in oneDNN's layout: a copy, which does not follow later
/// changes of the weight it was made from.
#[derive(Debug)]
pub struct PackedWeight(Tensor);

impl PackedWeight {
    /// Reorders `weight` `(out, in)`; fails when this torch was built without oneDNN or the
    /// weight is not a CPU tensor of a kind oneDNN multiplies.
    pub fn new(weight: &Tensor) -> Result<Self, String> {
        let weight = weight.detach().contiguous();
        let mut out = std::ptr::null_mut();
        // SAFETY: `weight` is a live at::Tensor; on success the shim hands back a new at::Tensor*
        // whose ownership passes to the returned Tensor.
        ffi::check(unsafe { ffi::kart_onednn_pack_linear(weight.as_ptr() as *mut c_void, &mut out) })?;
        Ok(PackedWeight(unsafe { Tensor::from_ptr(out as *mut _) }))
    }

    /// `input (..., in) W^T + bias`, a dense tensor `(..., out)`.
    pub fn linear(&self, input: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, String> {
        let input = input.contiguous();
        let bias = bias.map_or(std::ptr::null_mut(), |b| b.as_ptr() as *mut c_void);
        let mut out = std::ptr::null_mut();
        // SAFETY: as in `new`; `bias` is null or a live at::Tensor.
        ffi::check(unsafe {
            ffi::kart_onednn_linear(
                input.as_ptr() as *mut c_void,
                self.0.as_ptr() as *mut c_void,
                bias,
                &mut out,
            )
        })?;
        Ok(unsafe { Tensor::from_ptr(out as *mut _) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn packed_products_agree_with_linear_at_any_row_count() {
        tch::manual_seed(3);
        let weight = Tensor::randn([96, 64], (Kind::Float, Device::Cpu));
        let bias = Tensor::randn([96], (Kind::Float, Device::Cpu));
        let packed = PackedWeight::new(&weight).unwrap();
        for shape in [vec![1, 64], vec![32, 64], vec![3, 7, 64]] {
            let x = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu));
            for b in [None, Some(&bias)] {
                let ours = packed.linear(&x, b).unwrap();
                let plain = x.linear(&weight, b);
                assert_eq!(ours.size(), plain.size());
                let diff = (ours - plain).abs().max().double_value(&[]);
                assert!(diff < 1e-4, "{shape:?}, bias {}: {diff}", b.is_some());
            }
        }
    }

    #[test]
    fn the_packed_copy_keeps_the_weight_it_was_made_from() {
        let mut weight = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        let packed = PackedWeight::new(&weight).unwrap();
        let _ = weight.fill_(2.0);
        let x = Tensor::ones([1, 4], (Kind::Float, Device::Cpu));
        assert_eq!(packed.linear(&x, None).unwrap().double_value(&[0, 0]), 4.0);
    }

    #[test]
    fn a_weight_of_the_wrong_shape_is_refused_with_a_message() {
        let vector = Tensor::ones([4], (Kind::Float, Device::Cpu));
        let error = PackedWeight::new(&vector)
            .and_then(|p| p.linear(&Tensor::ones([1, 4], (Kind::Float, Device::Cpu)), None))
            .unwrap_err();
        assert!(!error.is_empty());
    }
}
