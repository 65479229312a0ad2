//! Calling the engine with retries: transient failures are retried with exponential backoff; a
//! request that still fails aborts its trajectory (reported as `aborted`, never scored as 0).

pub use kart_core::config::retry::RetryPolicy;
use kart_core::engine::{Engine, EngineError, EngineOutput};
use kart_core::generation::GenerationRequest;

/// Generates with `engine`, retrying retryable failures per `policy`.
pub async fn generate(
    engine: &dyn Engine,
    request: GenerationRequest,
    policy: &RetryPolicy,
) -> Result<EngineOutput, EngineError> {
    let mut delays = policy.backoff().take(policy.retries as usize);
    let mut attempt = 0;
    loop {
        match engine.generate(request.clone()).await {
            Ok(output) => return Ok(output),
            Err(e) => {
                let Some(delay) = e.is_retryable().then(|| delays.next()).flatten() else { return Err(e) };
                attempt += 1;
                tracing::warn!(engine = engine.name(), attempt, error = %e, "generation failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
