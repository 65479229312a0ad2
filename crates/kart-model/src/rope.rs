//! Rotary position embeddings as transformers computes them: inverse frequencies from `rope_theta`
//! (optionally rescaled: linear, Llama 3), cos/sin tables in f32 for explicit position ids, and the
//! `rotate_half` application to queries and keys.

use crate::config::RopeScaling;
use tch::{Device, Kind, Tensor};

/// Inverse frequencies of one attention head, after scaling.
#[derive(Debug)]
pub struct RotaryEmbedding {
    inv_freq: Tensor,
}

impl RotaryEmbedding {
    /// Frequencies for heads of `head_dim` with base `theta` and the configured scaling.
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling, device: Device) -> Self {
        let inv_freq: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| {
                // transformers evaluates `base ** (arange / dim)` in float32.
                let exponent = i as f32 / head_dim as f32;
                1.0 / (theta as f32).powf(exponent)
            })
            .map(|f| scale(f, scaling))
            .collect();
        RotaryEmbedding { inv_freq: Tensor::from_slice(&inv_freq).to_device(device) }
    }

    /// `(cos, sin)` of shape `(B, T, head_dim)` in f32 for `positions` of shape `(B, T)`.
    pub fn cos_sin(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (emb.cos(), emb.sin())
    }
}

/// Applies one frequency's scaling rule (transformers' `ROPE_INIT_FUNCTIONS`).
fn scale(inv_freq: f32, scaling: &RopeScaling) -> f32 {
    match *scaling {
        RopeScaling::Default => inv_freq,
        RopeScaling::Linear { factor } => inv_freq / factor as f32,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32);
            let old_context = original_max_position_embeddings as f32;
            let low_freq_wavelen = old_context / low;
            let high_freq_wavelen = old_context / high;
            let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
            if wavelen > low_freq_wavelen {
                inv_freq / factor
            } else if wavelen < high_freq_wavelen {
                inv_freq
            } else {
                let smooth = (old_context / wavelen - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            }
        }
    }
}

/// Rotates `x` of shape `(B, heads, T, head_dim)` by `cos`/`sin` of shape `(B, T, head_dim)`.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let (cos, sin) = (cos.unsqueeze(1).to_kind(x.kind()), sin.unsqueeze(1).to_kind(x.kind()));
    let half = x.size().last().copied().expect("head_dim") / 2;
    let (x1, x2) = (x.narrow(-1, 0, half), x.narrow(-1, half, half));
    let rotated = Tensor::cat(&[&x2.neg(), &x1], -1);
    x * cos + rotated * sin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies_follow_theta() {
        let rope = RotaryEmbedding::new(4, 10000.0, &RopeScaling::Default, Device::Cpu);
        let f = Vec::<f32>::try_from(&rope.inv_freq).unwrap();
        assert_eq!(f.len(), 2);
        assert!((f[0] - 1.0).abs() < 1e-7 && (f[1] - 0.01).abs() < 1e-7, "{f:?}");
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        // Wavelength 2π: far below 8192/4, unchanged.
        assert_eq!(scale(1.0, &s), 1.0);
        // Wavelength 2π/1e-5 ≈ 628k: far above 8192, divided by the factor.
        assert!((scale(1e-5, &s) - 1e-5 / 8.0).abs() < 1e-12);
        // In between, a blend of the two.
        let mid = 2.0 * std::f32::consts::PI / 4000.0;
        let got = scale(mid, &s);
        assert!(got < mid && got > mid / 8.0);
    }

    #[test]
    fn rotation_preserves_norm_and_is_identity_at_position_zero() {
        let rope = RotaryEmbedding::new(8, 10000.0, &RopeScaling::Default, Device::Cpu);
        let x = Tensor::randn([1, 2, 3, 8], (Kind::Float, Device::Cpu));
        let (cos, sin) = rope.cos_sin(&Tensor::from_slice(&[0i64, 5, 9]).view([1, 3]));
        let y = apply(&x, &cos, &sin);
        let first = (y.narrow(2, 0, 1) - x.narrow(2, 0, 1)).abs().max().double_value(&[]);
        assert!(first < 1e-6);
        let norms = |t: &Tensor| t.square().sum_dim_intlist(-1, false, Kind::Float);
        assert!((norms(&y) - norms(&x)).abs().max().double_value(&[]) < 1e-4);
    }
}
