//! Activation checkpointing: a forward pass that keeps only each decoder layer's input, and a
//! backward pass that re-runs each layer (last first) with gradients on, feeding its backward the
//! gradient that reached its output.
//!
//! Autograd keeps, for every layer, the tensors its backward needs (norm inputs, queries, keys,
//! values, attention outputs, the MLP's gate and up projections): about 20 times the layer's
//! input for a Qwen2-shaped block. [`CausalLm::forward_recomputed`] runs the layers without
//! gradients and keeps their inputs; only the final norm runs with gradients, from a leaf that
//! stands for the last layer's output. Once the caller's loss has been backpropagated to that leaf,
//! [`Recomputed::backward`] walks the layers down: a layer is recomputed from its kept input (a
//! fresh leaf), the vector-Jacobian product with the incoming gradient accumulates into the
//! layer's parameters and yields the gradient of its input, and its activations are freed before
//! the next layer runs. The embeddings get theirs last. The gradients equal those of one full
//! backward pass up to the order of floating-point sums. A layer's weights are on the device from
//! its recomputation through its backward pass ([`crate::residency`]), which is what fully sharded
//! training needs: gathered per layer, its gradients reduced as soon as the layer is done.

use crate::prepacked::Kernels;
use crate::transformer::{Attend, CausalLm, Layout};
use tch::{Kind, Tensor};

/// A forward pass whose decoder layers are recomputed in the backward pass.
#[must_use = "call backward() after the loss's backward pass, or the decoder gets no gradients"]
pub struct Recomputed<'m> {
    model: &'m CausalLm,
    input_ids: Tensor,
    rot: (Tensor, Tensor),
    attend: Attention,
    /// The input of each decoder layer, without a graph.
    inputs: Vec<Tensor>,
    /// A leaf standing for the last layer's output.
    top: Tensor,
    /// The final hidden states, differentiable down to `top`.
    hidden: Tensor,
}

/// [`Attend`] with its mask or lengths owned.
enum Attention {
    Causal,
    Mask(Tensor),
    Segments(Vec<i64>),
}

impl Attention {
    fn attend(&self) -> Attend<'_> {
        match self {
            Attention::Causal => Attend::Causal,
            Attention::Mask(mask) => Attend::Mask(mask),
            Attention::Segments(lengths) => Attend::Segments(lengths),
        }
    }
}

impl CausalLm {
    /// [`CausalLm::forward_layout`] keeping only each decoder layer's input: the returned
    /// [`Recomputed::hidden`] is differentiable, and [`Recomputed::backward`] carries its gradient
    /// through the decoder.
    pub fn forward_recomputed(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        layout: &Layout,
    ) -> Recomputed<'_> {
        let t = input_ids.size().last().copied().unwrap_or(0);
        let attend = match layout {
            Layout::Padded { valid } => {
                self.padding_mask(valid.as_ref(), t).map_or(Attention::Causal, Attention::Mask)
            }
            Layout::Packed { lengths } => Attention::Segments(lengths.clone()),
        };
        let rot = self.rotary(positions);
        let (inputs, last) = tch::no_grad(|| {
            let mut h = self.embed(input_ids);
            let mut inputs = Vec::with_capacity(self.num_layers());
            for i in 0..self.num_layers() {
                let next = self.run_layer(i, &h, &rot, attend.attend(), None, Kernels::Standard);
                inputs.push(h);
                h = next;
            }
            (inputs, h)
        });
        let top = last.set_requires_grad(true);
        let hidden = self.final_norm(&top);
        Recomputed { model: self, input_ids: input_ids.shallow_clone(), rot, attend, inputs, top, hidden }
    }
}

impl Recomputed<'_> {
    /// The final hidden states `(B, T, hidden)`.
    pub fn hidden(&self) -> &Tensor {
        &self.hidden
    }

    /// Backpropagates through the decoder and the embeddings the gradient the caller's backward
    /// pass left at the final norm's input; gradients accumulate into the parameters as a
    /// backward pass's do. Does nothing when no gradient reached it, unless the layers' fetches
    /// are collectives (then zeros go down, so that this rank joins every fetch).
    pub fn backward(self) {
        let model = self.model;
        let mut grad = match self.top.grad() {
            g if g.defined() => g,
            _ if model.fetches_collectively() => self.top.zeros_like(),
            _ => return,
        };
        tch::with_grad(|| {
            for (i, input) in self.inputs.iter().enumerate().rev() {
                let x = input.detach().set_requires_grad(true);
                model.with_layer(i, || {
                    let y =
                        model.layer(i).forward(&x, &self.rot, self.attend.attend(), None, Kernels::Standard);
                    vector_jacobian(&y, &grad);
                    if let Some(residency) = model.residency() {
                        residency.backward_done(i);
                    }
                });
                grad = x.grad();
            }
            let embeddings = model.embed(&self.input_ids);
            // A frozen base (LoRA) has no gradient to take at the embeddings.
            if embeddings.requires_grad() {
                vector_jacobian(&embeddings, &grad);
            }
        });
    }
}

/// Backpropagates `grad` from `output`: `output.backward(grad)`, as the gradient of
/// `sum(output * grad)` (whose derivative in `output` is `grad` exactly).
fn vector_jacobian(output: &Tensor, grad: &Tensor) {
    (output * grad).sum(Kind::Float).backward();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelConfig, QwenSizes};
    use tch::Device;

    fn model(tie: bool) -> CausalLm {
        let sizes = QwenSizes {
            vocab_size: 97,
            hidden_size: 32,
            intermediate_size: 48,
            num_hidden_layers: 3,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            max_position_embeddings: 64,
            tie_word_embeddings: tie,
            initializer_range: 0.1,
        };
        CausalLm::random(ModelConfig::qwen2(sizes).unwrap(), Device::Cpu, 11).unwrap()
    }

    /// A loss over every position's log-probabilities of some targets.
    fn loss(model: &CausalLm, hidden: &Tensor, targets: &Tensor) -> Tensor {
        let logp = model.lm_head(hidden).log_softmax(-1, Kind::Float);
        -logp.gather(-1, &targets.unsqueeze(-1), false).mean(Kind::Float)
    }

    fn gradients(model: &CausalLm) -> Vec<(String, Tensor)> {
        let grads = model.named_tensors().into_iter().map(|(n, p)| (n, p.grad().copy())).collect();
        for (_, p) in model.named_tensors() {
            let _ = p.grad().zero_();
        }
        grads
    }

    #[test]
    fn packed_sequences_match_their_padded_rows_and_recompute_alike() {
        let model = model(true);
        let (a, b) = ([5i64, 9, 17, 33, 2], [40i64, 41, 42]);
        let padded = Tensor::from_slice(&[&a[..], &b[..], &[0, 0]].concat()).view([2, 5]);
        let valid = padded.ne(0);
        let positions = Tensor::arange(5, (Kind::Int64, Device::Cpu)).view([1, 5]).expand([2, 5], true);
        let rows = model.forward_layout(&padded, &positions, &Layout::Padded { valid: Some(valid) });
        let packed = Tensor::from_slice(&[&a[..], &b[..]].concat()).view([1, 8]);
        let packed_positions = Tensor::from_slice(&[0i64, 1, 2, 3, 4, 0, 1, 2]).view([1, 8]);
        let layout = Layout::Packed { lengths: vec![5, 3] };
        let hidden = model.forward_layout(&packed, &packed_positions, &layout);
        let expected = Tensor::cat(&[rows.get(0), rows.get(1).narrow(0, 0, 3)], 0).unsqueeze(0);
        let diff = (&hidden - &expected).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "packed differs from padded by {diff}");

        let targets = packed.roll([-1], [1]);
        loss(&model, &hidden, &targets).backward();
        let full = gradients(&model);
        let pass = model.forward_recomputed(&packed, &packed_positions, &layout);
        loss(&model, pass.hidden(), &targets).backward();
        pass.backward();
        for ((name, x), (_, y)) in full.iter().zip(&gradients(&model)) {
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{name} differs by {diff}");
        }
    }

    #[test]
    fn recomputed_gradients_equal_a_full_backward() {
        for tie in [true, false] {
            let model = model(tie);
            let ids = Tensor::from_slice(&[5i64, 9, 17, 33, 2, 8, 40, 41, 42, 0, 0, 0]).view([2, 6]);
            let valid = Tensor::from_slice(&[[true; 6], [true, true, true, false, false, false]].concat())
                .view([2, 6]);
            let positions = Tensor::arange(6, (Kind::Int64, Device::Cpu)).view([1, 6]).expand([2, 6], true);
            let targets = ids.roll([-1], [1]);
            let layout = Layout::Padded { valid: Some(valid) };

            loss(&model, &model.forward_layout(&ids, &positions, &layout), &targets).backward();
            let full = gradients(&model);
            let pass = model.forward_recomputed(&ids, &positions, &layout);
            loss(&model, pass.hidden(), &targets).backward();
            pass.backward();
            let recomputed = gradients(&model);

            for ((name, a), (_, b)) in full.iter().zip(&recomputed) {
                assert!(a.defined() && b.defined(), "{name}");
                let diff = (a - b).abs().max().double_value(&[]);
                assert!(diff < 1e-6, "tie {tie}: {name} differs by {diff}");
                assert!(a.abs().max().double_value(&[]) > 0.0, "{name} got a gradient");
            }
        }
    }
}
