//! The `asearcher/reward` vectors: the extracted answer and the EM, F1 and cover-EM scores of
//! ASearcher's `rewards.py`, each the best over the golden answers.

use super::compare::{compare, field, str_field, typed_field};
use super::{Mismatch, Schema};
use kart_core::reward::asearcher::{
    compute_score_em, compute_score_f1, cover_exact_match_score_1, extract_solution,
};
use serde_json::{Value, json};
use std::path::Path;

/// Absolute tolerance for the scores.
const TOLERANCE: f64 = 1e-9;

/// Cases with a `solution_str` and a list of `golden_answers`.
pub struct ASearcherReward;

impl Schema for ASearcherReward {
    fn name(&self) -> &'static str {
        "asearcher/reward"
    }

    fn recognises(&self, case: &Value) -> bool {
        case.get("solution_str").is_some() && case.get("golden_answers").is_some()
    }

    fn check(&self, case: &Value, _dir: &Path) -> Result<(), Mismatch> {
        let solution = str_field(case, "solution_str")?;
        let golden: Vec<String> = typed_field(case, "golden_answers")?;
        let actual = json!({
            "extracted": extract_solution(solution),
            "em": compute_score_em(solution, &golden),
            "f1": compute_score_f1(solution, &golden),
            "cover_em": cover_exact_match_score_1(solution, &golden),
        });
        compare("expect", field(case, "expect")?, &actual, TOLERANCE)
    }
}

#[cfg(test)]
mod tests {
    use crate::conformance::check_file;

    #[test]
    fn all_upstream_asearcher_reward_vectors_pass() {
        let path = kart_testing::conformance("asearcher/reward.jsonl");
        let report = check_file(&path).unwrap();
        let first: Vec<String> = report.failures.iter().take(5).map(ToString::to_string).collect();
        assert!(report.failures.is_empty(), "{}\n{}", report.summary(), first.join("\n"));
        assert_eq!(report.passed, 1500);
    }
}
