//! The JSON bodies kart's services exchange (beside the retriever's Search-R1 API in
//! [`agent::search_r1`](crate::agent::search_r1)): rollout requests and their streamed groups,
//! and where a policy version's weights are.

mod rollout;
mod task;
mod weights;

pub use rollout::{Group, MAX_N, RolloutLine, RolloutRequest};
pub use task::{Task, TaskError};
pub use weights::WeightSource;

/// A field of a request out of its range: the field's path (`weights.url`, `prompts[2].id`) and
/// why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

impl InvalidField {
    /// `field` is invalid because of `reason`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidField { field: field.into(), reason: reason.into() }
    }

    /// The same error for a field inside `parent` (`url` within `weights` is `weights.url`).
    pub fn within(self, parent: &str) -> Self {
        InvalidField { field: format!("{parent}.{}", self.field), ..self }
    }
}
