//! Searching a local index from async code: on the calling task when a search is known to be
//! quick, on tokio's blocking pool otherwise.
//!
//! Handing a search to the blocking pool costs two thread wake-ups, and under load each waits
//! behind every task the runtime has ready: for a small BM25 index that wait was most of a
//! search's latency at 256 trajectories in flight. [`IndexSearcher`] learns how long one query
//! takes (a moving average over searches of one query) and runs a search on the calling task, one
//! query after another, when its queries should take at most [`INLINE_BUDGET`] together (tokio
//! asks for no more than 10 to 100 us between awaits); any other search, and every search before
//! the first measurement, goes to the blocking pool, where the index may parallelise a batch.

use crate::{LocalIndex, RetrieverError};
use kart_core::agent::search_r1::RetrievalResult;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest a search may be expected to take and still run on the calling task.
pub const INLINE_BUDGET: Duration = Duration::from_micros(100);

/// What a failed search is called in errors.
const WHAT: &str = "the index search";

/// A local index searched from async code.
pub struct IndexSearcher {
    index: Arc<dyn LocalIndex>,
    /// Moving average of one query's search time, in nanoseconds (`u64::MAX` before the first).
    query_nanos: Arc<AtomicU64>,
}

impl IndexSearcher {
    /// Searches `index`; its first searches go to the blocking pool.
    pub fn new(index: Arc<dyn LocalIndex>) -> IndexSearcher {
        IndexSearcher { index, query_nanos: Arc::new(AtomicU64::new(u64::MAX)) }
    }

    /// The index searched.
    pub fn index(&self) -> &Arc<dyn LocalIndex> {
        &self.index
    }

    /// The `topk` best documents for each query, best first. A panic in the index is an
    /// [`RetrieverError::Internal`] naming it, on either path.
    pub async fn search(
        &self,
        queries: Vec<String>,
        topk: usize,
    ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
        let expected = self.query_nanos.load(Ordering::Relaxed).saturating_mul(queries.len() as u64);
        if expected <= INLINE_BUDGET.as_nanos() as u64 {
            return std::panic::catch_unwind(AssertUnwindSafe(|| {
                queries.iter().map(|query| timed(&*self.index, &self.query_nanos, query, topk)).collect()
            }))
            .unwrap_or_else(|payload| Err(RetrieverError::panicked(WHAT, payload.as_ref())));
        }
        let (index, query_nanos) = (self.index.clone(), self.query_nanos.clone());
        tokio::task::spawn_blocking(move || match queries.as_slice() {
            [query] => timed(&*index, &query_nanos, query, topk).map(|hits| vec![hits]),
            _ => index.search_batch(&queries, topk),
        })
        .await
        .map_err(|e| RetrieverError::task_failed(WHAT, e))?
    }
}

/// Searches one query and folds its time into `query_nanos` (weight 1/8).
fn timed(
    index: &dyn LocalIndex,
    query_nanos: &AtomicU64,
    query: &str,
    topk: usize,
) -> Result<Vec<RetrievalResult>, RetrieverError> {
    let started = Instant::now();
    let hits = index.search_batch(&[query.to_string()], topk)?.pop().unwrap_or_default();
    let nanos = started.elapsed().as_nanos().clamp(1, u128::from(u64::MAX / 2)) as u64;
    let average = match query_nanos.load(Ordering::Relaxed) {
        u64::MAX => nanos,
        before => before - before / 8 + nanos / 8,
    };
    query_nanos.store(average, Ordering::Relaxed);
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::thread::ThreadId;

    /// An index that takes `cost` per query and records the thread of each call.
    struct Costly {
        cost: Duration,
        threads: Mutex<Vec<ThreadId>>,
    }

    impl LocalIndex for Costly {
        fn search_batch(
            &self,
            queries: &[String],
            _topk: usize,
        ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
            self.threads.lock().unwrap().push(std::thread::current().id());
            if queries.iter().any(|q| q == "boom") {
                panic!("index {} broke", 7);
            }
            let started = Instant::now();
            while started.elapsed() < self.cost * queries.len() as u32 {
                std::hint::spin_loop();
            }
            Ok(queries.iter().map(|_| Vec::new()).collect())
        }

        fn num_docs(&self) -> u64 {
            0
        }
    }

    fn searcher(cost: Duration) -> (IndexSearcher, Arc<Costly>) {
        let index = Arc::new(Costly { cost, threads: Mutex::new(Vec::new()) });
        (IndexSearcher::new(index.clone()), index)
    }

    fn q(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("query {i}")).collect()
    }

    /// Whether each call of `index` ran on the test's own thread (tokio's test runtime runs every
    /// task on it; the blocking pool has threads of its own).
    fn on_the_calling_task(index: &Costly) -> Vec<bool> {
        let here = std::thread::current().id();
        index.threads.lock().unwrap().iter().map(|&t| t == here).collect()
    }

    #[tokio::test]
    async fn quick_searches_run_on_the_calling_task_once_measured() {
        let (searcher, index) = searcher(Duration::ZERO);
        assert_eq!(searcher.search(q(1), 3).await.unwrap().len(), 1);
        assert_ne!(searcher.query_nanos.load(Ordering::Relaxed), u64::MAX, "the first search is measured");
        // What that measurement says of an index costing nothing, whatever a loaded machine's
        // thread hand-off added to it.
        searcher.query_nanos.store(1_000, Ordering::Relaxed);
        assert_eq!(searcher.search(q(3), 3).await.unwrap().len(), 3);
        assert_eq!(on_the_calling_task(&index), [false, true, true, true], "measured, then one by one");
        // A batch expected past the budget goes to the pool whole.
        let many = INLINE_BUDGET.as_nanos() as usize * 2;
        assert_eq!(searcher.search(q(many), 3).await.unwrap().len(), many);
        assert_eq!(on_the_calling_task(&index).last(), Some(&false));
    }

    #[tokio::test]
    async fn slow_searches_stay_on_the_blocking_pool() {
        let (searcher, index) = searcher(INLINE_BUDGET * 3);
        for _ in 0..3 {
            searcher.search(q(1), 3).await.unwrap();
        }
        assert_eq!(on_the_calling_task(&index), [false, false, false]);
    }

    #[tokio::test]
    async fn a_panicking_index_is_an_internal_error_on_either_path() {
        let (searcher, index) = searcher(Duration::ZERO);
        let error = searcher.search(vec!["boom".into()], 3).await.unwrap_err();
        assert_eq!(error.to_string(), "the index search failed unexpectedly: panicked: index 7 broke");
        searcher.search(q(1), 3).await.unwrap();
        // A quick index's measurement, however slowly a loaded machine ran that first search.
        searcher.query_nanos.store(1_000, Ordering::Relaxed);
        let error = searcher.search(vec!["boom".into()], 3).await.unwrap_err();
        assert_eq!(error.to_string(), "the index search failed unexpectedly: panicked: index 7 broke");
        assert_eq!(on_the_calling_task(&index), [false, false, true]);
    }
}
