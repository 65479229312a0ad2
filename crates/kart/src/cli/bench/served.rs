//! Single queries against `kart retriever serve` over HTTP, as a rollout worker sends them: one
//! `POST /retrieve` per query (`{"queries": [q], "topk": k, "return_scores": true}`) on a kept-alive
//! connection, from one client at a time and from one client per core.

use super::server::Server;
use anyhow::Context;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the server may take to open the index and answer `/readyz` (a deadline for a loaded
/// machine, not an expected time).
const READY_WITHIN: Duration = Duration::from_secs(600);

/// Latencies of the served queries and their wall time, one client and `clients` clients.
pub(super) struct Served {
    pub sequential: Vec<Duration>,
    pub sequential_wall: Duration,
    pub concurrent: Vec<Duration>,
    pub concurrent_wall: Duration,
    /// The server's resident memory after the queries, in MB.
    pub server_rss_mb: f64,
}

/// Serves `index` with this binary's `kart retriever serve` and sends it every query, first one at
/// a time, then from `clients` clients at once.
pub(super) fn served(
    index: &Path,
    queries: &[String],
    topk: usize,
    clients: usize,
) -> anyhow::Result<Served> {
    let port = Server::free_port()?;
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["retriever", "serve", "--index"]).arg(index).args(["--port", &port.to_string()]);
    command.args(["--host", "127.0.0.1"]);
    let mut server = Server::spawn("kart retriever serve", command, port)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        server.ready_at("/readyz", READY_WITHIN).await?;
        let url = format!("{}/retrieve", server.url);
        let client = reqwest::Client::new();
        // Warm-up: the connection, and the index's pages the queries touch.
        send_all(&client, &url, queries, topk).await?;
        let started = Instant::now();
        let sequential = send_all(&client, &url, queries, topk).await?;
        let sequential_wall = started.elapsed();
        let started = Instant::now();
        let share = queries.len().div_ceil(clients.max(1));
        let per_client = futures::future::try_join_all(
            queries.chunks(share).map(|chunk| send_all(&client, &url, chunk, topk)),
        )
        .await?;
        let concurrent_wall = started.elapsed();
        let server_rss_mb = server.rss_mb();
        Ok(Served {
            sequential,
            sequential_wall,
            concurrent: per_client.concat(),
            concurrent_wall,
            server_rss_mb,
        })
    })
}

/// One query at a time; each answer must be a result list per query.
async fn send_all(
    client: &reqwest::Client,
    url: &str,
    queries: &[String],
    topk: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(queries.len());
    for query in queries {
        let body = serde_json::json!({"queries": [query], "topk": topk, "return_scores": true});
        let began = Instant::now();
        let answer: serde_json::Value = client
            .post(url)
            .json(&body)
            .send()
            .await?
            .error_for_status()
            .with_context(|| format!("POST {url} with {query:?}"))?
            .json()
            .await?;
        latencies.push(began.elapsed());
        anyhow::ensure!(answer["result"].as_array().is_some_and(|r| r.len() == 1), "{url} answered {answer}");
    }
    Ok(latencies)
}
