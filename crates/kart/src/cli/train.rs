//! `kart train`: a training run from a config file, serving `/status`, `/metrics` and
//! `/weights/{version}` while it runs, and writing the final status to `$KART_STATUS_FILE` when set
//! (the operator points it at the pod's termination message).
//!
//! In a data-parallel run (`RANK`, `WORLD_SIZE`, ... set, or `--nproc-per-node` starting the
//! ranks) rank 0 does all of that; the other ranks follow its orders and compute their share of
//! each update, and the first rank of each other node answers its pod's probes.

use anyhow::Context;
use clap::Args;
use kart_core::config::train::TrainConfig;
use kart_http::Readiness;
use kart_http::token::Token;
use kart_torch::Ranks;
use kart_tracking::RunStatus;
use kart_train::follower::Follower;
use kart_train::server::{Phase, StatusHandle, router};
use kart_train::trainer::{Ending, Serving, Trainer};
use kart_train::weights::WeightStore;
use kart_viewer::Rollouts;
use prometheus::Registry;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// The exit code of a run stopped by a termination signal: 128 + SIGTERM, as if the signal had
/// ended the process.
const STOPPED: u8 = 143;

/// Train a policy with RL (GRPO, Dr. GRPO, RLOO or PPO) against a rollout pool.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Configuration file (JSON, the `TrainConfig` the operator renders).
    #[arg(long)]
    config: PathBuf,
    /// Continue from the newest checkpoint in the output folder, if there is one.
    #[arg(long)]
    resume: bool,
    /// Port of `/status`, `/metrics` and `/weights` (overrides the file; 0 picks a free one).
    #[arg(long)]
    port: Option<u16>,
    /// Start this many trainer processes (ranks) on this node, as torchrun does: `auto` is one per
    /// visible GPU, a number that many processes (CPU processes without GPUs).
    #[arg(long, value_name = "N|auto")]
    nproc_per_node: Option<super::launch::NprocPerNode>,
    /// Dotted overrides of the file's keys, as verl's command lines give them
    /// (`optim.lr=1e-6 batch.n=8`); a value is JSON when it parses as JSON, else a string.
    #[arg(value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

/// Serves `/healthz`, `/readyz` and `/metrics` at the config's address from a thread of its own.
fn serve_probes(config: &TrainConfig, ready: Readiness) -> anyhow::Result<()> {
    let addr = kart_http::bind_address(&config.host, config.port);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("listen on {addr}"))?;
    let app = kart_http::ops_routes(Registry::new(), ready);
    std::thread::spawn(move || runtime.block_on(kart_http::serve(listener, app)));
    Ok(())
}

/// How long a failed run waits for a termination signal before it reports the failure.
const SIGNAL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

pub fn run(args: TrainArgs) -> anyhow::Result<ExitCode> {
    if let Some(nproc) = args.nproc_per_node {
        let mut child: Vec<std::ffi::OsString> = vec!["train".into(), "--config".into(), args.config.into()];
        if args.resume {
            child.push("--resume".into());
        }
        if let Some(port) = args.port {
            child.extend(["--port".into(), port.to_string().into()]);
        }
        child.extend(args.overrides.iter().map(Into::into));
        return Ok(ExitCode::from(super::launch::run(nproc, child, None)?));
    }
    let ranks = Ranks::from_env()?;
    let path = args.config.display().to_string();
    let text = std::fs::read_to_string(&args.config).with_context(|| format!("--config {path}"))?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("--config {path}"))?;
    kart_core::config::overrides::apply(&mut value, &args.overrides)?;
    let mut config: TrainConfig =
        serde_json::from_value(value).with_context(|| format!("--config {path} with the overrides"))?;
    if let Some(port) = args.port {
        config.port = port;
    }
    if !ranks.is_leader() {
        // Rank 0 decides when the run stops: on a termination signal it writes a checkpoint, for
        // which it needs the other ranks, and then tells them the run is over. (The pod's kill at
        // the end of its grace period, or the launcher's after a failure, ends a rank that
        // outlives it.)
        // SAFETY: only the disposition of two signals changes, which nothing else here handles.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_IGN);
        }
        // The first rank of every other node answers its pod's probes; rank 0 serves the run.
        let ready = Readiness::default();
        if ranks.local_rank == 0 {
            serve_probes(&config, ready.clone())?;
        }
        let follower = Follower::build(config, args.resume, &ranks)?;
        ready.set(true);
        let steps = follower.run()?;
        tracing::info!(rank = ranks.rank, steps, "rank finished");
        return Ok(ExitCode::SUCCESS);
    }
    tokio::runtime::Runtime::new()?.block_on(async move {
        let registry = Registry::new();
        let (status, weights, ready) =
            (StatusHandle::default(), WeightStore::default(), Readiness::default());
        let addr = kart_http::bind_address(&config.host, config.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("listen on {addr}"))?;
        let port = listener.local_addr()?.port();
        tracing::info!(port, "trainer listening");
        let token = Token::from_env()?;
        kart_http::token::log_state("trainer", token.as_ref());
        // The trajectory viewer (`/ui`) over the run's `rollouts.jsonl`.
        let rollouts = Arc::new(Rollouts::new(&config.output_dir.join(kart_train::dump::FILE)));
        let app = router(status.clone(), weights.clone(), registry.clone(), ready.clone(), token.clone())
            .merge(kart_viewer::router(rollouts));
        tokio::spawn(async move { kart_http::serve(listener, app).await });
        let host = std::env::var("POD_IP").unwrap_or_else(|_| "127.0.0.1".into());
        let advertise = format!("http://{host}:{port}");
        let trainer = tokio::task::block_in_place(|| {
            let serving = Serving { host, advertise_url: advertise, token };
            Trainer::build(config, args.resume, &ranks, &registry, status.clone(), weights, serving)
        })?;
        let tracker = trainer.tracker();
        ready.set(true);
        // A pod being deleted, suspended, preempted or evicted gets SIGTERM: the step in progress
        // finishes its update, a checkpoint of it is written, and a resumed run continues there.
        let (signalled, signal) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            kart_http::shutdown_signal().await;
            let _ = signalled.send(true);
        });
        let heard = |mut signal: tokio::sync::watch::Receiver<bool>| async move {
            let _ = signal.wait_for(|s| *s).await;
        };
        let result = trainer.run_until(heard(signal.clone())).await;
        // Deleting a pod also takes away what it talks to (its Service, its workers), so a step
        // can fail just before the signal arrives: a failure the signal follows within a moment
        // is a stop (with the checkpoint the run had).
        let ending = match result {
            Err(error) => match tokio::time::timeout(SIGNAL_GRACE, heard(signal)).await {
                Ok(()) => {
                    tracing::warn!(%error, "the run failed as a termination signal arrived");
                    let s = status.get();
                    let checkpoint = s.checkpoint.map(PathBuf::from);
                    Ok(Ending::Stopped { step: s.step, checkpoint })
                }
                Err(_) => Err(error),
            },
            ending => ending,
        };
        if let Ok(Ending::Stopped { .. }) = &ending {
            status.update(|s| s.phase = Phase::Stopped);
        }
        tracker
            .finish(match &ending {
                Ok(Ending::Finished(_)) => RunStatus::Finished,
                Ok(Ending::Stopped { .. }) => RunStatus::Killed,
                Err(_) => RunStatus::Failed,
            })
            .await;
        // The operator reads the final status from this file (a pod's termination message).
        super::status_file::write(&status.get())?;
        let summary = match ending? {
            Ending::Finished(summary) => *summary,
            Ending::Stopped { step, checkpoint } => {
                let at = checkpoint.map_or_else(|| "none".into(), |c| c.display().to_string());
                eprintln!("stopped by a termination signal after step {step}; checkpoint: {at}");
                return Ok(ExitCode::from(STOPPED));
            }
        };
        let em = |r: &Option<kart_train::eval::Evaluation>| {
            r.as_ref().map(|r| format!("{:.3}", r.greedy.all.exact_match))
        };
        println!(
            "trained {} steps; held-out EM {} -> {}; model: {}",
            summary.steps,
            em(&summary.first_eval).unwrap_or_else(|| "n/a".into()),
            em(&summary.last_eval).unwrap_or_else(|| "n/a".into()),
            summary.model_dir.display()
        );
        Ok(ExitCode::SUCCESS)
    })
}
