//! How often and how patiently failed calls are retried: the policy of engine calls
//! (`kart-rollout`'s `retry` applies it) and the exponential [`Backoff`] every retry loop waits by.

use serde::{Deserialize, Serialize};
use std::time::Duration;

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

impl RetryPolicy {
    /// The delays before the retries: `backoff_ms`, doubled after each (`retries` of them are
    /// used).
    pub fn backoff(&self) -> Backoff {
        Backoff::new(Duration::from_millis(self.backoff_ms), Duration::MAX)
    }
}

/// Exponential backoff: an endless series of delays starting at `first`, each twice the one
/// before, none above `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Delays from `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff { next: first.min(max), max }
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(self.max);
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let ms = |d: Duration| d.as_millis();
        let capped: Vec<_> =
            Backoff::new(Duration::from_millis(200), Duration::from_secs(1)).take(5).collect();
        assert_eq!(capped.into_iter().map(ms).collect::<Vec<_>>(), [200, 400, 800, 1000, 1000]);
        let policy = RetryPolicy { retries: 3, backoff_ms: 500 };
        assert_eq!(policy.backoff().take(3).map(ms).collect::<Vec<_>>(), [500, 1000, 2000]);
        assert_eq!(Backoff::new(Duration::MAX, Duration::MAX).nth(3), Some(Duration::MAX), "no overflow");
    }
}
