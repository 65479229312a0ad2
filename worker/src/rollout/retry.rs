//! Calling the engine with retries: transient failures are retried with exponential backoff; a
//! request that still fails aborts its trajectory (reported as `aborted`, never scored as 0).

use super::engine::{Engine, EngineError, EngineOutput};
use crate::model::GenerationRequest;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Retry policy for engine calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// Generates with `engine`, retrying retryable failures per `policy`.
pub async fn generate(
    engine: &dyn Engine,
    request: GenerationRequest,
    policy: &RetryPolicy,
) -> Result<EngineOutput, EngineError> {
    let mut delay = Duration::from_millis(policy.backoff_ms);
    let mut attempt = 0;
    loop {
        match engine.generate(request.clone()).await {
            Ok(output) => return Ok(output),
            Err(e) if e.is_retryable() && attempt < policy.retries => {
                attempt += 1;
                tracing::warn!(engine = engine.name(), attempt, error = %e, "generation failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => return Err(e),
        }
    }
}
