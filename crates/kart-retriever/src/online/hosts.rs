//! A limit on page reads in flight toward each host, so that one slow host holds only a few of the
//! page reader's slots and reads from other hosts go on.

use crate::RetrieverError;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// At most `limit` holders per host at a time. Only hosts with a read in flight or waiting have an
/// entry, so a stream of distinct hosts does not grow it.
pub(super) struct HostLimits {
    limit: usize,
    hosts: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// One of a host's slots, held until dropped.
pub(super) struct HostPermit<'a> {
    limits: &'a HostLimits,
    host: String,
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl HostLimits {
    /// `limit` (`online.per_host_concurrency`) reads per host; at least 1.
    pub(super) fn new(limit: usize) -> Result<Self, RetrieverError> {
        if limit == 0 {
            return Err(RetrieverError::BadRequest {
                field: "online.per_host_concurrency",
                reason: "must be at least 1, got 0".into(),
            });
        }
        Ok(HostLimits { limit, hosts: Mutex::default() })
    }

    /// Waits for one of `host`'s slots.
    pub(super) async fn acquire(&self, host: &str) -> HostPermit<'_> {
        let semaphore = self
            .lock()
            .entry(host.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.limit)))
            .clone();
        // Made before waiting, so a caller that gives up while waiting still releases the entry.
        let mut permit = HostPermit { limits: self, host: host.to_string(), semaphore, permit: None };
        let owned = permit.semaphore.clone().acquire_owned().await.expect("the semaphore is never closed");
        permit.permit = Some(owned);
        permit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Semaphore>>> {
        self.hosts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hosts with a read in flight or waiting.
    #[cfg(test)]
    pub(super) fn hosts(&self) -> usize {
        self.lock().len()
    }
}

impl fmt::Debug for HostLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostLimits").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl Drop for HostPermit<'_> {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut hosts = self.limits.lock();
        // References are taken under this lock: the map's and this permit's alone mean no one
        // else holds or awaits one of the host's slots.
        if Arc::strong_count(&self.semaphore) == 2 {
            hosts.remove(&self.host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn each_host_has_its_own_slots_and_idle_hosts_are_forgotten() {
        let limits = HostLimits::new(2).unwrap();
        let a1 = limits.acquire("a.example").await;
        let _a2 = limits.acquire("a.example").await;
        // A third read of a.example waits; b.example is free.
        let waiting = tokio::time::timeout(Duration::from_millis(50), limits.acquire("a.example")).await;
        assert!(waiting.is_err(), "a.example has only 2 slots");
        let b = limits.acquire("b.example").await;
        assert_eq!(limits.hosts(), 2);
        drop(b);
        assert_eq!(limits.hosts(), 1, "b.example has nothing in flight");
        drop(a1);
        let _a3 = limits.acquire("a.example").await;
        assert_eq!(limits.hosts(), 1);
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_waiting_leaves_no_entry() {
        let limits = HostLimits::new(1).unwrap();
        let held = limits.acquire("a.example").await;
        assert!(tokio::time::timeout(Duration::from_millis(20), limits.acquire("a.example")).await.is_err());
        drop(held);
        assert_eq!(limits.hosts(), 0);
    }

    #[test]
    fn zero_is_refused_naming_the_key() {
        let error = HostLimits::new(0).unwrap_err().to_string();
        assert_eq!(error, "online.per_host_concurrency: must be at least 1, got 0");
    }
}
