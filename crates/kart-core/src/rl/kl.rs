//! Per-token KL estimators of verl 0.9.1 `kl_penalty` (J. Schulman, "Approximating KL
//! divergence", 2020), used for the KL penalty in the reward and for the actor's KL loss.

use super::loss::{Matrix, RlError};
use serde::{Deserialize, Serialize};

/// verl's clamp of the log-ratio `ref_log_prob - log_prob` before `exp` in `low_var_kl`.
const LOG_RATIO_BOUND: f64 = 20.0;

/// verl's clamp of the `low_var_kl` estimate.
const LOW_VAR_KL_BOUND: f64 = 10.0;

/// A KL estimator, named as in verl's `kl_penalty` / `kl_loss_type` config (aliases accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum KlEstimator {
    /// k1: `log_prob - ref_log_prob` (`"kl"` or `"k1"`).
    #[serde(rename = "kl", alias = "k1")]
    K1,
    /// `|log_prob - ref_log_prob|` (`"abs"`).
    #[serde(rename = "abs")]
    Abs,
    /// k2: `0.5 * (log_prob - ref_log_prob)^2` (`"mse"` or `"k2"`).
    #[serde(rename = "mse", alias = "k2")]
    K2,
    /// k3: `exp(d) - d - 1` for `d = clamp(ref_log_prob - log_prob, ±20)`, clamped to ±10
    /// (`"low_var_kl"` or `"k3"`).
    #[serde(rename = "low_var_kl", alias = "k3")]
    LowVarKl,
}

impl KlEstimator {
    /// The estimate for one token.
    pub fn estimate(self, log_prob: f32, ref_log_prob: f32) -> f32 {
        let (log_prob, ref_log_prob) = (f64::from(log_prob), f64::from(ref_log_prob));
        let estimate = match self {
            Self::K1 => log_prob - ref_log_prob,
            Self::Abs => (log_prob - ref_log_prob).abs(),
            Self::K2 => 0.5 * (log_prob - ref_log_prob).powi(2),
            Self::LowVarKl => {
                let d = (ref_log_prob - log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND);
                (d.exp() - d - 1.0).clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
            }
        };
        estimate as f32
    }
}

/// verl's `kl_penalty(log_prob, ref_log_prob, estimator)`: the estimate for every token, unmasked
/// (callers multiply by the response mask or aggregate with it).
pub fn kl_penalty(
    log_prob: &Matrix,
    ref_log_prob: &Matrix,
    estimator: KlEstimator,
) -> Result<Matrix, RlError> {
    ref_log_prob.expect_shape_of("ref_log_prob", log_prob, "log_prob")?;
    let estimates = log_prob
        .as_slice()
        .iter()
        .zip(ref_log_prob.as_slice())
        .map(|(&lp, &rlp)| estimator.estimate(lp, rlp));
    Ok(log_prob.shaped_like(estimates))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_and_aliases() {
        for (name, estimator) in [
            ("kl", KlEstimator::K1),
            ("k1", KlEstimator::K1),
            ("abs", KlEstimator::Abs),
            ("mse", KlEstimator::K2),
            ("k2", KlEstimator::K2),
            ("low_var_kl", KlEstimator::LowVarKl),
            ("k3", KlEstimator::LowVarKl),
        ] {
            assert_eq!(serde_json::from_value::<KlEstimator>(name.into()).unwrap(), estimator, "{name}");
        }
        assert_eq!(serde_json::to_value(KlEstimator::K1).unwrap(), "kl");
        assert_eq!(serde_json::to_value(KlEstimator::LowVarKl).unwrap(), "low_var_kl");
        assert!(serde_json::from_value::<KlEstimator>("full".into()).is_err());
    }

    #[test]
    fn estimators_match_their_formulas() {
        let (lp, rlp) = (-1.0f32, -1.5f32);
        assert_eq!(KlEstimator::K1.estimate(lp, rlp), 0.5);
        assert_eq!(KlEstimator::K1.estimate(rlp, lp), -0.5);
        assert_eq!(KlEstimator::Abs.estimate(rlp, lp), 0.5);
        assert_eq!(KlEstimator::K2.estimate(lp, rlp), 0.125);
        let k3 = f64::from(KlEstimator::LowVarKl.estimate(lp, rlp));
        assert!((k3 - ((-0.5f64).exp() + 0.5 - 1.0)).abs() < 1e-7);
        assert_eq!(KlEstimator::LowVarKl.estimate(-2.0, -2.0), 0.0);
    }

    #[test]
    fn low_var_kl_is_clamped() {
        // exp(d) - d - 1 exceeds 10 on both sides; the ±20 clamp keeps exp finite.
        assert_eq!(KlEstimator::LowVarKl.estimate(-100.0, 0.0), 10.0);
        assert_eq!(KlEstimator::LowVarKl.estimate(0.0, -100.0), 10.0);
        assert_eq!(KlEstimator::LowVarKl.estimate(-1e30, 0.0), 10.0);
    }

    #[test]
    fn kl_penalty_is_elementwise_and_checks_shapes() {
        let lp = Matrix::new(1, 2, vec![-1.0, -2.0]).unwrap();
        let rlp = Matrix::new(1, 2, vec![-1.5, -1.0]).unwrap();
        assert_eq!(kl_penalty(&lp, &rlp, KlEstimator::K1).unwrap().as_slice(), &[0.5, -1.0]);
        let wrong = Matrix::new(2, 1, vec![0.0, 0.0]).unwrap();
        let err = kl_penalty(&lp, &wrong, KlEstimator::K2).unwrap_err();
        assert_eq!(err.to_string(), "`ref_log_prob` is 2 x 1 but `log_prob` is 1 x 2");
    }
}
