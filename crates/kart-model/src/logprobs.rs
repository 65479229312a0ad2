//! Per-token log-probabilities and entropies from hidden states, a chunk of tokens at a time.
//!
//! A batch of 16 x 4096 tokens over a 150k vocabulary has 40 GB of f32 logits; the trainer and the
//! engine only need one number (or two) per token. Without gradients, at most `chunk` rows of logits
//! exist at once. With gradients, autograd keeps each chunk's softmax for the backward pass, unless
//! the head is recomputed ([`masked_token_logprobs_recomputed`]): then the backward pass forms the
//! logits again a chunk at a time, as activation checkpointing does for the decoder layers.

use crate::transformer::CausalLm;
use tch::{Kind, Tensor};

/// Tokens per chunk when the caller has no better figure.
pub const DEFAULT_CHUNK: i64 = 1024;

/// Log-probabilities (and optionally entropies) of next tokens.
#[derive(Debug)]
pub struct TokenLogprobs {
    /// `log softmax(logits / T)[target]`, same shape as the targets, f32.
    pub logprobs: Tensor,
    /// Entropy of `softmax(logits / T)` per position, when requested.
    pub entropy: Option<Tensor>,
}

/// Computes, for hidden states `(…, hidden)` and `targets` `(…)` of the same leading shape, the
/// log-probability of each target under `softmax(logits / temperature)` and, if `with_entropy`, the
/// entropy of that distribution. Logits are formed `chunk` positions at a time, in f32.
pub fn token_logprobs(
    model: &CausalLm,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    with_entropy: bool,
    chunk: i64,
) -> TokenLogprobs {
    let shape = targets.size();
    let width = *hidden.size().last().expect("hidden has a feature dimension");
    let flat_hidden = hidden.reshape([-1, width]);
    let flat_targets = targets.reshape([-1, 1]).to_kind(Kind::Int64);
    let n = flat_targets.size()[0];
    let (mut logprobs, mut entropies) = (Vec::new(), Vec::new());
    for start in (0..n).step_by(chunk.max(1) as usize) {
        let len = chunk.min(n - start);
        let (logp, entropy) = chunk_logprobs(
            model,
            &flat_hidden.narrow(0, start, len),
            &flat_targets.narrow(0, start, len),
            temperature,
            with_entropy,
        );
        logprobs.push(logp);
        entropies.extend(entropy);
    }
    let join = |parts: Vec<Tensor>| match parts.is_empty() {
        true => Tensor::zeros(shape.as_slice(), (Kind::Float, hidden.device())),
        false => Tensor::cat(&parts, 0).reshape(shape.as_slice()),
    };
    TokenLogprobs { logprobs: join(logprobs), entropy: with_entropy.then(|| join(entropies)) }
}

/// The log-probabilities `(rows)` of `targets` `(rows, 1)` (and the entropies) from hidden states
/// `(rows, hidden)`, through one block of f32 logits.
fn chunk_logprobs(
    model: &CausalLm,
    hidden: &Tensor,
    targets: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> (Tensor, Option<Tensor>) {
    let logits = model.lm_head(hidden).to_kind(Kind::Float);
    // Dividing by 1 would copy the logits (and their gradient) for nothing.
    let logits = if temperature == 1.0 { logits } else { logits / temperature };
    let logp = logits.log_softmax(-1, Kind::Float);
    let entropy = with_entropy.then(|| -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float));
    (logp.gather(-1, targets, false).squeeze_dim(-1), entropy)
}

/// [`token_logprobs`] at the positions where `mask` is positive only (the tokens a loss uses), with
/// 0 elsewhere: the LM head, the largest matrix of a small model, never runs for the observation
/// tokens of an agent's trajectory or for padding. Gradients flow to the selected positions.
pub fn masked_token_logprobs(
    model: &CausalLm,
    hidden: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    temperature: f64,
    with_entropy: bool,
    chunk: i64,
) -> TokenLogprobs {
    let masked = Masked::new(mask, targets);
    let selected = token_logprobs(
        model,
        &masked.select(hidden),
        &masked.select(targets),
        temperature,
        with_entropy,
        chunk,
    );
    TokenLogprobs {
        logprobs: masked.spread(&selected.logprobs),
        entropy: selected.entropy.as_ref().map(|e| masked.spread(e)),
    }
}

/// The positions where a mask is positive: what is selected there, and values at them spread
/// back to the mask's shape (0 elsewhere).
struct Masked {
    positions: Tensor,
    shape: Vec<i64>,
}

impl Masked {
    fn new(mask: &Tensor, targets: &Tensor) -> Self {
        Masked { positions: mask.reshape([-1]).gt(0.0).nonzero().squeeze_dim(1), shape: targets.size() }
    }

    /// The rows of `t` `(…, [features])` at the positions, the leading dimensions flattened.
    fn select(&self, t: &Tensor) -> Tensor {
        let flat = match t.dim() > self.shape.len() {
            true => t.reshape([-1, *t.size().last().expect("a feature dimension")]),
            false => t.reshape([-1]),
        };
        flat.index_select(0, &self.positions)
    }

    /// `values` (one per position) in place in a zero tensor of the mask's shape, f32.
    fn spread(&self, values: &Tensor) -> Tensor {
        let zeros = Tensor::zeros([self.shape.iter().product::<i64>()], (Kind::Float, values.device()));
        zeros.index_copy(0, &self.positions, values).reshape(self.shape.as_slice())
    }
}

/// [`masked_token_logprobs`] for a pass with gradients that keeps no logits: the values are
/// computed without gradients and stand on leaves, and [`HeadRecompute::backward`], once the
/// caller's loss has been backpropagated to them, forms each chunk's logits again with gradients
/// and feeds the chunk's backward pass the gradients that reached its values. The gradients equal
/// those of [`masked_token_logprobs`] up to the order of floating-point sums.
pub fn masked_token_logprobs_recomputed<'m>(
    model: &'m CausalLm,
    hidden: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    temperature: f64,
    with_entropy: bool,
    chunk: i64,
) -> (TokenLogprobs, HeadRecompute<'m>) {
    let masked = Masked::new(mask, targets);
    let selected = masked.select(hidden);
    let selected_targets = masked.select(&targets.to_kind(Kind::Int64));
    let values = tch::no_grad(|| {
        token_logprobs(model, &selected.detach(), &selected_targets, temperature, with_entropy, chunk)
    });
    let logprobs = values.logprobs.set_requires_grad(true);
    let entropy = values.entropy.map(|e| e.set_requires_grad(true));
    let out = TokenLogprobs {
        logprobs: masked.spread(&logprobs),
        entropy: entropy.as_ref().map(|e| masked.spread(e)),
    };
    let head = HeadRecompute {
        model,
        selected,
        targets: selected_targets.unsqueeze(-1),
        logprobs,
        entropy,
        temperature,
        chunk,
    };
    (out, head)
}

/// The LM head's part of a backward pass, still to run ([`masked_token_logprobs_recomputed`]).
#[must_use = "call backward() after the loss's backward pass, or the head and hidden states get no gradients"]
pub struct HeadRecompute<'m> {
    model: &'m CausalLm,
    /// The hidden states of the selected positions `(n, hidden)`, differentiable.
    selected: Tensor,
    /// `(n, 1)`.
    targets: Tensor,
    /// The leaves standing for the values `(n)`.
    logprobs: Tensor,
    entropy: Option<Tensor>,
    temperature: f64,
    chunk: i64,
}

impl HeadRecompute<'_> {
    /// Backpropagates, a chunk at a time, the gradients the caller's backward pass left at the
    /// values, into the LM head and on into the hidden states. Does nothing when none reached
    /// them.
    pub fn backward(self) {
        let (lp_grad, entropy_grad) = (self.logprobs.grad(), self.entropy.as_ref().map(Tensor::grad));
        let entropy_grad = entropy_grad.filter(Tensor::defined);
        if !lp_grad.defined() && entropy_grad.is_none() {
            return;
        }
        let x = self.selected.detach().set_requires_grad(true);
        let n = x.size()[0];
        tch::with_grad(|| {
            for start in (0..n).step_by(self.chunk.max(1) as usize) {
                let len = self.chunk.min(n - start);
                let (logp, entropy) = chunk_logprobs(
                    self.model,
                    &x.narrow(0, start, len),
                    &self.targets.narrow(0, start, len),
                    self.temperature,
                    entropy_grad.is_some(),
                );
                let mut total = Tensor::zeros([], (Kind::Float, x.device()));
                if lp_grad.defined() {
                    total += (logp * lp_grad.narrow(0, start, len)).sum(Kind::Float);
                }
                if let (Some(e), Some(g)) = (entropy, &entropy_grad) {
                    total += (e * g.narrow(0, start, len)).sum(Kind::Float);
                }
                total.backward();
            }
            let grad = x.grad();
            if grad.defined() && self.selected.requires_grad() {
                (&self.selected * grad).sum(Kind::Float).backward();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelConfig, QwenSizes};
    use tch::Device;

    /// A one-layer Qwen2 over 64 tokens.
    fn model() -> CausalLm {
        let sizes = QwenSizes {
            vocab_size: 64,
            hidden_size: 16,
            intermediate_size: 32,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        };
        CausalLm::random(ModelConfig::qwen2(sizes).unwrap(), Device::Cpu, 3).unwrap()
    }

    #[test]
    fn masked_positions_match_the_full_computation_and_others_are_zero() {
        let model = model();
        let hidden = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let targets = Tensor::from_slice(&[1i64, 7, 9, 3, 60, 2, 2, 5, 8, 0]).view([2, 5]);
        let mask = Tensor::from_slice(&[0f32, 1., 1., 0., 1., 1., 0., 0., 1., 0.]).view([2, 5]);
        let full = token_logprobs(&model, &hidden, &targets, 0.7, true, 3);
        let masked = masked_token_logprobs(&model, &hidden, &targets, &mask, 0.7, true, 3);
        for (f, m) in [
            (&full.logprobs, &masked.logprobs),
            (full.entropy.as_ref().unwrap(), masked.entropy.as_ref().unwrap()),
        ] {
            let expected = f * &mask;
            assert!(m.allclose(&expected, 1e-6, 1e-6, false), "{m} vs {expected}");
        }
        // The gradient reaches exactly the hidden states of the masked positions.
        masked.logprobs.sum(Kind::Float).backward();
        let touched =
            hidden.grad().abs().sum_dim_intlist(-1, false, Kind::Float).gt(0.0).to_kind(Kind::Float);
        assert!(touched.equal(&mask), "{touched}");
    }

    #[test]
    fn a_recomputed_head_gives_the_values_and_gradients_of_the_kept_one() {
        let model = model();
        let leaf = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let targets = Tensor::from_slice(&[1i64, 7, 9, 3, 60, 2, 2, 5, 8, 0]).view([2, 5]);
        let mask = Tensor::from_slice(&[0f32, 1., 1., 0., 1., 1., 0., 0., 1., 0.]).view([2, 5]);
        let weights = Tensor::randn([2, 5], (Kind::Float, Device::Cpu));
        // A loss of both outputs, through a differentiable function of the leaf (as the final norm).
        let loss = |out: &TokenLogprobs| -> Tensor {
            (&out.logprobs * &weights).sum(Kind::Float) - 0.3 * out.entropy.as_ref().unwrap().sum(Kind::Float)
        };
        let grads = || {
            let g = (leaf.grad().copy(), model.lm_head_weight().grad().copy());
            let _ = leaf.grad().zero_();
            let _ = model.lm_head_weight().grad().zero_();
            g
        };
        let hidden = &leaf * 2.0;
        let kept = masked_token_logprobs(&model, &hidden, &targets, &mask, 0.7, true, 3);
        loss(&kept).backward();
        let (kept_hidden, kept_head) = grads();
        let hidden = &leaf * 2.0;
        let (values, head) = masked_token_logprobs_recomputed(&model, &hidden, &targets, &mask, 0.7, true, 3);
        assert!(values.logprobs.allclose(&kept.logprobs, 1e-6, 1e-6, false));
        loss(&values).backward();
        assert!(
            model.lm_head_weight().grad().abs().max().double_value(&[]) == 0.0,
            "nothing before backward()"
        );
        head.backward();
        let (hidden_grad, head_grad) = grads();
        for (name, a, b) in [("hidden", &kept_hidden, &hidden_grad), ("head", &kept_head, &head_grad)] {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-6 && a.abs().max().double_value(&[]) > 0.0, "{name}: {diff}");
        }
    }
}
