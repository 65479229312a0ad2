//! Choosing the next token of many sequences at once, each with its own sampling parameters and its
//! own seeded random stream, on the device that holds the logits.
//!
//! Sampling is by inverse transform: one uniform number per row from the row's ChaCha stream, located
//! in the cumulative distribution after temperature, top-k and top-p. A request's tokens therefore do
//! not depend on which other requests share its batch. The reported log-probability is always that of
//! `softmax(logits / T)` before truncation (what the trainer recomputes); greedy rows report T = 1.

use kart_core::generation::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

/// A request's sampling state: its parameters and random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler seeded from `params.seed`, or from `fallback_seed` when the request has none.
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed.unwrap_or(fallback_seed));
        Sampler { params, rng }
    }

    /// The request's parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }
}

/// Picks one token per row of `logits` `(A, V)` with the matching sampler, returning the tokens and
/// their log-probabilities under `softmax(logits / T)`.
pub fn sample(logits: &Tensor, samplers: &mut [Sampler]) -> (Vec<i64>, Vec<f32>) {
    let device = logits.device();
    let logits = logits.to_kind(Kind::Float);
    let rows = samplers.len();
    let temps: Vec<f32> = samplers
        .iter()
        .map(|s| if s.params.is_greedy() { 1.0 } else { s.params.temperature as f32 })
        .collect();
    let logp = if temps.iter().all(|&t| t == 1.0) {
        logits.log_softmax(-1, Kind::Float)
    } else {
        let temps = Tensor::from_slice(&temps).to_device(device).view([rows as i64, 1]);
        (&logits / &temps).log_softmax(-1, Kind::Float)
    };

    let greedy = logits.argmax(-1, false);
    let uniforms: Vec<f64> = samplers.iter_mut().map(|s| s.rng.random::<f64>()).collect();
    let any_sampled = samplers.iter().any(|s| !s.params.is_greedy());
    let sampled = any_sampled.then(|| {
        let probs = logp.exp();
        let truncating = samplers.iter().any(|s| s.params.top_k > 0 || s.params.top_p < 1.0);
        let uniforms =
            Tensor::from_slice(&uniforms).to_device(device).to_kind(Kind::Float).view([rows as i64, 1]);
        if truncating {
            sample_truncated(&probs, samplers, &uniforms)
        } else {
            inverse_cdf(&probs, &uniforms)
        }
    });

    let greedy = Vec::<i64>::try_from(&greedy).expect("int64 tokens");
    let sampled = sampled.map(|t| Vec::<i64>::try_from(&t).expect("int64 tokens"));
    let tokens: Vec<i64> = samplers
        .iter()
        .enumerate()
        .map(|(i, s)| match (&sampled, s.params.is_greedy()) {
            (Some(sampled), false) => sampled[i],
            _ => greedy[i],
        })
        .collect();
    let index = Tensor::from_slice(&tokens).to_device(device).view([rows as i64, 1]);
    let logprobs = Vec::<f32>::try_from(&logp.gather(-1, &index, false).view([-1])).expect("f32 logprobs");
    (tokens, logprobs)
}

/// Row-wise inverse transform sampling from unnormalised probabilities.
fn inverse_cdf(probs: &Tensor, uniforms: &Tensor) -> Tensor {
    let cdf = probs.cumsum(-1, Kind::Float);
    let total = cdf.narrow(-1, cdf.size()[1] - 1, 1);
    let target = uniforms * total;
    let vocab = probs.size()[1];
    target.searchsorted(&cdf, false, true, "right", None::<Tensor>).squeeze_dim(-1).clamp_max(vocab - 1)
}

/// Sampling after top-k and top-p truncation, with per-row limits, on probabilities sorted
/// descending.
fn sample_truncated(probs: &Tensor, samplers: &[Sampler], uniforms: &Tensor) -> Tensor {
    let device = probs.device();
    let (rows, vocab) = probs.size2().expect("(A, V)");
    let (sorted, order) = probs.sort(-1, true);
    let ks: Vec<i64> =
        samplers.iter().map(|s| if s.params.top_k > 0 { s.params.top_k.min(vocab) } else { vocab }).collect();
    let ps: Vec<f32> = samplers.iter().map(|s| s.params.top_p as f32).collect();
    let rank = Tensor::arange(vocab, (Kind::Int64, device)).view([1, vocab]);
    let beyond_k = rank.ge_tensor(&Tensor::from_slice(&ks).to_device(device).view([rows, 1]));
    // A token is outside the nucleus when the tokens ranked before it already reach top_p.
    let mass_before = sorted.cumsum(-1, Kind::Float) - &sorted;
    let beyond_p = mass_before.ge_tensor(&Tensor::from_slice(&ps).to_device(device).view([rows, 1]));
    let kept = sorted.masked_fill(&beyond_k.logical_or(&beyond_p), 0.0);
    let pick = inverse_cdf(&kept, uniforms);
    order.gather(-1, &pick.view([rows, 1]), false).squeeze_dim(-1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn params(temperature: f64, top_p: f64, top_k: i64, seed: u64) -> SamplingParams {
        SamplingParams { temperature, top_p, top_k, seed: Some(seed) }
    }

    #[test]
    fn greedy_picks_argmax_and_reports_t1_logprob() {
        let logits = Tensor::from_slice(&[0.0f32, 2.0, 1.0]).view([1, 3]);
        let mut s = vec![Sampler::new(params(0.0, 1.0, -1, 0), 0)];
        let (tokens, lp) = sample(&logits, &mut s);
        assert_eq!(tokens, [1]);
        let expected = 2.0 - (1.0f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((lp[0] - expected).abs() < 1e-6);
    }

    #[test]
    fn same_seed_same_tokens_regardless_of_batch_mates() {
        let logits = Tensor::randn([3, 50], (Kind::Float, Device::Cpu));
        let mut alone = vec![Sampler::new(params(1.0, 1.0, -1, 42), 0)];
        let mut batched: Vec<_> =
            [7, 42, 9].iter().map(|&seed| Sampler::new(params(1.0, 1.0, -1, seed), 0)).collect();
        for _ in 0..20 {
            let (a, _) = sample(&logits.narrow(0, 1, 1), &mut alone);
            let (b, _) = sample(&logits, &mut batched);
            assert_eq!(a[0], b[1]);
        }
    }

    #[test]
    fn top_k_one_is_greedy_and_logprob_is_untruncated() {
        let logits = Tensor::from_slice(&[0.5f32, 3.0, 1.0, 2.9]).view([1, 4]);
        let mut s = vec![Sampler::new(params(0.7, 1.0, 1, 3), 0)];
        for _ in 0..10 {
            let (tokens, lp) = sample(&logits, &mut s);
            assert_eq!(tokens, [1]);
            let full = (&logits / 0.7).log_softmax(-1, Kind::Float).double_value(&[0, 1]) as f32;
            assert!((lp[0] - full).abs() < 1e-6, "reported logprob is before truncation");
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two tokens only.
        let probs = [0.5f32, 0.3, 0.15, 0.05];
        let logits = Tensor::from_slice(&probs.map(f32::ln)).view([1, 4]);
        let mut s = vec![Sampler::new(params(1.0, 0.7, -1, 11), 0)];
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[sample(&logits, &mut s).0[0] as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        assert!(seen[0] > 150 && seen[1] > 80, "{seen:?}");
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let probs = [0.6f32, 0.3, 0.1];
        let logits = Tensor::from_slice(&probs.map(f32::ln)).view([1, 3]);
        let mut s = vec![Sampler::new(params(1.0, 1.0, -1, 5), 0)];
        let mut seen = [0usize; 3];
        for _ in 0..3000 {
            seen[sample(&logits, &mut s).0[0] as usize] += 1;
        }
        let freq: Vec<f64> = seen.iter().map(|&c| c as f64 / 3000.0).collect();
        for (f, p) in freq.iter().zip(probs) {
            assert!((f - p as f64).abs() < 0.04, "{freq:?}");
        }
    }

    #[test]
    fn invalid_parameters_name_the_field() {
        assert_eq!(
            params(-1.0, 1.0, -1, 0).validate().unwrap_err().to_string(),
            "sampling.temperature must be >= 0 and finite, got -1"
        );
        assert!(params(1.0, 0.0, -1, 0).validate().unwrap_err().to_string().contains("sampling.top_p"));
    }
}
