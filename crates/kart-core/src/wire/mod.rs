//! The JSON bodies kart's services exchange (beside the retriever's Search-R1 results in
//! [`agent::search_r1`](crate::agent::search_r1)): the retriever's requests, rollout requests and
//! their streamed groups, and where a policy version's weights are.

mod retrieve;
mod rollout;
mod task;
mod weights;

pub use retrieve::{AccessRequest, RetrieveLimits, RetrieveRequest};
pub use rollout::{Group, MAX_N, RolloutLine, RolloutRequest};
pub use task::{Task, TaskError};
pub use weights::WeightSource;

/// The environment variable holding the token kart's own processes share (`kart_http::token`;
/// the operator sets it from each RolloutPool's Secret).
pub const TOKEN_ENV: &str = "KART_TOKEN";
/// The environment variable naming a file that holds that token.
pub const TOKEN_FILE_ENV: &str = "KART_TOKEN_FILE";

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
