//! Calling the engine with retries: transient failures are retried with exponential backoff; a
//! request that still fails aborts its trajectory (reported as `aborted`, never scored as 0).

pub use kart_core::config::retry::RetryPolicy;
use kart_core::engine::{Engine, EngineError, EngineOutput};
use kart_core::generation::GenerationRequest;
use std::time::Duration;

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
