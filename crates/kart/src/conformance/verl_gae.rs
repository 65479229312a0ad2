//! verl 0.9.1 GAE cases (`grpo/verl_gae.jsonl`): `compute_gae_advantage_return` with observation
//! tokens skipped, and `compute_value_loss` against the returns it computes.

use super::compare::typed_field;
use super::verl_core_algos::{compare_expectations, matrix_field, rejected};
use super::{Mismatch, Schema};
use kart_core::rl::gae::gae_advantages;
use kart_core::rl::loss::{LossAggMode, value_loss};
use serde_json::{Value, json};
use std::path::Path;

/// Cases with `expect_gae_advantages`.
pub struct VerlGae;

impl Schema for VerlGae {
    fn name(&self) -> &'static str {
        "verl/gae"
    }

    fn recognises(&self, case: &Value) -> bool {
        case.get("expect_gae_advantages").is_some()
    }

    fn check(&self, case: &Value, _dir: &Path) -> Result<(), Mismatch> {
        let rewards = matrix_field(case, "token_level_rewards")?;
        let values = matrix_field(case, "values")?;
        let mask = matrix_field(case, "response_mask")?;
        let vpreds = matrix_field(case, "vpreds")?;
        let mode: LossAggMode = typed_field(case, "loss_agg_mode")?;

        let gae =
            gae_advantages(&rewards, &values, &mask, typed_field(case, "gamma")?, typed_field(case, "lam")?)
                .map_err(rejected)?;
        let vf =
            value_loss(&vpreds, &gae.returns, &values, &mask, typed_field(case, "cliprange_value")?, mode)
                .map_err(rejected)?;

        let actual = json!({
            "expect_gae_advantages": gae.advantages.to_rows(),
            "expect_gae_returns": gae.returns.to_rows(),
            "expect_vf_loss": vf.vf_loss,
            "expect_vf_clipfrac": vf.vf_clipfrac,
        });
        compare_expectations(case, &actual)?;
        compare_expectations(case, &super::tensor_twins::gae_case(case)?)
            .map_err(|m| Mismatch(format!("tensor version: {}", m.0)))
    }
}

#[cfg(test)]
mod tests {
    use crate::conformance::check_file;

    #[test]
    fn shared_vectors_pass() {
        let path = kart_testing::conformance("grpo/verl_gae.jsonl");
        let report = check_file(&path).unwrap();
        for failure in report.failures.iter().take(5) {
            eprintln!("{failure}");
        }
        assert!(report.failures.is_empty(), "{}", report.summary());
        assert!(report.passed > 0);
    }
}
