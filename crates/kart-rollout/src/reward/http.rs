//! An HTTP reward service scoring trajectories in batches: requests wait up to `batch_wait_ms`
//! for others to fill a batch of `batch_size`, and one `POST {"trajectories": [...]}` scores
//! them all (`{"scores": [...]}`, one per trajectory, each a number or `{"score", "metrics"}`).

use super::{Score, Scoring};
use kart_core::config::reward::HttpReward;
use kart_tools::post::client;
use kart_tools::post::post_json;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OnceCell, Semaphore, mpsc, oneshot};

type Reply = oneshot::Sender<Result<Score, String>>;

/// A batching client of one HTTP reward service.
pub struct HttpScorer {
    config: HttpReward,
    client: reqwest::Client,
    /// The queue of the batching task, started by the first score asked for.
    queue: OnceCell<mpsc::UnboundedSender<(Scoring, Reply)>>,
}

impl HttpScorer {
    pub fn new(config: &HttpReward) -> Self {
        let client = client(config.limits.timeout_secs);
        HttpScorer { config: config.clone(), client, queue: OnceCell::new() }
    }

    /// The score of `scoring`, once its batch is answered.
    pub async fn score(&self, scoring: &Scoring) -> Result<Score, String> {
        let queue = self.queue.get_or_init(|| async { self.start() }).await;
        let (tx, rx) = oneshot::channel();
        queue.send((scoring.clone(), tx)).map_err(|_| "the batching task stopped".to_owned())?;
        rx.await.map_err(|_| "the batching task dropped the request".to_owned())?
    }

    /// Starts the task that gathers requests into batches and posts them.
    fn start(&self) -> mpsc::UnboundedSender<(Scoring, Reply)> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Scoring, Reply)>();
        let (config, client) = (self.config.clone(), self.client.clone());
        let slots = Arc::new(Semaphore::new(config.limits.concurrency));
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let deadline = tokio::time::Instant::now() + Duration::from_millis(config.batch_wait_ms);
                while batch.len() < config.batch_size {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(next)) => batch.push(next),
                        _ => break,
                    }
                }
                let permit = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
                let (config, client) = (config.clone(), client.clone());
                tokio::spawn(async move {
                    let (items, replies): (Vec<Scoring>, Vec<Reply>) = batch.into_iter().unzip();
                    let scores = post_batch(&client, &config, &items).await;
                    drop(permit);
                    for (i, reply) in replies.into_iter().enumerate() {
                        let _ = reply.send(scores.as_ref().map(|s| s[i].clone()).map_err(Clone::clone));
                    }
                });
            }
        });
        tx
    }
}

/// One batch's scores, in order.
async fn post_batch(
    client: &reqwest::Client,
    config: &HttpReward,
    items: &[Scoring],
) -> Result<Vec<Score>, String> {
    let body = json!({"trajectories": items});
    let text = post_json(client, &config.url, &body, HeaderMap::new(), &config.limits.retry)
        .await
        .map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_str(&text).map_err(|e| format!("the answer is not JSON ({e})"))?;
    let scores = answer["scores"].as_array().ok_or("the answer has no `scores` list")?;
    if scores.len() != items.len() {
        return Err(format!("{} scores for {} trajectories", scores.len(), items.len()));
    }
    scores
        .iter()
        .enumerate()
        .map(|(i, s)| score_of(s).map_err(|reason| format!("scores[{i}]: {reason}")))
        .collect()
}

/// A score entry: a number, or `{"score": number, "metrics": {name: number}}`.
fn score_of(value: &Value) -> Result<Score, String> {
    let number = |v: &Value| v.as_f64().filter(|x| x.is_finite());
    if let Some(score) = number(value) {
        return Ok(Score { score, metrics: Default::default() });
    }
    let score = number(&value["score"]).ok_or_else(|| format!("no finite `score` in {value}"))?;
    let metrics = value["metrics"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| number(v).map(|x| (k.clone(), x))).collect())
        .unwrap_or_default();
    Ok(Score { score, metrics })
}
