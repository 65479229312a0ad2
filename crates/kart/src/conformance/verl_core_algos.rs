//! verl 0.9.1 `core_algos` cases (`grpo/verl_core_algos.jsonl`): GRPO and RLOO advantages, the
//! PPO-clip policy loss on those GRPO advantages, the KL estimators and loss aggregation.

use super::compare::{compare, field, typed_field};
use super::{Mismatch, Schema};
use kart_core::rl::advantage::{grpo_advantages, rloo_advantages};
use kart_core::rl::kl::{KlEstimator, kl_penalty};
use kart_core::rl::loss::{LossAggMode, Matrix, PolicyClip, RlError, agg_loss, policy_loss};
use serde_json::{Map, Value, json};
use std::path::Path;

/// Absolute tolerance of the verl vectors (float32 arithmetic).
pub(super) const TOLERANCE: f64 = 1e-5;

/// Cases with `expect_grpo_advantages`.
pub struct VerlCoreAlgos;

impl Schema for VerlCoreAlgos {
    fn name(&self) -> &'static str {
        "verl/core-algos"
    }

    fn recognises(&self, case: &Value) -> bool {
        case.get("expect_grpo_advantages").is_some()
    }

    fn check(&self, case: &Value, _dir: &Path) -> Result<(), Mismatch> {
        let mask = matrix_field(case, "response_mask")?;
        let scores: Vec<f32> = typed_field(case, "scores")?;
        let groups: Vec<i64> = typed_field(case, "group_index")?;
        let old_log_prob = matrix_field(case, "old_log_prob")?;
        let log_prob = matrix_field(case, "log_prob")?;
        let ref_log_prob = matrix_field(case, "ref_log_prob")?;
        let mode: LossAggMode = typed_field(case, "loss_agg_mode")?;
        let clip = PolicyClip::from_verl(
            typed_field(case, "clip_ratio")?,
            typed_field(case, "clip_ratio_low")?,
            typed_field(case, "clip_ratio_high")?,
            typed_field(case, "clip_ratio_c")?,
        );

        let grpo = grpo_advantages(&scores, &groups, &mask, typed_field(case, "norm_adv_by_std")?)
            .map_err(rejected)?;
        let rloo = rloo_advantages(&scores, &groups, &mask).map_err(rejected)?;
        let pg = policy_loss(&old_log_prob, &log_prob, &grpo, &mask, clip, mode).map_err(rejected)?;
        // Each estimator the case names, parsed from its verl config string (k1, k2, abs, low_var_kl).
        let mut kl = Map::new();
        let expect_kl = field(case, "expect_kl")?
            .as_object()
            .ok_or_else(|| Mismatch("field `expect_kl` is not an object".into()))?;
        for name in expect_kl.keys() {
            let estimator: KlEstimator = serde_json::from_value(json!(name))
                .map_err(|e| Mismatch(format!("expect_kl.{name}: not a KL estimator name: {e}")))?;
            let estimate = kl_penalty(&log_prob, &ref_log_prob, estimator).map_err(rejected)?;
            kl.insert(name.clone(), json!(estimate.to_rows()));
        }
        let low_var_kl = kl_penalty(&log_prob, &ref_log_prob, KlEstimator::LowVarKl).map_err(rejected)?;

        let actual = json!({
            "expect_grpo_advantages": grpo.to_rows(),
            "expect_rloo_advantages": rloo.to_rows(),
            "expect_pg_loss": pg.pg_loss,
            "expect_pg_clipfrac": pg.pg_clipfrac,
            "expect_ppo_kl": pg.ppo_kl,
            "expect_pg_clipfrac_lower": pg.pg_clipfrac_lower,
            "expect_kl": kl,
            "expect_low_var_kl_agg": agg_loss(&low_var_kl, &mask, mode).map_err(rejected)?,
        });
        compare_expectations(case, &actual)?;
        let mut actual = actual;
        super::tensor_twins::core_algos(case, &grpo, clip, &mut actual)?;
        compare_expectations(case, &actual).map_err(|m| Mismatch(format!("tensor version: {}", m.0)))
    }
}

/// The B x L matrix field `name` of a case.
pub(super) fn matrix_field(case: &Value, name: &str) -> Result<Matrix, Mismatch> {
    Matrix::from_rows(&typed_field::<Vec<Vec<f32>>>(case, name)?)
        .map_err(|e| Mismatch(format!("input field `{name}`: {e}")))
}

/// A case whose inputs kart's `rl` code rejected.
pub(super) fn rejected(error: RlError) -> Mismatch {
    Mismatch(format!("kart rejected the inputs: {error}"))
}

/// Compares every `expect_*` field of `case` with the same field of `actual`, within [`TOLERANCE`].
pub(super) fn compare_expectations(case: &Value, actual: &Value) -> Result<(), Mismatch> {
    let fields = case.as_object().into_iter().flatten().filter(|(k, _)| k.starts_with("expect_"));
    for (name, expect) in fields {
        let actual = actual.get(name).ok_or_else(|| Mismatch(format!("{name}: not computed by kart")))?;
        compare(name, expect, actual, TOLERANCE)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::conformance::check_file;

    #[test]
    fn shared_vectors_pass() {
        let report = check_file(&kart_testing::conformance("grpo/verl_core_algos.jsonl")).unwrap();
        for failure in report.failures.iter().take(5) {
            eprintln!("{failure}");
        }
        assert!(report.failures.is_empty(), "{}", report.summary());
        assert!(report.passed > 0);
    }
}
