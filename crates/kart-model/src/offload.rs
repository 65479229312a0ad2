//! Layer offloading for frozen models (the reference policy of the KL loss): the decoder layers'
//! weights live in CPU memory, and each layer's are copied to the model's device just before it
//! runs and dropped right after, so the device holds one layer's weights at a time (plus the
//! embeddings, final norm and head, which stay). Only for passes without gradients: a layer's
//! weights are gone from the device once it has run.

use crate::residency::Residency;
use crate::transformer::CausalLm;
use tch::{Device, Kind, Tensor};

/// The CPU copies of a model's decoder layers.
#[derive(Debug)]
pub(crate) struct Offload {
    /// Per layer: each parameter (the model's tensor) and its CPU copy.
    layers: Vec<Vec<(Tensor, Tensor)>>,
    device: Device,
    kind: Kind,
}

impl Offload {
    /// Moves the decoder layers of `model` to CPU memory (pinned when the model is on CUDA, so
    /// copies back are fast) and empties them on the device.
    pub(crate) fn new(model: &CausalLm) -> Offload {
        let (device, kind) = (model.device(), model.kind());
        let named = model.named_tensors();
        let layers = (0..model.config().num_hidden_layers)
            .map(|i| {
                let prefix = format!("model.layers.{i}.");
                named
                    .iter()
                    .filter(|(name, _)| name.starts_with(&prefix))
                    .map(|(_, param)| {
                        let cpu = param.detach().to_device(Device::Cpu).copy();
                        let cpu = if device.is_cuda() { cpu.pin_memory(device) } else { cpu };
                        (param.shallow_clone(), cpu)
                    })
                    .collect()
            })
            .collect();
        let offload = Offload { layers, device, kind };
        for i in 0..offload.layers.len() {
            offload.release(i);
        }
        offload
    }
}

impl Residency for Offload {
    /// Puts layer `i`'s weights back on the device.
    fn fetch(&self, i: usize) {
        tch::no_grad(|| {
            for (param, cpu) in &self.layers[i] {
                param.shallow_clone().set_data(&cpu.to_device(self.device));
            }
        });
    }

    /// Drops layer `i`'s weights from the device.
    fn release(&self, i: usize) {
        for (param, _) in &self.layers[i] {
            param.shallow_clone().set_data(&Tensor::empty([0], (self.kind, self.device)));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::transformer::{CausalLm, Layout};
    use tch::{Device, Kind, Tensor};

    #[test]
    fn an_offloaded_model_computes_the_same_and_keeps_no_layer_between_passes() {
        let dir = kart_testing::model("tiny-qwen2");
        let resident = CausalLm::load(&dir, Device::Cpu).unwrap();
        let mut offloaded = CausalLm::load(&dir, Device::Cpu).unwrap();
        offloaded.offload_layers();
        let layer_numel = |m: &CausalLm| -> i64 {
            m.named_tensors()
                .iter()
                .filter(|(n, _)| n.starts_with("model.layers."))
                .map(|(_, t)| t.numel() as i64)
                .sum()
        };
        assert_eq!(layer_numel(&offloaded), 0, "no layer weights on the device");
        assert!(layer_numel(&resident) > 0);
        let ids = Tensor::from_slice(&[5i64, 9, 17, 33, 2, 8, 40, 41, 42, 0, 0, 0]).view([2, 6]);
        let positions = Tensor::arange(6, (Kind::Int64, Device::Cpu)).view([1, 6]).expand([2, 6], true);
        tch::no_grad(|| {
            for layout in [Layout::Padded { valid: Some(ids.ne(0)) }, Layout::Packed { lengths: vec![6, 6] }]
            {
                let (ids, positions) = match layout {
                    Layout::Packed { .. } => (ids.view([1, 12]), positions.reshape([1, 12])),
                    _ => (ids.shallow_clone(), positions.shallow_clone()),
                };
                let a = resident.forward_layout(&ids, &positions, &layout);
                let b = offloaded.forward_layout(&ids, &positions, &layout);
                assert!(a.equal(&b), "{layout:?}");
            }
            let mut cache = offloaded.new_cache(2);
            let a = resident.forward(&ids, &positions, None, None);
            let b = offloaded.forward(&ids, &positions, None, Some(&mut cache));
            assert!(a.equal(&b), "the cached path fetches too");
        });
        assert_eq!(layer_numel(&offloaded), 0, "released after every pass");
    }
}
