//! A least-recently-used cache of upstream answers, counting hits and misses in
//! `kart_retriever_cache_requests_total`.

use super::register;
use crate::RetrieverError;
use lru::LruCache;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::{Mutex, PoisonError};

/// An LRU cache shared by concurrent requests; a capacity of 0 disables it.
pub(super) struct Cache<K, V> {
    backend: &'static str,
    entries: Option<Mutex<LruCache<K, V>>>,
    hits: IntCounter,
    misses: IntCounter,
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    /// A cache of at most `capacity` entries whose counters carry `backend`.
    pub(super) fn new(
        backend: &'static str,
        capacity: usize,
        registry: &Registry,
    ) -> Result<Self, RetrieverError> {
        let requests = IntCounterVec::new(
            Opts::new(
                "kart_retriever_cache_requests_total",
                "Lookups in the online retriever's caches, by result (hit, miss).",
            )
            .const_label("backend", backend),
            &["result"],
        )
        .expect("valid metric options");
        register(registry, &requests, "kart_retriever_cache_requests_total", backend)?;
        Ok(Cache {
            backend,
            entries: NonZeroUsize::new(capacity).map(|c| Mutex::new(LruCache::new(c))),
            hits: requests.with_label_values(&["hit"]),
            misses: requests.with_label_values(&["miss"]),
        })
    }

    /// The cached value of `key`, if any (counted as a hit or a miss).
    pub(super) fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let value = self.entries.as_ref().and_then(|entries| lock(entries).get(key).cloned());
        match value {
            Some(_) => self.hits.inc(),
            None => self.misses.inc(),
        }
        value
    }

    /// Stores `value` under `key`, evicting the least recently used entry when full.
    pub(super) fn put(&self, key: K, value: V) {
        if let Some(entries) = &self.entries {
            lock(entries).put(key, value);
        }
    }
}

/// The cache stays consistent even if a holder of the lock panicked: every operation on it is one
/// `LruCache` call.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Hash + Eq, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let capacity = self.entries.as_ref().map_or(0, |entries| lock(entries).cap().get());
        f.debug_struct("Cache").field("backend", &self.backend).field("capacity", &capacity).finish()
    }
}
