//! The trainer's tensor losses ([`kart_train::losses`]) on the verl vectors: each case's
//! policy loss, KL, aggregation, GAE and value loss computed again with tch, so the slice
//! references and the code that trains agree with upstream.

use super::Mismatch;
use super::compare::{field, typed_field};
use super::verl_core_algos::matrix_field;
use kart_core::rl::kl::KlEstimator;
use kart_core::rl::loss::{LossAggMode, Matrix, PolicyClip};
use kart_train::losses::{Normalizer, PolicyTokens, agg_loss, gae, kl_penalty, policy_loss, value_loss};
use serde_json::{Map, Value, json};
use tch::Tensor;

fn tensor(m: &Matrix) -> Tensor {
    Tensor::from_slice(m.as_slice()).view([m.rows() as i64, m.cols() as i64])
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    Vec::<Vec<f32>>::try_from(t.to_kind(tch::Kind::Float)).expect("a 2-D f32 tensor")
}

fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

/// Overwrites the policy-loss, KL and aggregation fields of `actual` with the tensor versions, on
/// the slice reference's GRPO `advantages`.
pub fn core_algos(
    case: &Value,
    advantages: &Matrix,
    clip: PolicyClip,
    actual: &mut Value,
) -> Result<(), Mismatch> {
    let mask = tensor(&matrix_field(case, "response_mask")?);
    let old = tensor(&matrix_field(case, "old_log_prob")?);
    let new = tensor(&matrix_field(case, "log_prob")?);
    let reference = tensor(&matrix_field(case, "ref_log_prob")?);
    let mode: LossAggMode = typed_field(case, "loss_agg_mode")?;
    let norm = Normalizer::of(&mask);
    let advantages = tensor(advantages);
    let tokens = PolicyTokens {
        old_log_prob: &old,
        log_prob: &new,
        advantages: &advantages,
        mask: &mask,
        weights: None,
    };
    let pg = policy_loss(tokens, clip, mode, norm);
    let mut kl = Map::new();
    for name in field(case, "expect_kl")?.as_object().into_iter().flatten().map(|(k, _)| k) {
        let estimator: KlEstimator = serde_json::from_value(json!(name))
            .map_err(|e| Mismatch(format!("expect_kl.{name}: not a KL estimator name: {e}")))?;
        kl.insert(name.clone(), json!(rows(&kl_penalty(&new, &reference, estimator))));
    }
    let low_var = agg_loss(&kl_penalty(&new, &reference, KlEstimator::LowVarKl), &mask, mode, norm);
    let fields = [
        ("expect_pg_loss", json!(scalar(&pg.loss))),
        ("expect_pg_clipfrac", json!(scalar(&pg.clipfrac))),
        ("expect_ppo_kl", json!(scalar(&pg.ppo_kl))),
        ("expect_pg_clipfrac_lower", json!(scalar(&pg.clipfrac_lower))),
        ("expect_kl", Value::Object(kl)),
        ("expect_low_var_kl_agg", json!(scalar(&low_var))),
    ];
    for (name, value) in fields {
        actual[name] = value;
    }
    Ok(())
}

/// The GAE and value-loss fields of a `verl_gae` case, computed with tensors.
pub fn gae_case(case: &Value) -> Result<Value, Mismatch> {
    let rewards = tensor(&matrix_field(case, "token_level_rewards")?);
    let values = tensor(&matrix_field(case, "values")?);
    let mask = tensor(&matrix_field(case, "response_mask")?);
    let vpreds = tensor(&matrix_field(case, "vpreds")?);
    let mode: LossAggMode = typed_field(case, "loss_agg_mode")?;
    let out = gae(&rewards, &values, &mask, typed_field(case, "gamma")?, typed_field(case, "lam")?)
        .ok_or_else(|| Mismatch("kart rejected the inputs: fewer than two response tokens".into()))?;
    let vf = value_loss(
        &vpreds,
        &out.returns,
        &values,
        &mask,
        typed_field(case, "cliprange_value")?,
        mode,
        Normalizer::of(&mask),
    );
    Ok(json!({
        "expect_gae_advantages": rows(&out.advantages),
        "expect_gae_returns": rows(&out.returns),
        "expect_vf_loss": scalar(&vf.loss),
        "expect_vf_clipfrac": scalar(&vf.clipfrac),
    }))
}
