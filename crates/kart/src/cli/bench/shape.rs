//! The model shapes the benchmarks run (random weights): the benchmark's own model, and the shapes
//! of Qwen2.5-0.5B and Qwen2.5-1.5B for GPUs.

use kart_model::QwenSizes;
use kart_model::config::BENCHMARK_SIZES;

/// A model shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Shape {
    /// The benchmark model (46.5M parameters).
    Bench,
    /// Qwen2.5-0.5B's shape (494M parameters).
    #[value(name = "qwen2.5-0.5b")]
    #[serde(rename = "qwen2.5-0.5b")]
    Qwen25HalfB,
    /// Qwen2.5-1.5B's shape (1.54B parameters).
    #[value(name = "qwen2.5-1.5b")]
    #[serde(rename = "qwen2.5-1.5b")]
    Qwen25OneAndHalfB,
}

impl Shape {
    /// The model's sizes.
    pub fn sizes(self) -> QwenSizes {
        let qwen = |hidden_size, intermediate_size, num_hidden_layers, num_attention_heads| QwenSizes {
            vocab_size: 151_936,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: 2,
            max_position_embeddings: 4096,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        };
        match self {
            Shape::Bench => BENCHMARK_SIZES,
            Shape::Qwen25HalfB => qwen(896, 4864, 24, 14),
            Shape::Qwen25OneAndHalfB => qwen(1536, 8960, 28, 12),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_their_models_sizes() {
        let parameters = |shape: Shape| {
            let config = kart_model::ModelConfig::qwen2(shape.sizes()).unwrap();
            kart_model::transformer::parameter_count(&config, "")
        };
        assert_eq!(parameters(Shape::Bench), 46_548_992);
        // Qwen2.5-0.5B and -1.5B (tied embeddings), as their model cards count them.
        assert_eq!(parameters(Shape::Qwen25HalfB), 494_032_768);
        assert_eq!(parameters(Shape::Qwen25OneAndHalfB), 1_543_714_304);
    }
}
