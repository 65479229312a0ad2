//! Outcome advantage estimators of verl 0.9.1: GRPO (`compute_grpo_outcome_advantage`, with
//! Dr. GRPO as its no-std variant) and RLOO (`compute_rloo_outcome_advantage`).
//!
//! Each response has one scalar score (verl sums its token-level rewards, see [`sequence_scores`]);
//! responses are grouped by prompt with any hashable key. The per-response advantage is broadcast
//! over its response positions and multiplied by the response mask.

use super::loss::{Matrix, RlError};
use std::collections::HashMap;
use std::hash::Hash;

/// verl's `epsilon` in the GRPO denominator `std + epsilon`.
pub const GRPO_EPSILON: f64 = 1e-6;

/// Each response's score: the sum of its token-level rewards (verl's
/// `token_level_rewards.sum(dim=-1)`).
pub fn sequence_scores(token_level_rewards: &Matrix) -> Vec<f32> {
    token_level_rewards.iter_rows().map(|row| row.iter().map(|&r| f64::from(r)).sum::<f64>() as f32).collect()
}

/// GRPO advantages: `(score - mean) / (std + 1e-6)` over the response's group, with the unbiased
/// std; a group of one has mean 0 and std 1. With `norm_by_std` false (Dr. GRPO) the advantage is
/// `score - mean`.
pub fn grpo_advantages<K: Eq + Hash>(
    scores: &[f32],
    group_ids: &[K],
    response_mask: &Matrix,
    norm_by_std: bool,
) -> Result<Matrix, RlError> {
    let stats: HashMap<&K, (f64, f64)> = group_scores(scores, group_ids, response_mask)?
        .into_iter()
        .map(|(id, s)| (id, mean_and_std(&s)))
        .collect();
    let advantages = scores.iter().zip(group_ids).map(|(&score, id)| {
        let (mean, std) = stats[id];
        let centred = f64::from(score) - mean;
        if norm_by_std { centred / (std + GRPO_EPSILON) } else { centred }
    });
    Ok(broadcast(advantages, response_mask))
}

/// RLOO advantages: the score minus the mean score of the other responses of its group, computed
/// as verl does, `n / (n - 1) * (score - group mean)`; a group of one keeps its score.
pub fn rloo_advantages<K: Eq + Hash>(
    scores: &[f32],
    group_ids: &[K],
    response_mask: &Matrix,
) -> Result<Matrix, RlError> {
    let stats: HashMap<&K, (f64, f64)> = group_scores(scores, group_ids, response_mask)?
        .into_iter()
        .map(|(id, s)| (id, (s.len() as f64, as_f32(mean(&s)))))
        .collect();
    let advantages = scores.iter().zip(group_ids).map(|(&score, id)| {
        let (n, mean) = stats[id];
        let score = f64::from(score);
        if n > 1.0 { n / (n - 1.0) * (score - mean) } else { score }
    });
    Ok(broadcast(advantages, response_mask))
}

/// The scores of each group, after checking that there is one score and one group id per row.
fn group_scores<'k, K: Eq + Hash>(
    scores: &[f32],
    group_ids: &'k [K],
    response_mask: &Matrix,
) -> Result<HashMap<&'k K, Vec<f64>>, RlError> {
    for (name, len) in [("scores", scores.len()), ("group_ids", group_ids.len())] {
        if len != response_mask.rows() {
            return Err(RlError::LengthMismatch {
                name,
                len,
                reference: "response_mask",
                expected: response_mask.rows(),
            });
        }
    }
    let mut groups: HashMap<&K, Vec<f64>> = HashMap::new();
    for (id, &score) in group_ids.iter().zip(scores) {
        groups.entry(id).or_default().push(f64::from(score));
    }
    Ok(groups)
}

fn mean(scores: &[f64]) -> f64 {
    scores.iter().sum::<f64>() / scores.len() as f64
}

/// verl's group statistics: (0, 1) for a group of one, else the mean and the unbiased std, each
/// rounded to f32.
fn mean_and_std(scores: &[f64]) -> (f64, f64) {
    if scores.len() < 2 {
        return (0.0, 1.0);
    }
    let mean = mean(scores);
    let variance = scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (scores.len() - 1) as f64;
    (as_f32(mean), as_f32(variance.sqrt()))
}

/// Rounds a group statistic to f32, the dtype verl keeps it in. A score equal to its group mean in
/// f32 (0.8 in {0.2, 0.8, 1.0}) then gets exactly advantage 0, as in verl, and not a rounding
/// residue whose sign would flip the policy loss's clip and dual-clip tests.
fn as_f32(statistic: f64) -> f64 {
    f64::from(statistic as f32)
}

/// One advantage per row, times the row's mask (verl's `scores.unsqueeze(-1) * response_mask`).
fn broadcast(advantages: impl Iterator<Item = f64>, response_mask: &Matrix) -> Matrix {
    let rows = response_mask.iter_rows().zip(advantages);
    response_mask
        .shaped_like(rows.flat_map(|(mask, advantage)| mask.iter().map(move |&m| advantage as f32 * m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ones(rows: usize, cols: usize) -> Matrix {
        Matrix::new(rows, cols, vec![1.0; rows * cols]).unwrap()
    }

    fn column(m: &Matrix, col: usize) -> Vec<f32> {
        m.iter_rows().map(|r| r[col]).collect()
    }

    fn assert_close(actual: &[f32], expect: &[f64]) {
        assert_eq!(actual.len(), expect.len());
        for (a, e) in actual.iter().zip(expect) {
            assert!((f64::from(*a) - e).abs() < 1e-6, "{actual:?} vs {expect:?}");
        }
    }

    #[test]
    fn grpo_normalises_within_each_group() {
        // Group "a": scores 1, 0 -> mean 0.5, unbiased std sqrt(0.5). Group "b": 2, 4, 6 -> mean 4, std 2.
        let scores = [1.0, 2.0, 0.0, 4.0, 6.0];
        let ids = ["a", "b", "a", "b", "b"];
        let adv = grpo_advantages(&scores, &ids, &ones(5, 2), true).unwrap();
        let s = 0.5f64.sqrt() + GRPO_EPSILON;
        let expect = [0.5 / s, -2.0 / (2.0 + GRPO_EPSILON), -0.5 / s, 0.0, 2.0 / (2.0 + GRPO_EPSILON)];
        assert_close(&column(&adv, 0), &expect);
        assert_eq!(column(&adv, 0), column(&adv, 1));
    }

    #[test]
    fn dr_grpo_only_centres() {
        let adv = grpo_advantages(&[1.0, 2.0, 6.0], &[7u64, 7, 7], &ones(3, 1), false).unwrap();
        assert_close(adv.as_slice(), &[-2.0, -1.0, 3.0]);
    }

    #[test]
    fn group_of_one_has_mean_zero_and_std_one() {
        let ids = [String::from("p0"), String::from("p1"), String::from("p1")];
        let adv = grpo_advantages(&[0.8, 1.0, 1.0], &ids, &ones(3, 1), true).unwrap();
        assert_close(adv.as_slice(), &[0.8 / (1.0 + GRPO_EPSILON), 0.0, 0.0]);
        let adv = grpo_advantages(&[0.8], &[0], &ones(1, 1), false).unwrap();
        assert_close(adv.as_slice(), &[0.8]);
        let adv = rloo_advantages(&[0.8], &[0], &ones(1, 1)).unwrap();
        assert_close(adv.as_slice(), &[0.8]);
    }

    #[test]
    fn all_equal_rewards_give_zero_advantage() {
        let scores = [0.8, 0.8, 0.8, 0.8];
        for norm in [true, false] {
            let adv = grpo_advantages(&scores, &[1, 1, 1, 1], &ones(4, 3), norm).unwrap();
            assert!(adv.as_slice().iter().all(|&a| a == 0.0), "{adv:?}");
        }
        let adv = rloo_advantages(&scores, &[1, 1, 1, 1], &ones(4, 3)).unwrap();
        assert!(adv.as_slice().iter().all(|&a| a == 0.0), "{adv:?}");
    }

    #[test]
    fn advantages_are_masked_and_empty_rows_still_count() {
        // Row 1 has no unmasked token: its advantage is zeroed but its score still shapes the group.
        let mask = Matrix::new(2, 3, vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0]).unwrap();
        let adv = grpo_advantages(&[1.0, 0.0], &[0, 0], &mask, false).unwrap();
        assert_eq!(adv.to_rows(), vec![vec![0.5, 0.5, 0.0], vec![0.0, 0.0, 0.0]]);
    }

    #[test]
    fn rloo_subtracts_the_mean_of_the_others() {
        let scores = [1.0, 0.0, 0.5];
        let adv = rloo_advantages(&scores, &["q", "q", "q"], &ones(3, 1)).unwrap();
        assert_close(adv.as_slice(), &[1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5]);
    }

    #[test]
    fn mismatched_lengths_are_rejected() {
        let err = grpo_advantages(&[1.0, 2.0], &[0, 0], &ones(3, 1), true).unwrap_err();
        assert_eq!(err.to_string(), "`scores` has 2 entries but `response_mask` has 3 rows");
        let err = rloo_advantages(&[1.0, 2.0, 3.0], &[0], &ones(3, 1)).unwrap_err();
        assert_eq!(
            err,
            RlError::LengthMismatch { name: "group_ids", len: 1, reference: "response_mask", expected: 3 }
        );
    }

    #[test]
    fn empty_batch_gives_empty_advantages() {
        let mask = Matrix::new(0, 4, vec![]).unwrap();
        let adv = grpo_advantages::<u64>(&[], &[], &mask, true).unwrap();
        assert_eq!((adv.rows(), adv.cols()), (0, 4));
    }

    #[test]
    fn sequence_scores_sum_token_rewards() {
        let rewards = Matrix::new(2, 3, vec![0.0, 0.0, 1.0, 0.25, -0.5, 0.5]).unwrap();
        assert_eq!(sequence_scores(&rewards), vec![1.0, 0.25]);
    }
}
