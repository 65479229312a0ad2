//! Several engines (typically one [`SglangEngine`](super::sglang::SglangEngine) or
//! [`VllmEngine`](super::vllm::VllmEngine) per server) behind one, balanced client-side.
//!
//! Each request goes to the endpoint with the fewest requests in flight from this worker; ties go
//! round-robin. An endpoint that fails with [`EngineError::Unavailable`] is skipped for a cool-down,
//! so the caller's retry ([`crate::retry`]) lands on another one. When every endpoint is cooling
//! down, requests still go to the least loaded one rather than failing unanswered.

use futures::future::BoxFuture;
use kart_core::engine::{Engine, EngineError, EngineOutput};
use kart_core::generation::GenerationRequest;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Engines balanced by requests in flight, skipping failed ones for a while.
pub struct Balanced {
    endpoints: Vec<Endpoint>,
    /// Where the search for the least loaded endpoint starts; advanced by every request.
    cursor: AtomicUsize,
    cooldown: Duration,
}

struct Endpoint {
    engine: Arc<dyn Engine>,
    in_flight: AtomicUsize,
    /// Skipped until then after an `Unavailable` error.
    down_until: Mutex<Option<Instant>>,
}

impl Endpoint {
    fn cooling_down(&self, now: Instant) -> bool {
        self.down_until.lock().expect("cool-down lock").is_some_and(|until| now < until)
    }
}

/// Counts a request in flight on an endpoint until dropped (finished or cancelled).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn start(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Balanced {
    /// How long a failed endpoint is skipped unless [`Balanced::with_cooldown`] says otherwise.
    pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(10);

    /// Balances `engines` (at least one).
    pub fn new(engines: Vec<Arc<dyn Engine>>) -> Result<Self, EngineError> {
        if engines.is_empty() {
            return Err(EngineError::Invalid("a balanced engine needs at least one endpoint".into()));
        }
        let endpoints = engines
            .into_iter()
            .map(|engine| Endpoint { engine, in_flight: AtomicUsize::new(0), down_until: Mutex::new(None) })
            .collect();
        Ok(Balanced { endpoints, cursor: AtomicUsize::new(0), cooldown: Self::DEFAULT_COOLDOWN })
    }

    /// Skips an endpoint for `cooldown` after it fails with `Unavailable`.
    pub fn with_cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The endpoint with the fewest requests in flight among those not cooling down (among all if
    /// every one is), the first found from the cursor on a tie.
    fn pick(&self) -> &Endpoint {
        let now = Instant::now();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let n = self.endpoints.len();
        let ring = (0..n).map(|i| &self.endpoints[start.wrapping_add(i) % n]);
        let load = |e: &&Endpoint| e.in_flight.load(Ordering::SeqCst);
        ring.clone()
            .filter(|e| !e.cooling_down(now))
            .min_by_key(load)
            .or_else(|| ring.min_by_key(load))
            .expect("a balanced engine has at least one endpoint")
    }
}

impl Engine for Balanced {
    fn generate(&self, request: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
        Box::pin(async move {
            let endpoint = self.pick();
            let _in_flight = InFlight::start(&endpoint.in_flight);
            let result = endpoint.engine.generate(request).await;
            if let Err(error @ EngineError::Unavailable { .. }) = &result {
                tracing::warn!(%error, cooldown_secs = self.cooldown.as_secs_f64(), "engine endpoint skipped for a cool-down");
                *endpoint.down_until.lock().expect("cool-down lock") = Some(Instant::now() + self.cooldown);
            }
            result
        })
    }

    fn name(&self) -> &str {
        "balanced"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::http::dead_url;
    use crate::engines::sglang::SglangEngine;
    use crate::engines::sglang::tests::{answer, fake, request};
    use crate::retry;
    use axum::http::StatusCode;
    use kart_core::config::retry::RetryPolicy;
    use kart_core::generation::FinishReason;
    use kart_core::generation::Generation;
    use serde_json::json;
    use tokio::sync::Semaphore;

    /// An engine answering with its own `id` as the version, optionally failing or waiting for a
    /// permit of `gate` first.
    struct Counting {
        id: i64,
        calls: AtomicUsize,
        fail: bool,
        gate: Option<Arc<Semaphore>>,
    }

    impl Counting {
        fn new(id: i64) -> Arc<Self> {
            Arc::new(Counting { id, calls: AtomicUsize::new(0), fail: false, gate: None })
        }

        fn failing(id: i64) -> Arc<Self> {
            Arc::new(Counting { id, calls: AtomicUsize::new(0), fail: true, gate: None })
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Engine for Counting {
        fn generate(&self, _: GenerationRequest) -> BoxFuture<'_, Result<EngineOutput, EngineError>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                if let Some(gate) = &self.gate {
                    let _permit = gate.acquire().await.expect("gate open");
                }
                if self.fail {
                    return Err(EngineError::Unavailable {
                        engine: format!("e{}", self.id),
                        reason: "down".into(),
                    });
                }
                let generation = Generation {
                    token_ids: vec![1],
                    logprobs: vec![-0.5],
                    finish_reason: FinishReason::Stop,
                };
                Ok(EngineOutput::new(generation, self.id))
            })
        }

        fn name(&self) -> &str {
            "counting"
        }
    }

    fn balance(engines: &[Arc<Counting>]) -> Balanced {
        Balanced::new(engines.iter().map(|e| e.clone() as Arc<dyn Engine>).collect()).unwrap()
    }

    #[tokio::test]
    async fn idle_endpoints_take_turns() {
        let engines = [Counting::new(0), Counting::new(1), Counting::new(2)];
        let balanced = balance(&engines);
        let mut served = Vec::new();
        for _ in 0..6 {
            served.push(balanced.generate(request()).await.unwrap().version);
        }
        assert_eq!(served, [0, 1, 2, 0, 1, 2]);
        assert_eq!(balanced.name(), "balanced");
    }

    #[tokio::test]
    async fn busy_endpoints_are_avoided() {
        let gate = Arc::new(Semaphore::new(0));
        let slow =
            Arc::new(Counting { id: 0, calls: AtomicUsize::new(0), fail: false, gate: Some(gate.clone()) });
        let fast = Counting::new(1);
        let balanced = balance(&[slow.clone(), fast.clone()]);

        let mut first = balanced.generate(request());
        assert!(futures::poll!(&mut first).is_pending(), "the slow endpoint holds the first request");
        for _ in 0..3 {
            assert_eq!(balanced.generate(request()).await.unwrap().version, 1);
        }
        assert_eq!((slow.calls(), fast.calls()), (1, 3));

        gate.add_permits(1);
        assert_eq!(first.await.unwrap().version, 0);
        let next = [
            balanced.generate(request()).await.unwrap().version,
            balanced.generate(request()).await.unwrap().version,
        ];
        assert!(next.contains(&0) && next.contains(&1), "both idle again: {next:?}");
    }

    #[tokio::test]
    async fn cancelled_requests_leave_no_load_behind() {
        let gate = Arc::new(Semaphore::new(0));
        let slow = Arc::new(Counting { id: 0, calls: AtomicUsize::new(0), fail: false, gate: Some(gate) });
        let balanced = balance(&[slow, Counting::new(1)]);
        let mut first = balanced.generate(request());
        assert!(futures::poll!(&mut first).is_pending());
        drop(first);
        assert!(balanced.endpoints.iter().all(|e| e.in_flight.load(Ordering::SeqCst) == 0));
    }

    #[tokio::test]
    async fn a_failed_endpoint_is_skipped_for_its_cooldown() {
        let (down, up) = (Counting::failing(0), Counting::new(1));
        let balanced = balance(&[down.clone(), up.clone()]).with_cooldown(Duration::from_secs(3600));
        let policy = RetryPolicy { retries: 1, backoff_ms: 0 };
        for _ in 0..5 {
            assert_eq!(retry::generate(&balanced, request(), &policy).await.unwrap().version, 1);
        }
        assert_eq!((down.calls(), up.calls()), (1, 5), "tried once, then skipped");

        // Without a cool-down the failed endpoint is back in the rotation at once.
        let (down, up) = (Counting::failing(0), Counting::new(1));
        let balanced = balance(&[down.clone(), up]).with_cooldown(Duration::ZERO);
        for _ in 0..4 {
            retry::generate(&balanced, request(), &policy).await.unwrap();
        }
        assert!(down.calls() > 1, "{}", down.calls());
    }

    #[tokio::test]
    async fn when_all_are_down_requests_still_reach_one() {
        let engines = [Counting::failing(0), Counting::failing(1)];
        let balanced = balance(&engines).with_cooldown(Duration::from_secs(3600));
        for _ in 0..4 {
            assert!(matches!(balanced.generate(request()).await, Err(EngineError::Unavailable { .. })));
        }
        assert_eq!(engines[0].calls() + engines[1].calls(), 4);
    }

    #[test]
    fn no_endpoints_is_invalid() {
        assert!(matches!(Balanced::new(Vec::new()), Err(EngineError::Invalid(_))));
    }

    #[tokio::test]
    async fn sglang_servers_share_the_load_and_a_dead_one_is_skipped() {
        let body = answer(json!({"type": "stop", "matched": 151645}), "default");
        let (a, seen_a) = fake(StatusCode::OK, body.clone()).await;
        let (b, seen_b) = fake(StatusCode::OK, body).await;
        let timeout = Duration::from_secs(60);
        let sglang = |url: &str| Arc::new(SglangEngine::new(url, timeout)) as Arc<dyn Engine>;
        let balanced = Balanced::new(vec![sglang(&a), sglang(&b)]).unwrap();
        for _ in 0..4 {
            balanced.generate(request()).await.unwrap();
        }
        assert_eq!((seen_a.lock().unwrap().len(), seen_b.lock().unwrap().len()), (2, 2));

        let balanced = Balanced::new(vec![sglang(&dead_url()), sglang(&a)]).unwrap();
        let policy = RetryPolicy { retries: 1, backoff_ms: 0 };
        for _ in 0..4 {
            retry::generate(&balanced, request(), &policy).await.unwrap();
        }
        assert_eq!(seen_a.lock().unwrap().len(), 2 + 4);
    }
}
