//! `kart plot METRICS --out FILE.png`: charts of a training run.

use kart::plot::{PANELS, plot_metrics};
use std::path::PathBuf;
use std::process::ExitCode;

/// Draw a training run's reward, evaluation exact match, KL and tool calls over steps as a PNG.
///
/// METRICS is the trainer's `metrics.jsonl` (one JSON object per step). A metric that never
/// appears gets a panel saying "no data".
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The metrics JSON-lines file.
    metrics: PathBuf,
    /// The PNG to write.
    #[arg(long, value_name = "FILE.png")]
    out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let points = plot_metrics(&args.metrics, &args.out)?;
    let counts: Vec<String> = PANELS.iter().zip(points).map(|((key, ..), n)| format!("{key}: {n}")).collect();
    println!("wrote {} ({} points)", args.out.display(), counts.join(", "));
    Ok(ExitCode::SUCCESS)
}
