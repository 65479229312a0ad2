//! Per-token log-probabilities and entropies from hidden states, a chunk of tokens at a time.
//!
//! A batch of 16 x 4096 tokens over a 150k vocabulary has 40 GB of f32 logits; the trainer and the
//! engine only need one number (or two) per token. Without gradients, at most `chunk` rows of logits
//! exist at once. With gradients, autograd keeps each chunk's softmax for the backward pass; the
//! trainer bounds that with micro-batches.

use super::transformer::CausalLm;
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
        let logits = model.lm_head(&flat_hidden.narrow(0, start, len)).to_kind(Kind::Float);
        // Dividing by 1 would copy the logits (and their gradient) for nothing.
        let logits = if temperature == 1.0 { logits } else { logits / temperature };
        let logp = logits.log_softmax(-1, Kind::Float);
        logprobs.push(logp.gather(-1, &flat_targets.narrow(0, start, len), false).squeeze_dim(-1));
        if with_entropy {
            entropies.push(-(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float));
        }
    }
    let join = |parts: Vec<Tensor>| match parts.is_empty() {
        true => Tensor::zeros(shape.as_slice(), (Kind::Float, hidden.device())),
        false => Tensor::cat(&parts, 0).reshape(shape.as_slice()),
    };
    TokenLogprobs { logprobs: join(logprobs), entropy: with_entropy.then(|| join(entropies)) }
}
