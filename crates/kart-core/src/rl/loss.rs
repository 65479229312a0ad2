//! Loss aggregation and the reference PPO losses of verl 0.9.1 (`verl/trainer/ppo/core_algos.py`:
//! `agg_loss`, `compute_policy_loss_vanilla`, `compute_value_loss`).
//!
//! Every function takes B x L [`Matrix`]es (B responses, L response positions) with a 0/1 mask of the
//! same shape, computes in f64 and returns f32, the dtype of verl's tensors. [`Matrix`] and
//! [`RlError`] are shared by the whole `rl` module.

use serde::{Deserialize, Serialize};

/// The guard in verl's `masked_mean`: `sum / (mask.sum() + 1e-8)`.
const MASKED_MEAN_EPS: f64 = 1e-8;

/// verl's clamp of the log-ratio `log_prob - old_log_prob` before `exp`.
const LOG_RATIO_BOUND: f64 = 20.0;

/// Why an `rl` function rejected its inputs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RlError {
    /// `Matrix::new` got a data vector of the wrong length.
    #[error("matrix data has {len} values, expected {rows} x {cols}")]
    MatrixData { len: usize, rows: usize, cols: usize },
    /// `Matrix::from_rows` got rows of different lengths.
    #[error("matrix row {row} has {len} values, expected {expected} like row 0")]
    RaggedRows { row: usize, len: usize, expected: usize },
    /// Two matrix arguments that must have the same shape do not.
    #[error("`{name}` is {rows} x {cols} but `{reference}` is {expected_rows} x {expected_cols}")]
    ShapeMismatch {
        name: &'static str,
        rows: usize,
        cols: usize,
        reference: &'static str,
        expected_rows: usize,
        expected_cols: usize,
    },
    /// A per-response argument does not have one entry per matrix row.
    #[error("`{name}` has {len} entries but `{reference}` has {expected} rows")]
    LengthMismatch { name: &'static str, len: usize, reference: &'static str, expected: usize },
    /// Masked whitening needs an unbiased variance, so at least two unmasked tokens.
    #[error("whitening needs at least 2 unmasked tokens, but the mask sums to {count}")]
    TooFewTokens { count: f64 },
    /// Dual-clip PPO needs `clip_ratio_c > 1`.
    #[error("clip_ratio_c must be greater than 1 for dual-clip PPO, got {value}")]
    DualClipBound { value: f32 },
}

/// A B x L matrix of per-token values stored row-major, like verl's `(bs, response_length)`
/// tensors: one row per response, one column per response position.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    /// A `rows` x `cols` matrix over row-major `data`.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, RlError> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(RlError::MatrixData { len: data.len(), rows, cols });
        }
        Ok(Self { rows, cols, data })
    }

    /// A matrix from rows of equal length; no rows gives a 0 x 0 matrix.
    pub fn from_rows(rows: &[Vec<f32>]) -> Result<Self, RlError> {
        let cols = rows.first().map_or(0, Vec::len);
        if let Some((row, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != cols) {
            return Err(RlError::RaggedRows { row, len: r.len(), expected: cols });
        }
        Ok(Self { rows: rows.len(), cols, data: rows.concat() })
    }

    /// The number of rows (responses).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The number of columns (response positions).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The rows, in order.
    pub fn iter_rows(&self) -> impl ExactSizeIterator<Item = &[f32]> {
        (0..self.rows).map(move |r| &self.data[r * self.cols..(r + 1) * self.cols])
    }

    /// The rows as vectors.
    pub fn to_rows(&self) -> Vec<Vec<f32>> {
        self.iter_rows().map(<[f32]>::to_vec).collect()
    }

    /// Checks that this matrix (the argument `name`) has the shape of `reference` (the argument
    /// `reference_name`).
    pub(crate) fn expect_shape_of(
        &self,
        name: &'static str,
        reference: &Matrix,
        reference_name: &'static str,
    ) -> Result<(), RlError> {
        if (self.rows, self.cols) == (reference.rows, reference.cols) {
            return Ok(());
        }
        Err(RlError::ShapeMismatch {
            name,
            rows: self.rows,
            cols: self.cols,
            reference: reference_name,
            expected_rows: reference.rows,
            expected_cols: reference.cols,
        })
    }

    /// A matrix of this shape over row-major `values`.
    pub(crate) fn shaped_like(&self, values: impl IntoIterator<Item = f32>) -> Matrix {
        let data: Vec<f32> = values.into_iter().collect();
        debug_assert_eq!(data.len(), self.data.len(), "shaped_like needs one value per element");
        Matrix { rows: self.rows, cols: self.cols, data }
    }

    /// The values, row-major, widened to f64.
    pub(crate) fn values(&self) -> impl ExactSizeIterator<Item = f64> {
        self.data.iter().map(|&v| f64::from(v))
    }
}

/// verl's `masked_mean(values, mask)` over all elements: `sum(values * mask) / (sum(mask) + 1e-8)`,
/// where masked-out values never contribute (not even as NaN). An all-zero mask gives 0.
pub(crate) fn masked_mean(values: impl IntoIterator<Item = f64>, mask: &[f32]) -> f64 {
    let (sum, count) = values
        .into_iter()
        .zip(mask)
        .fold((0.0, 0.0), |(sum, count), (v, &m)| (sum + masked(v, m), count + f64::from(m)));
    sum / (count + MASKED_MEAN_EPS)
}

/// `v * m`, or 0 where the mask is 0 (verl's `masked_sum` uses `where(mask, values, 0) * mask`).
fn masked(v: f64, m: f32) -> f64 {
    if m == 0.0 { 0.0 } else { v * f64::from(m) }
}

/// `num / den`, or 0 for a zero denominator (a batch without any unmasked token).
fn ratio_or_zero(num: f64, den: f64) -> f64 {
    if den == 0.0 { 0.0 } else { num / den }
}

/// How a B x L loss matrix is reduced to a scalar: verl's `loss_agg_mode`, with its config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub enum LossAggMode {
    /// The mean over all unmasked tokens of the batch (`"token-mean"`, verl's default).
    #[default]
    #[serde(rename = "token-mean")]
    TokenMean,
    /// The sum over each response's unmasked tokens, averaged over the responses that have any
    /// (`"seq-mean-token-sum"`).
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// The mean over each response's unmasked tokens, averaged over the responses that have any
    /// (`"seq-mean-token-mean"`).
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
    /// `seq-mean-token-sum` divided by the response length L, Dr. GRPO's constant normaliser
    /// (`"seq-mean-token-sum-norm"`).
    #[serde(rename = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm,
}

/// verl's `agg_loss(loss_mat, loss_mask, loss_agg_mode)` on one data-parallel rank (no global batch
/// sizes). The `seq-mean` modes average over the rows whose mask is not all zero; a batch without
/// any unmasked token gives 0 (verl would divide by zero).
pub fn agg_loss(loss_mat: &Matrix, loss_mask: &Matrix, mode: LossAggMode) -> Result<f32, RlError> {
    loss_mat.expect_shape_of("loss_mat", loss_mask, "loss_mask")?;
    Ok(aggregate(&loss_mat.values().collect::<Vec<_>>(), loss_mask, mode) as f32)
}

/// [`agg_loss`] on f64 token losses of the mask's shape.
fn aggregate(loss: &[f64], mask: &Matrix, mode: LossAggMode) -> f64 {
    let weighted_sum =
        |loss: &[f64], mask: &[f32]| -> f64 { loss.iter().zip(mask).map(|(&v, &m)| masked(v, m)).sum() };
    let mask_sum = |mask: &[f32]| -> f64 { mask.iter().map(|&m| f64::from(m)).sum() };
    if mode == LossAggMode::TokenMean {
        return ratio_or_zero(weighted_sum(loss, &mask.data), mask_sum(&mask.data));
    }
    let (mut total, mut sequences) = (0.0, 0.0);
    for (row, row_mask) in mask.iter_rows().enumerate() {
        let tokens = mask_sum(row_mask);
        if tokens > 0.0 {
            let sum = weighted_sum(&loss[row * mask.cols..(row + 1) * mask.cols], row_mask);
            total +=
                if mode == LossAggMode::SeqMeanTokenMean { sum / (tokens + MASKED_MEAN_EPS) } else { sum };
            sequences += 1.0;
        }
    }
    let norm = if mode == LossAggMode::SeqMeanTokenSumNorm { mask.cols as f64 } else { 1.0 };
    ratio_or_zero(total, sequences * norm)
}

/// The clip bounds of verl's `compute_policy_loss_vanilla`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyClip {
    /// ε_low: the ratio is clipped below at `1 - low` (`clip_ratio_low`).
    pub low: f32,
    /// ε_high: the ratio is clipped above at `1 + high` (`clip_ratio_high`; DAPO's clip-higher
    /// sets it above `low`).
    pub high: f32,
    /// The dual-clip bound c > 1: for a negative advantage A the token loss is at most `-A * c`
    /// (`clip_ratio_c`).
    pub dual_clip_c: f32,
}

impl PolicyClip {
    /// Resolves verl's actor config: `clip_ratio_low` and `clip_ratio_high` default to `clip_ratio`.
    pub fn from_verl(
        clip_ratio: f32,
        clip_ratio_low: Option<f32>,
        clip_ratio_high: Option<f32>,
        clip_ratio_c: f32,
    ) -> Self {
        Self {
            low: clip_ratio_low.unwrap_or(clip_ratio),
            high: clip_ratio_high.unwrap_or(clip_ratio),
            dual_clip_c: clip_ratio_c,
        }
    }
}

impl Default for PolicyClip {
    /// verl's defaults: `clip_ratio` 0.2 both ways, `clip_ratio_c` 3.
    fn default() -> Self {
        Self { low: 0.2, high: 0.2, dual_clip_c: 3.0 }
    }
}

/// The PPO-clip policy loss and its metrics, as returned by `compute_policy_loss_vanilla`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLoss {
    /// The aggregated clipped surrogate loss (`pg_loss`).
    pub pg_loss: f32,
    /// The fraction of unmasked tokens where the ratio clip is active (`pg_clipfrac`).
    pub pg_clipfrac: f32,
    /// The masked mean of `old_log_prob - log_prob`, log-ratio clamped to ±20 (`ppo_kl`).
    pub ppo_kl: f32,
    /// The fraction of unmasked tokens where the dual clip is active (`pg_clipfrac_lower`).
    pub pg_clipfrac_lower: f32,
}

/// verl's `compute_policy_loss_vanilla`: per token, with ratio `r = exp(clamp(log_prob -
/// old_log_prob, ±20))`, the loss is `max(-A r, -A clip(r, 1 - low, 1 + high))`, capped at
/// `-A c` where `A < 0` (dual clip), then aggregated with `mode`.
pub fn policy_loss(
    old_log_prob: &Matrix,
    log_prob: &Matrix,
    advantages: &Matrix,
    response_mask: &Matrix,
    clip: PolicyClip,
    mode: LossAggMode,
) -> Result<PolicyLoss, RlError> {
    old_log_prob.expect_shape_of("old_log_prob", response_mask, "response_mask")?;
    log_prob.expect_shape_of("log_prob", response_mask, "response_mask")?;
    advantages.expect_shape_of("advantages", response_mask, "response_mask")?;
    if clip.dual_clip_c.is_nan() || clip.dual_clip_c <= 1.0 {
        return Err(RlError::DualClipBound { value: clip.dual_clip_c });
    }
    let (low, high) = (1.0 - f64::from(clip.low), 1.0 + f64::from(clip.high));
    let c = f64::from(clip.dual_clip_c);

    let n = response_mask.data.len();
    let (mut losses, mut neg_kl, mut clipped, mut clipped_lower) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for ((old, new), a) in old_log_prob.values().zip(log_prob.values()).zip(advantages.values()) {
        let log_ratio = (new - old).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND);
        let ratio = log_ratio.exp();
        let unclipped = -a * ratio;
        // torch.clamp(ratio, min, max) is min(max(ratio, min), max), even when min > max.
        let ratio_clipped = -a * ratio.max(low).min(high);
        let ppo_clip = unclipped.max(ratio_clipped);
        let dual_clip = -a * c;
        losses.push(if a < 0.0 { dual_clip.min(ppo_clip) } else { ppo_clip });
        neg_kl.push(-log_ratio);
        clipped.push(indicator(ratio_clipped > unclipped));
        clipped_lower.push(indicator(ppo_clip > dual_clip && a < 0.0));
    }
    let mask = &response_mask.data;
    Ok(PolicyLoss {
        pg_loss: aggregate(&losses, response_mask, mode) as f32,
        pg_clipfrac: masked_mean(clipped, mask) as f32,
        ppo_kl: masked_mean(neg_kl, mask) as f32,
        pg_clipfrac_lower: masked_mean(clipped_lower, mask) as f32,
    })
}

/// The clipped value loss and its clip fraction, as returned by `compute_value_loss`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueLoss {
    /// `0.5 *` the aggregated max of the clipped and unclipped squared errors (`vf_loss`).
    pub vf_loss: f32,
    /// The fraction of unmasked tokens where the clipped error is the larger (`vf_clipfrac`).
    pub vf_clipfrac: f32,
}

/// verl's `compute_value_loss`: per token, `max((v' - R)^2, (clip(v', v - ε, v + ε) - R)^2)` for
/// predictions `v'` (`vpreds`), old `values` v, `returns` R and ε = `cliprange_value`, aggregated
/// with `mode` and halved.
pub fn value_loss(
    vpreds: &Matrix,
    returns: &Matrix,
    values: &Matrix,
    response_mask: &Matrix,
    cliprange_value: f32,
    mode: LossAggMode,
) -> Result<ValueLoss, RlError> {
    vpreds.expect_shape_of("vpreds", response_mask, "response_mask")?;
    returns.expect_shape_of("returns", response_mask, "response_mask")?;
    values.expect_shape_of("values", response_mask, "response_mask")?;
    let eps = f64::from(cliprange_value);

    let n = response_mask.data.len();
    let (mut losses, mut clipped) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for ((vpred, ret), value) in vpreds.values().zip(returns.values()).zip(values.values()) {
        // verl's clip_by_value: max(min(x, hi), lo).
        let vpred_clipped = vpred.min(value + eps).max(value - eps);
        let unclipped_loss = (vpred - ret).powi(2);
        let clipped_loss = (vpred_clipped - ret).powi(2);
        losses.push(unclipped_loss.max(clipped_loss));
        clipped.push(indicator(clipped_loss > unclipped_loss));
    }
    Ok(ValueLoss {
        vf_loss: (0.5 * aggregate(&losses, response_mask, mode)) as f32,
        vf_clipfrac: masked_mean(clipped, &response_mask.data) as f32,
    })
}

fn indicator(condition: bool) -> f64 {
    if condition { 1.0 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rows: &[&[f32]]) -> Matrix {
        Matrix::from_rows(&rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>()).unwrap()
    }

    fn close(a: f32, b: f64) -> bool {
        (f64::from(a) - b).abs() < 1e-6
    }

    #[test]
    fn matrix_rejects_bad_shapes() {
        assert_eq!(Matrix::new(2, 3, vec![0.0; 5]), Err(RlError::MatrixData { len: 5, rows: 2, cols: 3 }));
        let err = Matrix::from_rows(&[vec![1.0, 2.0], vec![3.0]]).unwrap_err();
        assert_eq!(err, RlError::RaggedRows { row: 1, len: 1, expected: 2 });
        let empty = Matrix::from_rows(&[]).unwrap();
        assert_eq!((empty.rows(), empty.cols()), (0, 0));
        let no_cols = Matrix::new(3, 0, vec![]).unwrap();
        assert_eq!(no_cols.iter_rows().count(), 3);
    }

    #[test]
    fn matrix_round_trips_rows() {
        let a = m(&[&[1.0, 2.0], &[3.0, 4.0]]);
        assert_eq!(a.as_slice(), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(a.to_rows(), vec![vec![1.0, 2.0], vec![3.0, 4.0]]);
    }

    #[test]
    fn loss_agg_mode_uses_verl_names() {
        for (mode, name) in [
            (LossAggMode::TokenMean, "token-mean"),
            (LossAggMode::SeqMeanTokenSum, "seq-mean-token-sum"),
            (LossAggMode::SeqMeanTokenMean, "seq-mean-token-mean"),
            (LossAggMode::SeqMeanTokenSumNorm, "seq-mean-token-sum-norm"),
        ] {
            assert_eq!(serde_json::to_value(mode).unwrap(), name);
            assert_eq!(serde_json::from_value::<LossAggMode>(name.into()).unwrap(), mode);
        }
        assert!(serde_json::from_value::<LossAggMode>("token-sum".into()).is_err());
    }

    /// Row 0: 3 tokens summing to 6; row 1: 1 token of 4 (its masked 100 never counts); row 2 empty.
    fn agg_example() -> (Matrix, Matrix) {
        let loss = m(&[&[1.0, 2.0, 3.0], &[4.0, 100.0, 0.0], &[7.0, 8.0, 9.0]]);
        let mask = m(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0], &[0.0, 0.0, 0.0]]);
        (loss, mask)
    }

    #[test]
    fn every_agg_mode_matches_its_formula() {
        let (loss, mask) = agg_example();
        let agg = |mode| agg_loss(&loss, &mask, mode).unwrap();
        assert!(close(agg(LossAggMode::TokenMean), 10.0 / 4.0));
        // The empty row is left out of the sequence mean.
        assert!(close(agg(LossAggMode::SeqMeanTokenSum), (6.0 + 4.0) / 2.0));
        assert!(close(agg(LossAggMode::SeqMeanTokenMean), (2.0 + 4.0) / 2.0));
        assert!(close(agg(LossAggMode::SeqMeanTokenSumNorm), (6.0 + 4.0) / 2.0 / 3.0));
    }

    #[test]
    fn all_masked_batch_aggregates_to_zero() {
        let loss = m(&[&[1.0, f32::NAN], &[3.0, 4.0]]);
        let mask = m(&[&[0.0, 0.0], &[0.0, 0.0]]);
        for mode in [
            LossAggMode::TokenMean,
            LossAggMode::SeqMeanTokenSum,
            LossAggMode::SeqMeanTokenMean,
            LossAggMode::SeqMeanTokenSumNorm,
        ] {
            assert_eq!(agg_loss(&loss, &mask, mode).unwrap(), 0.0, "{mode:?}");
        }
        let no_tokens = Matrix::new(2, 0, vec![]).unwrap();
        assert_eq!(agg_loss(&no_tokens, &no_tokens, LossAggMode::SeqMeanTokenSumNorm).unwrap(), 0.0);
    }

    #[test]
    fn agg_loss_names_mismatched_argument() {
        let err = agg_loss(&m(&[&[1.0]]), &m(&[&[1.0, 1.0]]), LossAggMode::TokenMean).unwrap_err();
        assert_eq!(err.to_string(), "`loss_mat` is 1 x 1 but `loss_mask` is 1 x 2");
    }

    fn single_token(advantage: f32, ratio: f32, clip: PolicyClip) -> PolicyLoss {
        let (old, new) = (m(&[&[0.0]]), m(&[&[ratio.ln()]]));
        policy_loss(&old, &new, &m(&[&[advantage]]), &m(&[&[1.0]]), clip, LossAggMode::TokenMean).unwrap()
    }

    #[test]
    fn ratio_inside_the_clip_range_is_unclipped() {
        let out = single_token(2.0, 1.1, PolicyClip::default());
        assert!(close(out.pg_loss, -2.0 * 1.1));
        assert_eq!((out.pg_clipfrac, out.pg_clipfrac_lower), (0.0, 0.0));
        assert!(close(out.ppo_kl, -(1.1f64.ln())));
    }

    #[test]
    fn asymmetric_clip_uses_separate_bounds() {
        let dapo = PolicyClip::from_verl(0.2, Some(0.2), Some(0.28), 3.0);
        assert_eq!(dapo, PolicyClip { low: 0.2, high: 0.28, dual_clip_c: 3.0 });
        // Above 1 + 0.2 but below 1 + 0.28: clipped symmetrically, not with clip-higher.
        let symmetric = single_token(1.0, 1.25, PolicyClip::default());
        assert!(close(symmetric.pg_loss, -1.2));
        assert_eq!(symmetric.pg_clipfrac, 1.0);
        let higher = single_token(1.0, 1.25, dapo);
        assert!(close(higher.pg_loss, -1.25));
        assert_eq!(higher.pg_clipfrac, 0.0);
        // Below 1 - low with a negative advantage: the pessimistic (clipped) term wins.
        let lower = single_token(-1.0, 0.7, PolicyClip::from_verl(0.2, None, Some(0.5), 3.0));
        assert!(close(lower.pg_loss, 0.8));
        assert_eq!(lower.pg_clipfrac, 1.0);
    }

    #[test]
    fn dual_clip_caps_negative_advantage_losses() {
        let out = single_token(-1.0, 4.0, PolicyClip::default());
        assert!(close(out.pg_loss, 3.0));
        assert_eq!((out.pg_clipfrac, out.pg_clipfrac_lower), (0.0, 1.0));
        // A positive advantage is never dual-clipped.
        let positive = single_token(1.0, 4.0, PolicyClip::default());
        assert!(close(positive.pg_loss, -1.2));
        assert_eq!((positive.pg_clipfrac, positive.pg_clipfrac_lower), (1.0, 0.0));
    }

    #[test]
    fn policy_loss_clamps_the_log_ratio_and_skips_masked_tokens() {
        let old = m(&[&[0.0, 0.0]]);
        let new = m(&[&[30.0, 0.5]]);
        let out = policy_loss(
            &old,
            &new,
            &m(&[&[0.0, 5.0]]),
            &m(&[&[1.0, 0.0]]),
            PolicyClip::default(),
            LossAggMode::TokenMean,
        )
        .unwrap();
        assert!(close(out.ppo_kl, -20.0));
        assert_eq!(out.pg_loss, 0.0);
    }

    #[test]
    fn policy_loss_rejects_bad_inputs() {
        let one = m(&[&[0.0]]);
        let bound = PolicyClip { dual_clip_c: 1.0, ..PolicyClip::default() };
        let err = policy_loss(&one, &one, &one, &one, bound, LossAggMode::TokenMean).unwrap_err();
        assert_eq!(err, RlError::DualClipBound { value: 1.0 });
        let two = m(&[&[0.0, 0.0]]);
        let err =
            policy_loss(&one, &one, &two, &one, PolicyClip::default(), LossAggMode::TokenMean).unwrap_err();
        assert!(err.to_string().starts_with("`advantages` is 1 x 2"), "{err}");
    }

    #[test]
    fn value_loss_takes_the_larger_error() {
        // Token 0: prediction 2 clipped to 1.5 around value 1; return 0 -> max(4, 2.25) = 4, not clipped.
        // Token 1: prediction 0 clipped to 0.5 around value 1; return 3 -> max(9, 6.25) = 9, not clipped.
        // Token 2: prediction 3 clipped to 1.5 around value 1; return 4 -> max(1, 6.25) = 6.25, clipped.
        let vpreds = m(&[&[2.0, 0.0, 3.0]]);
        let returns = m(&[&[0.0, 3.0, 4.0]]);
        let values = m(&[&[1.0, 1.0, 1.0]]);
        let mask = m(&[&[1.0, 1.0, 1.0]]);
        let out = value_loss(&vpreds, &returns, &values, &mask, 0.5, LossAggMode::TokenMean).unwrap();
        assert!(close(out.vf_loss, 0.5 * (4.0 + 9.0 + 6.25) / 3.0));
        assert!(close(out.vf_clipfrac, 1.0 / 3.0));
        let out = value_loss(&vpreds, &returns, &values, &mask, 0.5, LossAggMode::SeqMeanTokenSum).unwrap();
        assert!(close(out.vf_loss, 0.5 * (4.0 + 9.0 + 6.25)));
    }
}
