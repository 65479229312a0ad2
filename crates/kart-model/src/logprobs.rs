//! Per-token log-probabilities and entropies from hidden states, a chunk of tokens at a time.
//!
//! A batch of 16 x 4096 tokens over a 150k vocabulary has 40 GB of f32 logits; the trainer and the
//! engine only need one number (or two) per token. Without gradients, at most `chunk` rows of logits
//! exist at once. With gradients, autograd keeps each chunk's softmax for the backward pass; the
//! trainer bounds that with micro-batches.

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
    let shape = targets.size();
    let width = *hidden.size().last().expect("hidden has a feature dimension");
    let positions = mask.reshape([-1]).gt(0.0).nonzero().squeeze_dim(1);
    let selected = token_logprobs(
        model,
        &hidden.reshape([-1, width]).index_select(0, &positions),
        &targets.reshape([-1]).index_select(0, &positions),
        temperature,
        with_entropy,
        chunk,
    );
    let spread = |values: Tensor| {
        let zeros = Tensor::zeros([targets.numel() as i64], (Kind::Float, hidden.device()));
        zeros.index_copy(0, &positions, &values).reshape(shape.as_slice())
    };
    TokenLogprobs { logprobs: spread(selected.logprobs), entropy: selected.entropy.map(spread) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelConfig, QwenSizes};
    use tch::Device;

    #[test]
    fn masked_positions_match_the_full_computation_and_others_are_zero() {
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
        let model = CausalLm::random(ModelConfig::qwen2(sizes).unwrap(), Device::Cpu, 3).unwrap();
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
}
