//! `kart view DIR`: a run's trajectory viewer in the browser, from its `rollouts.jsonl`.

use anyhow::{Context, bail};
use kart_http::Readiness;
use kart_viewer::Rollouts;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Serve a run's trajectory viewer: its steps, rewards and tool calls, and each trajectory as the
/// conversation it was, at http://HOST:PORT/ui/ (what the trainer serves at /ui while it runs).
///
/// RUN is the run's output folder (its `rollouts.jsonl`, written with `dump_rollouts: true`) or
/// a rollouts file. The file is read as it grows, so a run still training can be watched too.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run's output folder, or its rollouts JSON-lines file.
    run: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: a free one, printed).
    #[arg(long, default_value_t = 8090)]
    port: u16,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = if args.run.is_dir() { args.run.join(kart_train::dump::FILE) } else { args.run.clone() };
    if !file.is_file() {
        let hint = if args.run.is_dir() {
            " (the run was trained without `dump_rollouts: true`, or has not finished a step)"
        } else {
            ""
        };
        bail!("{}: no such file{hint}", file.display());
    }
    tokio::runtime::Runtime::new()?.block_on(async move {
        let addr = kart_http::bind_address(&args.host, args.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("listen on {addr}"))?;
        let port = listener.local_addr()?.port();
        let ready = Readiness::default();
        ready.set(true);
        let app = kart_viewer::router(Arc::new(Rollouts::new(&file)))
            .merge(kart_http::ops_routes(prometheus::Registry::new(), ready));
        println!("viewing {} at http://{}:{port}/ui/", file.display(), args.host);
        kart_http::serve(listener, app).await?;
        Ok(ExitCode::SUCCESS)
    })
}
