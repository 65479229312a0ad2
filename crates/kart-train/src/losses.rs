//! The RL losses on tensors, as the trainer differentiates them: the tensor twins of the slice
//! references in [`crate::rl`] (verl 0.9.1 `core_algos`), checked against the same conformance
//! vectors.
//!
//! All inputs are `(B, L)` f32 tensors over response positions; `mask` is 1 where a token is
//! trained. Gradient accumulation over micro-batches needs the mini-batch's normaliser, so the
//! aggregations take a [`Normalizer`] instead of computing it from the micro-batch.

use kart_core::rl::kl::KlEstimator;
use kart_core::rl::loss::{LossAggMode, PolicyClip};
use tch::{Kind, Tensor};

/// verl's clamp of the log-ratio in the policy loss.
const LOG_RATIO_BOUND: f64 = 20.0;

/// verl's epsilon in `masked_mean` of the seq-mean-token-mean mode.
const MASKED_MEAN_EPS: f64 = 1e-8;

/// The denominators of an aggregation over a whole mini-batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalizer {
    /// Trained tokens in the mini-batch.
    pub tokens: f64,
    /// Rows with at least one trained token.
    pub sequences: f64,
    /// Response length L of seq-mean-token-sum-norm.
    pub length: f64,
}

impl Normalizer {
    /// The normaliser of `mask` taken on its own (no accumulation).
    pub fn of(mask: &Tensor) -> Self {
        let tokens = mask.sum(Kind::Double).double_value(&[]);
        let sequences =
            mask.sum_dim_intlist(-1, false, Kind::Double).gt(0.0).sum(Kind::Double).double_value(&[]);
        Normalizer { tokens, sequences, length: *mask.size().last().unwrap_or(&0) as f64 }
    }

    /// The sum of two normalisers of disjoint rows (lengths take the maximum).
    pub fn merge(self, other: Normalizer) -> Normalizer {
        Normalizer {
            tokens: self.tokens + other.tokens,
            sequences: self.sequences + other.sequences,
            length: self.length.max(other.length),
        }
    }
}

/// verl's `agg_loss` with the mini-batch's denominators: summing this over the micro-batches of a
/// mini-batch gives the mini-batch's aggregate. Empty denominators give 0.
pub fn agg_loss(loss: &Tensor, mask: &Tensor, mode: LossAggMode, norm: Normalizer) -> Tensor {
    let safe = |d: f64| if d > 0.0 { d } else { f64::INFINITY };
    match mode {
        LossAggMode::TokenMean => (loss * mask).sum(Kind::Float) / safe(norm.tokens),
        LossAggMode::SeqMeanTokenSum | LossAggMode::SeqMeanTokenSumNorm => {
            let per_seq = (loss * mask).sum_dim_intlist(-1, false, Kind::Float);
            let scale = if mode == LossAggMode::SeqMeanTokenSumNorm { norm.length } else { 1.0 };
            per_seq.sum(Kind::Float) / safe(norm.sequences * scale)
        }
        LossAggMode::SeqMeanTokenMean => {
            let tokens = mask.sum_dim_intlist(-1, false, Kind::Float);
            let per_seq = (loss * mask).sum_dim_intlist(-1, false, Kind::Float) / (&tokens + MASKED_MEAN_EPS);
            per_seq.sum(Kind::Float) / safe(norm.sequences)
        }
    }
}

/// The mean of `x` over the mask's tokens, with the mini-batch's token count.
pub fn masked_mean(x: &Tensor, mask: &Tensor, tokens: f64) -> Tensor {
    (x * mask).sum(Kind::Float) / if tokens > 0.0 { tokens } else { f64::INFINITY }
}

/// The clipped policy loss and its metrics (aggregated with the normaliser).
#[derive(Debug)]
pub struct PolicyLoss {
    /// The aggregated loss, differentiable.
    pub loss: Tensor,
    /// Share of tokens where the ratio clip is active.
    pub clipfrac: Tensor,
    /// Masked mean of `old - new` log-probabilities.
    pub ppo_kl: Tensor,
    /// Share of tokens where the dual clip is active.
    pub clipfrac_lower: Tensor,
}

/// The per-token inputs of the policy loss, `(B, L)` each.
#[derive(Debug, Clone, Copy)]
pub struct PolicyTokens<'a> {
    pub old_log_prob: &'a Tensor,
    pub log_prob: &'a Tensor,
    pub advantages: &'a Tensor,
    pub mask: &'a Tensor,
    /// Truncated importance-sampling weights multiplying the token losses, when on.
    pub weights: Option<&'a Tensor>,
}

/// verl's `compute_policy_loss_vanilla` on tensors.
pub fn policy_loss(
    tokens: PolicyTokens<'_>,
    clip: PolicyClip,
    mode: LossAggMode,
    norm: Normalizer,
) -> PolicyLoss {
    let PolicyTokens { old_log_prob, log_prob, advantages, mask, weights } = tokens;
    let log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND);
    let ratio = log_ratio.exp();
    let unclipped = -advantages * &ratio;
    let clipped = -advantages * ratio.clamp(1.0 - f64::from(clip.low), 1.0 + f64::from(clip.high));
    let ppo_clip = unclipped.maximum(&clipped);
    let dual = -advantages * f64::from(clip.dual_clip_c);
    let negative = advantages.lt(0.0);
    let mut token_loss = ppo_clip.where_self(&negative.logical_not(), &dual.minimum(&ppo_clip));
    if let Some(w) = weights {
        token_loss *= w;
    }
    let f = |t: Tensor| t.to_kind(Kind::Float);
    PolicyLoss {
        loss: agg_loss(&token_loss, mask, mode, norm),
        clipfrac: masked_mean(&f(clipped.gt_tensor(&unclipped)), mask, norm.tokens),
        ppo_kl: masked_mean(&(-log_ratio), mask, norm.tokens),
        clipfrac_lower: masked_mean(&f(ppo_clip.gt_tensor(&dual).logical_and(&negative)), mask, norm.tokens),
    }
}

/// How the token losses are corrected for the behaviour policy (the engine's log-probabilities,
/// of whatever version sampled each token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Correction {
    /// Truncated importance sampling (slime, verl): `min(exp(old - rollout), cap)`.
    Truncated { cap: f64 },
    /// AReaL's decoupled PPO: `exp(proximal - behaviour)`, tokens above `cap` dropped (weight 0).
    Decoupled { cap: Option<f64> },
}

/// The importance weight of each token under `correction`, `(B, L)`: `old` the log-probabilities
/// recomputed before the update (the proximal policy), `rollout` the engine's. A token the
/// engine did not sample (an observation: its rollout log-probability is 0) weighs 1.
pub fn importance_weights(old: &Tensor, rollout: &Tensor, correction: Correction) -> Tensor {
    let ratio = (old - rollout).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp();
    let weights = match correction {
        Correction::Truncated { cap } => ratio.clamp_max(cap),
        Correction::Decoupled { cap: None } => ratio,
        Correction::Decoupled { cap: Some(cap) } => ratio.where_self(&ratio.le(cap), &ratio.zeros_like()),
    };
    weights.where_self(&rollout.ne(0.0), &weights.ones_like())
}

/// verl's `kl_penalty` per token.
pub fn kl_penalty(log_prob: &Tensor, ref_log_prob: &Tensor, estimator: KlEstimator) -> Tensor {
    match estimator {
        KlEstimator::K1 => log_prob - ref_log_prob,
        KlEstimator::Abs => (log_prob - ref_log_prob).abs(),
        KlEstimator::K2 => 0.5 * (log_prob - ref_log_prob).square(),
        KlEstimator::LowVarKl => {
            let d = (ref_log_prob - log_prob).clamp(-20.0, 20.0);
            (d.exp() - d - 1.0).clamp(-10.0, 10.0)
        }
    }
}

/// The clipped value loss and its clip fraction.
#[derive(Debug)]
pub struct ValueLoss {
    /// `0.5 *` the aggregated loss, differentiable.
    pub loss: Tensor,
    /// Share of tokens where the clipped error is the larger.
    pub clipfrac: Tensor,
}

/// verl's `compute_value_loss` on tensors.
pub fn value_loss(
    vpreds: &Tensor,
    returns: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    cliprange_value: f64,
    mode: LossAggMode,
    norm: Normalizer,
) -> ValueLoss {
    let clipped_pred = vpreds.minimum(&(values + cliprange_value)).maximum(&(values - cliprange_value));
    let unclipped = (vpreds - returns).square();
    let clipped = (clipped_pred - returns).square();
    ValueLoss {
        loss: 0.5 * agg_loss(&unclipped.maximum(&clipped), mask, mode, norm),
        clipfrac: masked_mean(&clipped.gt_tensor(&unclipped).to_kind(Kind::Float), mask, norm.tokens),
    }
}

/// GAE advantages (whitened over the batch) and returns.
#[derive(Debug)]
pub struct Gae {
    pub advantages: Tensor,
    pub returns: Tensor,
}

/// verl's `compute_gae_advantage_return` on tensors: a backward scan over positions where masked
/// positions carry the next value and advantage, then masked whitening. `None` when the mask has
/// fewer than two tokens (verl raises).
pub fn gae(rewards: &Tensor, values: &Tensor, mask: &Tensor, gamma: f64, lam: f64) -> Option<Gae> {
    tch::no_grad(|| {
        let (rewards, values, mask) =
            (rewards.to_kind(Kind::Double), values.to_kind(Kind::Double), mask.to_kind(Kind::Double));
        let (b, l) = mask.size2().expect("mask is (B, L)");
        let mut next_value = Tensor::zeros([b], (Kind::Double, mask.device()));
        let mut next_advantage = next_value.zeros_like();
        let mut columns = Vec::with_capacity(l as usize);
        for t in (0..l).rev() {
            let (r, v, m) = (rewards.select(1, t), values.select(1, t), mask.select(1, t));
            let delta = r + gamma * &next_value - &v;
            let advantage = delta + gamma * lam * &next_advantage;
            next_value = &v * &m + (1.0 - &m) * &next_value;
            next_advantage = advantage * &m + (1.0 - &m) * &next_advantage;
            columns.push(next_advantage.shallow_clone());
        }
        columns.reverse();
        let advantages = Tensor::stack(&columns, 1);
        let returns = (&advantages + &values).to_kind(Kind::Float);
        let advantages = masked_whiten(&advantages, &mask)?.to_kind(Kind::Float);
        Some(Gae { advantages, returns })
    })
}

/// verl's `masked_whiten`: `(x - mean) / sqrt(var + 1e-8)` with the masked mean and the unbiased
/// masked variance; `None` when the mask sums to 1 or less.
pub fn masked_whiten(x: &Tensor, mask: &Tensor) -> Option<Tensor> {
    let count = mask.sum(Kind::Double).double_value(&[]);
    if count <= 1.0 {
        return None;
    }
    let mean = (x * mask).sum(Kind::Double) / count;
    let centred = x - &mean;
    let variance = (centred.square() * mask).sum(Kind::Double) / count * (count / (count - 1.0));
    Some(centred * (variance + 1e-8).rsqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: &[&[f32]]) -> Tensor {
        let cols = rows[0].len() as i64;
        Tensor::from_slice(&rows.concat()).view([rows.len() as i64, cols])
    }

    #[test]
    fn accumulating_micro_batches_equals_the_whole_batch() {
        let loss = t(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0], &[7.0, 8.0, 9.0]]);
        let mask = t(&[&[1.0, 1.0, 0.0], &[0.0, 0.0, 0.0], &[1.0, 0.0, 1.0]]);
        for mode in [
            LossAggMode::TokenMean,
            LossAggMode::SeqMeanTokenSum,
            LossAggMode::SeqMeanTokenMean,
            LossAggMode::SeqMeanTokenSumNorm,
        ] {
            let whole = agg_loss(&loss, &mask, mode, Normalizer::of(&mask)).double_value(&[]);
            let norm = Normalizer::of(&mask.narrow(0, 0, 2)).merge(Normalizer::of(&mask.narrow(0, 2, 1)));
            let parts = agg_loss(&loss.narrow(0, 0, 2), &mask.narrow(0, 0, 2), mode, norm).double_value(&[])
                + agg_loss(&loss.narrow(0, 2, 1), &mask.narrow(0, 2, 1), mode, norm).double_value(&[]);
            assert!((whole - parts).abs() < 1e-6, "{mode:?}: {whole} vs {parts}");
        }
    }

    /// The weights on known log-probabilities: TIS clamps at the cap, decoupled PPO drops what
    /// exceeds it, an observation (rollout 0) weighs 1, and equal policies weigh 1 everywhere.
    #[test]
    fn importance_weights_follow_their_formulas() {
        let old = t(&[&[-1.0, -1.0, -2.0, -0.5]]);
        let rollout = t(&[&[-1.5, -3.0, -1.0, 0.0]]);
        let w = |c| Vec::<f32>::try_from(importance_weights(&old, &rollout, c).view([-1])).unwrap();
        let e = |x: f32| x.exp();
        let close = |a: Vec<f32>, b: [f32; 4]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(w(Correction::Truncated { cap: 2.0 }), [e(0.5), 2.0, e(-1.0), 1.0]));
        assert!(close(w(Correction::Decoupled { cap: Some(2.0) }), [e(0.5), 0.0, e(-1.0), 1.0]));
        assert!(close(w(Correction::Decoupled { cap: None }), [e(0.5), e(2.0), e(-1.0), 1.0]));
        let same = importance_weights(&old, &old, Correction::Decoupled { cap: Some(1.5) });
        assert_eq!(Vec::<f32>::try_from(same.view([-1])).unwrap(), [1.0; 4]);
    }

    /// The weights scale each token's policy gradient: with the ratio at 1 (unclipped), the
    /// gradient of the token-mean loss at token t is `-A_t * w_t / N`; weights of 1 are PPO.
    #[test]
    fn importance_weights_scale_each_tokens_gradient() {
        let old = t(&[&[-1.0, -2.0, -0.5]]);
        let adv = t(&[&[1.0, -2.0, 0.5]]);
        let mask = t(&[&[1.0, 1.0, 1.0]]);
        let weights = t(&[&[0.5, 2.0, 0.0]]);
        let grad = |weights: Option<&Tensor>| {
            let lp = old.copy().set_requires_grad(true);
            let tokens =
                PolicyTokens { old_log_prob: &old, log_prob: &lp, advantages: &adv, mask: &mask, weights };
            policy_loss(tokens, PolicyClip::default(), LossAggMode::TokenMean, Normalizer::of(&mask))
                .loss
                .backward();
            Vec::<f32>::try_from(lp.grad().view([-1])).unwrap()
        };
        let (plain, weighted) = (grad(None), grad(Some(&weights)));
        assert_eq!(plain, [-1.0 / 3.0, 2.0 / 3.0, -0.5 / 3.0]);
        for i in 0..3 {
            let expected = plain[i] * [0.5, 2.0, 0.0][i];
            assert!((weighted[i] - expected).abs() < 1e-7, "token {i}: {} vs {expected}", weighted[i]);
        }
        assert_eq!(grad(Some(&mask)), plain, "weights of 1 are PPO's loss");
    }

    #[test]
    fn masked_tokens_get_exactly_zero_gradient() {
        let log_prob = t(&[&[-1.0, -2.0, -0.5, -0.1]]).set_requires_grad(true);
        let old = t(&[&[-1.1, -1.9, -0.4, -0.3]]);
        let adv = t(&[&[1.0, 1.0, -1.0, -1.0]]);
        let mask = t(&[&[1.0, 0.0, 1.0, 0.0]]);
        let tokens = PolicyTokens {
            old_log_prob: &old,
            log_prob: &log_prob,
            advantages: &adv,
            mask: &mask,
            weights: None,
        };
        let pg = policy_loss(tokens, PolicyClip::default(), LossAggMode::TokenMean, Normalizer::of(&mask));
        let kl = agg_loss(
            &kl_penalty(&log_prob, &old, KlEstimator::LowVarKl),
            &mask,
            LossAggMode::TokenMean,
            Normalizer::of(&mask),
        );
        (pg.loss + kl).backward();
        let grad = Vec::<f32>::try_from(log_prob.grad().view([-1])).unwrap();
        assert_eq!(grad[1], 0.0);
        assert_eq!(grad[3], 0.0);
        assert!(grad[0] != 0.0 && grad[2] != 0.0, "{grad:?}");
    }
}
