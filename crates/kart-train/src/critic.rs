//! The critic of PPO: a copy of the base model with a scalar value head on its final hidden
//! states (transformers' `…ForTokenClassification` with one label, as verl builds it).

#[cfg(doc)]
use super::batch::MicroBatch;
use kart_model::CausalLm;
use kart_model::ModelError;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// The value model.
pub struct Critic {
    /// The decoder (its LM head is unused).
    pub model: CausalLm,
    /// `score.weight` `(1, hidden)` and `score.bias` `(1)`.
    head: (Tensor, Tensor),
}

impl Critic {
    /// A critic in f32 from the base model folder `dir` (its optimiser lowers it to the run's
    /// precision, [`AdamW::mixed`](super::optim::AdamW::mixed)); the head is drawn from
    /// N(0, initializer_range²) with seed `seed` and a zero bias.
    pub fn load(dir: &Path, device: Device, seed: u64) -> Result<Self, ModelError> {
        let model = CausalLm::load_as(dir, device, Kind::Float)?;
        let hidden = model.config().hidden_size as i64;
        let std = model.config().initializer_range();
        let draws = kart_model::transformer::seeded_normal(seed, hidden as usize, std);
        let weight = Tensor::from_slice(&draws)
            .view([1, hidden])
            .to_device(device)
            .to_kind(model.kind())
            .set_requires_grad(true);
        let bias = Tensor::zeros([1], (model.kind(), device)).set_requires_grad(true);
        Ok(Critic { model, head: (weight, bias) })
    }

    /// `(B, W)` values (f32, differentiable) of the decoder's hidden states `(B, W, hidden)` over a
    /// micro-batch's window ([`MicroBatch::hidden`], [`MicroBatch::forward`]).
    pub fn head(&self, hidden: &Tensor) -> Tensor {
        hidden.linear(&self.head.0, Some(&self.head.1)).squeeze_dim(-1).to_kind(Kind::Float)
    }

    /// All trainable tensors, named (the decoder's Hugging Face names plus `score.*`).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut named = self.model.named_tensors();
        named.push(("score.weight".into(), self.head.0.shallow_clone()));
        named.push(("score.bias".into(), self.head.1.shallow_clone()));
        named
    }

    /// Replaces the parameters with `tensors` (as [`Self::parameters`] names them), read from
    /// `origin`.
    pub fn load_parameters(&mut self, tensors: &[(String, Tensor)], origin: &Path) -> Result<(), ModelError> {
        let by_name: std::collections::HashMap<_, _> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        tch::no_grad(|| {
            for (name, mut param) in self.parameters() {
                let source = by_name.get(name.as_str()).ok_or_else(|| ModelError::MissingTensor {
                    path: origin.to_path_buf(),
                    name: name.clone(),
                })?;
                if source.size() != param.size() {
                    return Err(ModelError::TensorShape {
                        path: origin.to_path_buf(),
                        name,
                        expected: param.size(),
                        got: source.size(),
                    });
                }
                param.copy_(source);
            }
            Ok(())
        })
    }
}
