//! The `search-r1/reward` vectors: `qa_em` and `qa_em_format` scores and their helpers on full
//! decoded sequences.

use super::compare::{compare, field, str_field, typed_field};
use super::{Mismatch, Schema};
use kart_core::reward::search_r1::{
    GroundTruth, SearchR1RewardWeights, compute_score_em, compute_score_em_format, compute_score_subem,
    extract_solution, is_retrieval_correct, is_valid_sequence,
};
use serde_json::{Value, json};
use std::path::Path;

/// Cases with a `solution_str` and a `ground_truth`.
pub struct SearchR1Reward;

impl Schema for SearchR1Reward {
    fn name(&self) -> &'static str {
        "search-r1/reward"
    }

    fn recognises(&self, case: &Value) -> bool {
        case.get("solution_str").is_some() && case.get("ground_truth").is_some()
    }

    fn check(&self, case: &Value, _dir: &Path) -> Result<(), Mismatch> {
        let solution = str_field(case, "solution_str")?;
        let golden = typed_field::<GroundTruth>(case, "ground_truth")?.target;
        let weights = match case.get("weights") {
            Some(_) => typed_field::<SearchR1RewardWeights>(case, "weights")?,
            None => SearchR1RewardWeights::default(),
        };
        let defaults = SearchR1RewardWeights::default();
        let actual = json!({
            "qa_em_format": compute_score_em_format(solution, &golden, &weights),
            "qa_em": compute_score_em(solution, &golden, &defaults),
            "qa_subem": compute_score_subem(solution, &golden, &defaults),
            "is_valid_sequence": is_valid_sequence(solution),
            "extract_solution": extract_solution(solution),
            "is_retrieval_correct": is_retrieval_correct(solution, &golden),
        });
        compare("expect", field(case, "expect")?, &actual, 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use crate::conformance::check_file;

    #[test]
    fn all_upstream_reward_vectors_pass() {
        let path = kart_testing::conformance("search-r1/reward.jsonl");
        let report = check_file(&path).unwrap();
        let first: Vec<String> = report.failures.iter().take(5).map(ToString::to_string).collect();
        assert!(report.failures.is_empty(), "{}\n{}", report.summary(), first.join("\n"));
        assert_eq!(report.passed, 1500);
    }
}
