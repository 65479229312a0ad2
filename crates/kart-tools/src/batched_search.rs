//! Concurrent searches coalesced into batched requests, as Search-R1's rollout posts every query
//! of a turn in one `/retrieve` call.
//!
//! Searches queue for a dispatcher that sends them on with at most `in_flight` requests
//! outstanding. A search arriving while a slot is free goes out at once, alone; searches arriving
//! while every slot is taken wait together and leave as one request (of one `topk`, at most
//! [`MAX_BATCH_QUERIES`] queries) when a slot frees. So an idle retriever sees single queries
//! with no added latency, and a burst of trajectories reaching their search at the same moment
//! costs a few HTTP round trips instead of one each.

use kart_core::agent::search_r1::RetrievalResult;
use kart_core::tool::{Search, Searched, ToolError};
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Most queries in one batched request.
pub const MAX_BATCH_QUERIES: usize = 512;

type Answer = Result<Vec<Vec<RetrievalResult>>, ToolError>;

/// A search waiting for its batch.
struct Pending {
    queries: Vec<String>,
    topk: usize,
    reply: oneshot::Sender<Answer>,
}

/// A search tool whose concurrent calls reach `inner` in batches, at most `in_flight` at a time.
pub struct BatchedSearch {
    queue: mpsc::UnboundedSender<Pending>,
}

impl BatchedSearch {
    /// Wraps `inner`; the dispatcher runs on the current tokio runtime until this is dropped.
    pub fn new(inner: Arc<dyn Search>, in_flight: usize) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        tokio::spawn(dispatch(inner, pending, in_flight.max(1)));
        BatchedSearch { queue }
    }
}

impl Search for BatchedSearch {
    fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> Searched<'a> {
        Box::pin(async move {
            let gone = || ToolError { tool: "search", reason: "the search dispatcher stopped".into() };
            let (reply, answer) = oneshot::channel();
            self.queue.send(Pending { queries: queries.to_vec(), topk, reply }).map_err(|_| gone())?;
            answer.await.map_err(|_| gone())?
        })
    }
}

/// Takes a free slot, then everything queued by then (of the first search's `topk`, up to
/// [`MAX_BATCH_QUERIES`]) as one request.
async fn dispatch(inner: Arc<dyn Search>, mut pending: mpsc::UnboundedReceiver<Pending>, in_flight: usize) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut next: Option<Pending> = None;
    loop {
        let first = match next.take() {
            Some(p) => p,
            None => match pending.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        let mut queries = batch[0].queries.len();
        while queries < MAX_BATCH_QUERIES {
            match pending.try_recv() {
                Ok(p) if p.topk == batch[0].topk && queries + p.queries.len() <= MAX_BATCH_QUERIES => {
                    queries += p.queries.len();
                    batch.push(p);
                }
                Ok(p) => {
                    next = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let inner = inner.clone();
        tokio::spawn(async move {
            let _slot = slot;
            answer(inner.as_ref(), batch).await;
        });
    }
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
    async fn a_short_answer_fails_every_search_of_the_batch() {
        let backend = Arc::new(Recording { requests: Mutex::new(Vec::new()), gate: None, short: true });
        let search = BatchedSearch::new(backend, 1);
        let err = search.search(&["a".to_string(), "b".to_string()], 1).await.unwrap_err();
        assert_eq!(err.reason, "the retriever answered 1 of 2 queries");
    }
}
