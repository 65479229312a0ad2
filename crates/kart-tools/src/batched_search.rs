//! Concurrent searches coalesced into batched requests, as Search-R1's rollout posts every query
//! of a turn in one `/retrieve` call.
//!
//! Searches queue with at most `in_flight` requests outstanding. A search arriving while a slot is
//! free goes out at once, alone, from its own task; searches arriving while every slot is taken
//! wait together and leave as one request (of one `topk`, at most [`MAX_BATCH_QUERIES`] queries)
//! when a slot frees. So an idle retriever sees single queries with no added latency and no hand-
//! off between tasks, and a burst of trajectories reaching their search at the same moment costs
//! a few HTTP round trips instead of one each.

use kart_core::agent::search_r1::RetrievalResult;
use kart_core::tool::{Search, Searched, ToolError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Most queries in one batched request.
pub const MAX_BATCH_QUERIES: usize = 512;

type Answer = Result<Vec<Vec<RetrievalResult>>, ToolError>;

/// A search waiting for its batch.
struct Pending {
    /// Tells a caller's own search from the others.
    id: u64,
    queries: Vec<String>,
    topk: usize,
    reply: oneshot::Sender<Answer>,
}

/// A search tool whose concurrent calls reach `inner` in batches, at most `in_flight` at a time.
pub struct BatchedSearch {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Search>,
    queue: Mutex<VecDeque<Pending>>,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
}

/// A request slot; freeing it sends what queued meanwhile.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
}

impl BatchedSearch {
    /// Wraps `inner`, with at most `in_flight` requests outstanding.
    pub fn new(inner: Arc<dyn Search>, in_flight: usize) -> Self {
        let slots = Arc::new(Semaphore::new(in_flight.max(1)));
        let shared = Shared { inner, queue: Mutex::default(), slots, next_id: AtomicU64::new(0) };
        BatchedSearch { shared: Arc::new(shared) }
    }
}

impl Search for BatchedSearch {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            self.shared.lock().push_back(Pending { id, queries: queries.to_vec(), topk, reply });
            if let Some((slot, batch)) = Shared::claim(&self.shared) {
                if let [own] = batch.as_slice()
                    && own.id == id
                {
                    // Alone: sent from this task, no hand-off.
                    send(slot, batch).await;
                } else {
                    // Others' searches too: sent from a task of its own, which this caller's
                    // cancellation cannot take down with it.
                    tokio::spawn(send(slot, batch));
                }
            }
            let gone = || ToolError { tool: "search", reason: "the search was dropped unanswered".into() };
            answer.await.map_err(|_| gone())?
        })
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A free slot and the batch at the head of the queue (the first search, then those after it
    /// of its `topk`, up to [`MAX_BATCH_QUERIES`]), when both are there.
    fn claim(shared: &Arc<Shared>) -> Option<(Slot, Vec<Pending>)> {
        let mut queue = shared.lock();
        let topk = queue.front()?.topk;
        let permit = shared.slots.clone().try_acquire_owned().ok()?;
        let mut batch = Vec::new();
        let mut queries = 0;
        while let Some(next) = queue.front() {
            let fits = batch.is_empty() || queries + next.queries.len() <= MAX_BATCH_QUERIES;
            if next.topk != topk || !fits {
                break;
            }
            queries += next.queries.len();
            batch.extend(queue.pop_front());
        }
        Some((Slot { permit: Some(permit), shared: shared.clone() }, batch))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.permit.take());
        // Searches that queued while every slot was taken leave now, from a task of their own.
        if let Ok(runtime) = tokio::runtime::Handle::try_current()
            && let Some((slot, batch)) = Shared::claim(&self.shared)
        {
            runtime.spawn(send(slot, batch));
        }
    }
}

/// Sends `batch` in `slot`, then frees the slot.
async fn send(slot: Slot, batch: Vec<Pending>) {
    answer(slot.shared.inner.as_ref(), batch).await;
    drop(slot);
}

/// Sends `batch` as one search and hands each caller its own queries' results (or the error).
async fn answer(inner: &dyn Search, batch: Vec<Pending>) {
    let topk = batch[0].topk;
    let queries: Vec<String> = batch.iter().flat_map(|p| p.queries.iter().cloned()).collect();
    let result = inner.search(&queries, topk).await.and_then(|results| {
        if results.len() == queries.len() {
            Ok(results)
        } else {
            Err(ToolError {
                tool: "search",
                reason: format!("the retriever answered {} of {} queries", results.len(), queries.len()),
            })
        }
    });
    match result {
        Ok(results) => {
            let mut results = results.into_iter();
            for p in batch {
                let own = results.by_ref().take(p.queries.len()).collect();
                let _ = p.reply.send(Ok(own));
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::tests::hits;
    use std::sync::Mutex;

    /// A backend recording each request's queries; with a `gate`, each request waits for a permit.
    struct Recording {
        requests: Mutex<Vec<(Vec<String>, usize)>>,
        gate: Option<Arc<Semaphore>>,
        short: bool,
    }

    impl Recording {
        fn new(gate: Option<Arc<Semaphore>>) -> Arc<Self> {
            Arc::new(Recording { requests: Mutex::new(Vec::new()), gate, short: false })
        }
    }

    impl Search for Recording {
        fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
            Box::pin(async move {
                self.requests.lock().unwrap().push((queries.to_vec(), topk));
                if let Some(gate) = &self.gate {
                    gate.acquire().await.expect("open gate").forget();
                }
                let n = if self.short { queries.len() - 1 } else { queries.len() };
                Ok(queries[..n].iter().map(|q| hits(q, topk)).collect())
            })
        }
    }

    fn q(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[tokio::test]
    async fn a_lone_search_goes_out_at_once_and_gets_its_own_results() {
        let backend = Recording::new(None);
        let search = BatchedSearch::new(backend.clone(), 2);
        let results = search.search(&["a".to_string(), "b".to_string()], 2).await.unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[1][0].document.title.as_deref(), Some("b"));
        assert_eq!(results[1].len(), 2);
        assert_eq!(*backend.requests.lock().unwrap(), vec![(vec!["a".to_string(), "b".to_string()], 2)]);
    }

    #[tokio::test]
    async fn searches_waiting_for_a_slot_leave_together_split_by_topk() {
        let gate = Arc::new(Semaphore::new(0));
        let backend = Recording::new(Some(gate.clone()));
        let search = Arc::new(BatchedSearch::new(backend.clone(), 1));
        let call = |query: &'static str, topk: usize| {
            let search = search.clone();
            tokio::spawn(async move { search.search(&q(query), topk).await })
        };
        // The first search takes the only slot; the next three queue behind it.
        let first = call("a", 3);
        while backend.requests.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let (b, c, d) = (call("b", 3), call("c", 3), call("d", 1));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(3);
        first.await.unwrap().unwrap();
        let b = b.await.unwrap().unwrap();
        let c = c.await.unwrap().unwrap();
        let d = d.await.unwrap().unwrap();
        assert_eq!((b[0][0].document.title.as_deref(), b[0].len()), (Some("b"), 3));
        assert_eq!((c[0][0].document.title.as_deref(), c[0].len()), (Some("c"), 3));
        assert_eq!((d[0][0].document.title.as_deref(), d[0].len()), (Some("d"), 1));
        let requests = backend.requests.lock().unwrap().clone();
        let bc = vec!["b".to_string(), "c".to_string()];
        assert_eq!(
            requests,
            vec![(q("a"), 3), (bc, 3), (q("d"), 1)],
            "b and c share a request; d, of another topk, follows"
        );
    }

    #[tokio::test]
    async fn a_cancelled_search_frees_its_slot_for_those_queued_behind_it() {
        let gate = Arc::new(Semaphore::new(0));
        let backend = Recording::new(Some(gate.clone()));
        let search = Arc::new(BatchedSearch::new(backend.clone(), 1));
        let call = |query: &'static str| {
            let search = search.clone();
            tokio::spawn(async move { search.search(&q(query), 2).await })
        };
        // `a` sends its request from its own task and waits at the gate; `b` queues behind it.
        let a = call("a");
        while backend.requests.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let b = call("b");
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(backend.requests.lock().unwrap().len(), 1, "b waits for the only slot");
        a.abort();
        assert!(a.await.unwrap_err().is_cancelled());
        gate.add_permits(1);
        let b = tokio::time::timeout(std::time::Duration::from_secs(10), b).await;
        let b = b.expect("b is sent once a's slot is free").unwrap().unwrap();
        assert_eq!(b[0][0].document.title.as_deref(), Some("b"));
        assert_eq!(*backend.requests.lock().unwrap(), vec![(q("a"), 2), (q("b"), 2)]);
    }

    #[tokio::test]
    async fn a_short_answer_fails_every_search_of_the_batch() {
        let backend = Arc::new(Recording { requests: Mutex::new(Vec::new()), gate: None, short: true });
        let search = BatchedSearch::new(backend, 1);
        let err = search.search(&["a".to_string(), "b".to_string()], 1).await.unwrap_err();
        assert_eq!(err.reason, "the retriever answered 1 of 2 queries");
    }
}
