//! How often and how patiently failed engine calls are retried (`kart-rollout`'s `retry` applies
//! it).

use serde::{Deserialize, Serialize};

/// Retry policy for engine calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    /// First backoff in milliseconds, doubled after each failure.
    pub backoff_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { retries: 3, backoff_ms: 500 }
    }
}
