//! A least-recently-used cache of upstream answers, bounded in entries and in bytes, counting hits
//! and misses in `kart_retriever_cache_requests_total`.

use super::register;
use crate::RetrieverError;
use lru::LruCache;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

/// The bytes an entry holds on the heap (its key's and value's text); [`Cache`] adds the size of
/// the entry itself.
pub(super) type Weigh<K, V> = fn(&K, &V) -> usize;

/// An LRU cache shared by concurrent requests, holding at most `capacity` entries and
/// `capacity_bytes` bytes; either capacity 0 disables it.
pub(super) struct Cache<K, V> {
    backend: &'static str,
    entries: Option<Mutex<Entries<K, V>>>,
    hits: IntCounter,
    misses: IntCounter,
}

/// The cached entries and the bytes they hold.
struct Entries<K, V> {
    lru: LruCache<K, V>,
    capacity: usize,
    capacity_bytes: usize,
    bytes: usize,
    weigh: Weigh<K, V>,
}

impl<K: Hash + Eq, V> Entries<K, V> {
    /// The bytes `key` and `value` take in the cache: their heap bytes and the entry itself.
    fn weight(&self, key: &K, value: &V) -> usize {
        (self.weigh)(key, value).saturating_add(size_of::<(K, V)>())
    }

    fn put(&mut self, key: K, value: V) {
        let weight = self.weight(&key, &value);
        if let Some(old) = self.lru.pop(&key) {
            self.bytes -= self.weight(&key, &old);
        }
        if weight > self.capacity_bytes {
            return;
        }
        while self.lru.len() >= self.capacity || self.bytes + weight > self.capacity_bytes {
            let Some((evicted, value)) = self.lru.pop_lru() else { break };
            self.bytes -= self.weight(&evicted, &value);
        }
        self.bytes += weight;
        self.lru.put(key, value);
    }
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    /// A cache of at most `capacity` entries and `capacity_bytes` bytes (each entry weighing
    /// `weigh` plus its own size) whose counters carry `backend`.
    pub(super) fn new(
        backend: &'static str,
        capacity: usize,
        capacity_bytes: usize,
        weigh: Weigh<K, V>,
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
        let entries = (capacity > 0 && capacity_bytes > 0).then(|| {
            Mutex::new(Entries { lru: LruCache::unbounded(), capacity, capacity_bytes, bytes: 0, weigh })
        });
        Ok(Cache {
            backend,
            entries,
            hits: requests.with_label_values(&["hit"]),
            misses: requests.with_label_values(&["miss"]),
        })
    }

    /// The cached value of `key`, if any (counted as a hit or a miss).
    pub(super) fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let value = self.entries.as_ref().and_then(|entries| lock(entries).lru.get(key).cloned());
        match value {
            Some(_) => self.hits.inc(),
            None => self.misses.inc(),
        }
        value
    }

    /// Stores `value` under `key`, evicting the least recently used entries while the cache would
    /// hold more than its entries or bytes; a value larger than the whole byte budget is not kept.
    pub(super) fn put(&self, key: K, value: V) {
        if let Some(entries) = &self.entries {
            lock(entries).put(key, value);
        }
    }

    /// The entries and bytes held.
    #[cfg(test)]
    pub(super) fn usage(&self) -> (usize, usize) {
        self.entries.as_ref().map_or((0, 0), |entries| {
            let entries = lock(entries);
            (entries.lru.len(), entries.bytes)
        })
    }
}

/// The cache stays consistent even if a holder of the lock panicked: no operation on it calls out
/// of this module between its updates of the entries and of the byte count.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Hash + Eq, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (capacity, capacity_bytes) = self.entries.as_ref().map_or((0, 0), |entries| {
            let entries = lock(entries);
            (entries.capacity, entries.capacity_bytes)
        });
        f.debug_struct("Cache")
            .field("backend", &self.backend)
            .field("capacity", &capacity)
            .field("capacity_bytes", &capacity_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_cache(capacity: usize, capacity_bytes: usize) -> (Cache<String, String>, Registry) {
        let registry = Registry::new();
        let weigh: Weigh<String, String> = |key, value| key.len() + value.len();
        (Cache::new("page", capacity, capacity_bytes, weigh, &registry).unwrap(), registry)
    }

    /// What an entry of a key of 4 bytes and a value of `len` bytes weighs.
    fn weight(len: usize) -> usize {
        4 + len + size_of::<(String, String)>()
    }

    #[test]
    fn stays_under_its_byte_budget_and_still_hits() {
        // Room for 3 entries of 1000 bytes, not 4; many more entries allowed.
        let (cache, _) = text_cache(10_000, 3 * weight(1000) + 10);
        for i in 0..150 {
            cache.put(format!("u{i:03}"), "x".repeat(1000));
            let (entries, bytes) = cache.usage();
            assert!(bytes <= 3 * weight(1000) + 10, "{bytes} bytes after {i} puts");
            assert_eq!(entries, (i + 1).min(3));
        }
        assert_eq!(cache.usage(), (3, 3 * weight(1000)));
        // The most recent pages hit; the evicted ones miss.
        assert!(cache.get("u149").is_some() && cache.get("u147").is_some());
        assert!(cache.get("u146").is_none() && cache.get("u000").is_none());
        // A hit refreshes its entry: u147 outlives u148 when a new page comes.
        cache.put("newp".into(), "y".repeat(1000));
        assert!(cache.get("u147").is_some() && cache.get("u148").is_none());
    }

    #[test]
    fn a_large_value_evicts_several_and_an_oversized_one_is_not_kept() {
        let (cache, _) = text_cache(100, 4 * weight(100));
        for i in 0..4 {
            cache.put(format!("k{i:03}"), "x".repeat(100));
        }
        assert_eq!(cache.usage(), (4, 4 * weight(100)));
        // Takes the room of two small entries (and a little more): the three oldest go.
        cache.put("bigv".into(), "b".repeat(2 * weight(100)));
        assert_eq!(cache.usage().0, 2);
        assert!(cache.get("k003").is_some() && cache.get("k002").is_none());
        // Replacing a key's value re-counts its bytes.
        cache.put("bigv".into(), "s".repeat(100));
        assert_eq!(cache.usage(), (2, 2 * weight(100)));
        // Larger than the whole budget: not cached, and nothing else evicted for it.
        cache.put("huge".into(), "h".repeat(4 * weight(100)));
        assert_eq!(cache.usage(), (2, 2 * weight(100)));
        assert!(cache.get("huge").is_none());
    }

    #[test]
    fn the_entry_bound_still_applies_and_zero_disables() {
        let (cache, _) = text_cache(2, 1 << 20);
        for i in 0..5 {
            cache.put(format!("k{i:03}"), "v".into());
        }
        assert_eq!(cache.usage(), (2, 2 * weight(1)));
        for (entries, bytes) in [(0, 1 << 20), (10, 0)] {
            let (cache, registry) = text_cache(entries, bytes);
            cache.put("k000".into(), "v".into());
            assert!(cache.get("k000").is_none());
            let misses = r#"kart_retriever_cache_requests_total{backend="page",result="miss"}"#;
            assert_eq!(crate::online::fake::sample(&registry, misses), 1.0);
        }
    }
}
