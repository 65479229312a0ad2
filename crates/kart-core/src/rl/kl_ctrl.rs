//! The coefficient of the KL penalty in the reward (`algorithm.kl_in_reward`), as verl 0.9.1's
//! `apply_kl_penalty` drives it: `FixedKLController` keeps `kl_coef`; `AdaptiveKLController`
//! (Ziegler et al. 2019) moves it toward `target_kl` after each step, by
//! `clip(kl / target_kl - 1, ±0.2) * n_steps / horizon`, `n_steps` being the step's trajectories.

use crate::config::train::{KlCtrlConfig, KlCtrlType};

/// verl's bound of the proportional error of the adaptive controller.
const PROPORTIONAL_ERROR_BOUND: f64 = 0.2;

/// The KL coefficient of the reward and how it moves.
#[derive(Debug, Clone, PartialEq)]
pub struct KlController {
    config: KlCtrlConfig,
    value: f64,
}

impl KlController {
    /// A controller at `config.kl_coef`.
    pub fn new(config: KlCtrlConfig) -> Self {
        KlController { value: config.kl_coef, config }
    }

    /// A controller resumed at `value` (a checkpoint's).
    pub fn resumed(config: KlCtrlConfig, value: f64) -> Self {
        KlController { value, config }
    }

    /// The coefficient (verl's `kl_ctrl.value`).
    pub fn value(&self) -> f64 {
        self.value
    }

    /// Moves the coefficient after a step whose `n_steps` trajectories had mean KL `current_kl`.
    pub fn update(&mut self, current_kl: f64, n_steps: usize) {
        let c = &self.config;
        if c.kind == KlCtrlType::Adaptive {
            let error =
                (current_kl / c.target_kl - 1.0).clamp(-PROPORTIONAL_ERROR_BOUND, PROPORTIONAL_ERROR_BOUND);
            self.value *= 1.0 + error * n_steps as f64 / c.horizon;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive() -> KlCtrlConfig {
        KlCtrlConfig { kind: KlCtrlType::Adaptive, kl_coef: 0.1, target_kl: 0.05, horizon: 100.0 }
    }

    #[test]
    fn a_fixed_coefficient_never_moves() {
        let mut c = KlController::new(KlCtrlConfig { kind: KlCtrlType::Fixed, ..adaptive() });
        c.update(10.0, 64);
        assert_eq!(c.value(), 0.1);
    }

    /// verl: `mult = 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon; value *= mult`.
    #[test]
    fn the_adaptive_coefficient_follows_verls_formula() {
        let mut c = KlController::new(adaptive());
        // kl 0.06 over 0.05: error 0.2 (exactly the bound), 8 of 100 steps: x1.016.
        c.update(0.06, 8);
        assert!((c.value() - 0.1016).abs() < 1e-12, "{}", c.value());
        // kl 0.5: error 9 clipped to 0.2; kl 0.0: error -1 clipped to -0.2.
        let mut up = KlController::new(adaptive());
        up.update(0.5, 50);
        assert!((up.value() - 0.11).abs() < 1e-12, "{}", up.value());
        let mut down = KlController::new(adaptive());
        down.update(0.0, 50);
        assert!((down.value() - 0.09).abs() < 1e-12, "{}", down.value());
        // At the target it stays.
        let mut still = KlController::new(adaptive());
        still.update(0.05, 50);
        assert!((still.value() - 0.1).abs() < 1e-12);
        assert_eq!(KlController::resumed(adaptive(), 0.3).value(), 0.3);
    }
}
