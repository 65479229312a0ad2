//! How a training run spends memory: the precision of weights and compute, whether decoder
//! layers keep their activations, how the model states are sharded over the data-parallel
//! ranks, and where the reference policy lives.

use serde::{Deserialize, Serialize};

/// The kind of the weights and of the compute (the optimiser's master weights and moments and the
/// log-probability and loss reductions are f32 either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// bfloat16 weights, activations and gradients, with f32 master weights.
    Bf16,
    /// f32 throughout.
    F32,
}

impl Precision {
    /// `configured`, else bf16 on CUDA and f32 on the CPU.
    pub fn resolve(configured: Option<Precision>, cuda: bool) -> Precision {
        configured.unwrap_or(if cuda { Precision::Bf16 } else { Precision::F32 })
    }
}

/// What the data-parallel ranks split between them instead of each holding all of it (ZeRO's
/// stages; `full` is FSDP's full sharding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Every rank holds the parameters, gradients and optimiser state (DDP).
    #[default]
    None,
    /// The optimiser state and f32 master weights (ZeRO-1).
    Optimizer,
    /// The optimiser state and the gradients (ZeRO-2).
    Gradients,
    /// The parameters too (FSDP): each layer's parameters gathered for its forward and again for
    /// its backward; needs `activation_checkpointing`.
    Full,
}

/// The frozen reference policy of the KL loss.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReferenceConfig {
    /// Keep its decoder layers' weights in CPU memory (pinned on CUDA), each layer's copied to
    /// the device only while it runs; it is loaded on the device first, then moved. Takes the
    /// place of `sharding: full` for the reference.
    pub offload: bool,
}
