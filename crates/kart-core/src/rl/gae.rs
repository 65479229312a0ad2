//! Generalised advantage estimation for PPO with a critic, as verl 0.9.1
//! `compute_gae_advantage_return`, and verl's masked whitening (`masked_whiten`).
//!
//! Positions with response mask 0 (observation tokens of a multi-turn trajectory) are skipped: the
//! next value and the running advantage are carried across them, so each model token bootstraps from
//! the next model token's value.

use super::loss::{Matrix, RlError, masked_mean};

/// The guard in verl's `masked_whiten`: `(x - mean) * rsqrt(var + 1e-8)`.
const WHITEN_EPS: f64 = 1e-8;

/// GAE advantages (whitened) and returns (not whitened).
#[derive(Debug, Clone, PartialEq)]
pub struct Gae {
    /// The advantages after masked whitening over the whole batch; masked positions hold the
    /// whitened carried advantage, as in verl.
    pub advantages: Matrix,
    /// The advantages before whitening plus the values: the critic's regression targets.
    pub returns: Matrix,
}

/// verl's `compute_gae_advantage_return`. Walking each row backwards,
/// `δ_t = r_t + γ V_next - V_t` and `A_t = δ_t + γ λ A_next`; where the mask is 0 the previous
/// `V_next` and `A_next` are kept instead. Returns are `A + V`; advantages are then whitened with
/// [`masked_whiten`], which needs at least two unmasked tokens in the batch.
pub fn gae_advantages(
    token_level_rewards: &Matrix,
    values: &Matrix,
    response_mask: &Matrix,
    gamma: f32,
    lam: f32,
) -> Result<Gae, RlError> {
    token_level_rewards.expect_shape_of("token_level_rewards", response_mask, "response_mask")?;
    values.expect_shape_of("values", response_mask, "response_mask")?;
    let (gamma, lam) = (f64::from(gamma), f64::from(lam));

    let mut advantages = Vec::with_capacity(response_mask.as_slice().len());
    for ((reward_row, value_row), mask_row) in
        token_level_rewards.iter_rows().zip(values.iter_rows()).zip(response_mask.iter_rows())
    {
        let (mut next_value, mut next_advantage) = (0.0, 0.0);
        let mut row = vec![0.0; mask_row.len()];
        for t in (0..mask_row.len()).rev() {
            let (reward, value, m) =
                (f64::from(reward_row[t]), f64::from(value_row[t]), f64::from(mask_row[t]));
            let delta = reward + gamma * next_value - value;
            let advantage = delta + gamma * lam * next_advantage;
            next_value = value * m + (1.0 - m) * next_value;
            next_advantage = advantage * m + (1.0 - m) * next_advantage;
            row[t] = next_advantage;
        }
        advantages.extend(row);
    }
    let returns = advantages.iter().zip(values.values()).map(|(a, v)| (a + v) as f32);
    Ok(Gae {
        returns: response_mask.shaped_like(returns),
        advantages: response_mask.shaped_like(whiten(&advantages, response_mask.as_slice())?),
    })
}

/// verl's `masked_whiten(values, mask)`: `(x - mean) / sqrt(var + 1e-8)` for every element, with the
/// masked mean and the unbiased masked variance. Fails when the mask sums to 1 or less, where verl
/// raises.
pub fn masked_whiten(values: &Matrix, mask: &Matrix) -> Result<Matrix, RlError> {
    values.expect_shape_of("values", mask, "mask")?;
    Ok(mask.shaped_like(whiten(&values.values().collect::<Vec<_>>(), mask.as_slice())?))
}

/// [`masked_whiten`] on f64 values of the mask's length.
fn whiten(values: &[f64], mask: &[f32]) -> Result<Vec<f32>, RlError> {
    let count: f64 = mask.iter().map(|&m| f64::from(m)).sum();
    if count <= 1.0 {
        return Err(RlError::TooFewTokens { count });
    }
    let mean = masked_mean(values.iter().copied(), mask);
    let variance = masked_mean(values.iter().map(|v| (v - mean).powi(2)), mask) * count / (count - 1.0);
    let scale = 1.0 / (variance + WHITEN_EPS).sqrt();
    Ok(values.iter().map(|v| ((v - mean) * scale) as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rows: &[&[f32]]) -> Matrix {
        Matrix::from_rows(&rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>()).unwrap()
    }

    fn assert_close(actual: &Matrix, expect: &[f64]) {
        assert_eq!(actual.as_slice().len(), expect.len());
        for (a, e) in actual.as_slice().iter().zip(expect) {
            assert!((f64::from(*a) - e).abs() < 1e-5, "{actual:?} vs {expect:?}");
        }
    }

    #[test]
    fn interior_masked_token_is_skipped_with_discounting() {
        // gamma = lam = 0.5. t=2: δ = 1 - 0.25 = 0.75, A = 0.75. t=1 is masked: A and V_next carry
        // over (its value 9 is never used). t=0: δ = 0.5 * 0.25 - 0.5 = -0.375, A = -0.375 + 0.25 * 0.75.
        let rewards = m(&[&[0.0, 0.0, 1.0]]);
        let values = m(&[&[0.5, 9.0, 0.25]]);
        let mask = m(&[&[1.0, 0.0, 1.0]]);
        let gae = gae_advantages(&rewards, &values, &mask, 0.5, 0.5).unwrap();
        let raw = [-0.1875, 0.75, 0.75];
        assert_close(&gae.returns, &[raw[0] + 0.5, raw[1] + 9.0, raw[2] + 0.25]);
        // Whitening over the two unmasked tokens: mean 0.28125, unbiased variance 2 * 0.46875^2.
        let std = (2.0f64 * 0.46875 * 0.46875 + 1e-8).sqrt();
        assert_close(&gae.advantages, &[-0.46875 / std, 0.46875 / std, 0.46875 / std]);
    }

    #[test]
    fn undiscounted_gae_is_reward_to_go_minus_value() {
        let rewards = m(&[&[0.0, 0.0, 1.0], &[0.0, 2.0, 0.0]]);
        let values = m(&[&[0.1, 0.2, 0.3], &[0.0, 0.5, 1.0]]);
        let mask = m(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        let gae = gae_advantages(&rewards, &values, &mask, 1.0, 1.0).unwrap();
        // Row 1's last position is masked: A stays 0 there and its value is never bootstrapped.
        let raw = [0.9, 0.8, 0.7, 2.0, 1.5, 0.0];
        let values = [0.1, 0.2, 0.3, 0.0, 0.5, 1.0];
        let returns: Vec<f64> = raw.iter().zip(values).map(|(a, v)| a + v).collect();
        assert_close(&gae.returns, &returns);
    }

    #[test]
    fn gamma_and_lambda_below_one() {
        // No mask: A_t = Σ_k (γλ)^k δ_{t+k} with δ_t = r_t + γ V_{t+1} - V_t.
        let (gamma, lam) = (0.9f64, 0.8f64);
        let rewards = [0.0, 0.5, 1.0];
        let values = [0.2, 0.4, 0.6];
        let delta = [
            rewards[0] + gamma * values[1] - values[0],
            rewards[1] + gamma * values[2] - values[1],
            rewards[2] - values[2],
        ];
        let a2 = delta[2];
        let a1 = delta[1] + gamma * lam * a2;
        let a0 = delta[0] + gamma * lam * a1;
        let to_matrix = |v: [f64; 3]| Matrix::new(1, 3, v.iter().map(|&x| x as f32).collect()).unwrap();
        let gae = gae_advantages(&to_matrix(rewards), &to_matrix(values), &m(&[&[1.0, 1.0, 1.0]]), 0.9, 0.8)
            .unwrap();
        assert_close(&gae.returns, &[a0 + values[0], a1 + values[1], a2 + values[2]]);
    }

    #[test]
    fn whitening_uses_masked_mean_and_unbiased_variance() {
        let values = m(&[&[1.0, 3.0, 100.0]]);
        let mask = m(&[&[1.0, 1.0, 0.0]]);
        let std = (2.0f64 + 1e-8).sqrt();
        assert_close(&masked_whiten(&values, &mask).unwrap(), &[-1.0 / std, 1.0 / std, 98.0 / std]);
    }

    #[test]
    fn whitening_needs_two_tokens() {
        let values = m(&[&[1.0, 2.0], &[3.0, 4.0]]);
        let one = m(&[&[0.0, 1.0], &[0.0, 0.0]]);
        assert_eq!(masked_whiten(&values, &one).unwrap_err(), RlError::TooFewTokens { count: 1.0 });
        let none = m(&[&[0.0, 0.0], &[0.0, 0.0]]);
        let err = gae_advantages(&values, &values, &none, 1.0, 1.0).unwrap_err();
        assert_eq!(err.to_string(), "whitening needs at least 2 unmasked tokens, but the mask sums to 0");
    }

    #[test]
    fn gae_names_mismatched_argument() {
        let err = gae_advantages(&m(&[&[0.0]]), &m(&[&[0.0, 0.0]]), &m(&[&[1.0]]), 1.0, 1.0).unwrap_err();
        assert_eq!(err.to_string(), "`values` is 1 x 2 but `response_mask` is 1 x 1");
    }
}
