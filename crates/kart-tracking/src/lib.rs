//! Experiment tracking of a training run, beside its `metrics.jsonl`: the run's parameters, each
//! step's metrics, its checkpoints and its outcome, sent to an MLflow tracking server
//! ([`mlflow`]) and written as TensorBoard event files ([`tensorboard`]), as
//! `tracking:` of the trainer's config asks.
//!
//! Tracking never stops training: the MLflow server is written to by a background task that
//! buffers and retries, and an event file that cannot be written is warned of and left.

pub mod mlflow;
pub mod params;
pub mod tensorboard;

use kart_core::config::tracking::TrackingConfig;
use mlflow::{Flushed, MlflowRun};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tensorboard::EventWriter;

/// How a run ended, in MLflow's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// It reached its last step.
    Finished,
    /// It failed.
    Failed,
    /// A termination signal stopped it (its pod was deleted, suspended or preempted); a resumed
    /// run continues the same MLflow run.
    Killed,
}

impl RunStatus {
    /// MLflow's name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

/// The tag naming a run's newest checkpoint folder.
pub const CHECKPOINT_TAG: &str = "kart.checkpoint";

/// The run being tracked; cloning it shares the run.
#[derive(Clone, Default)]
pub struct Tracker {
    mlflow: Option<Arc<MlflowRun>>,
    tensorboard: Option<Arc<Mutex<Option<EventWriter>>>>,
}

/// What a tracked run is.
pub struct Run<'a> {
    /// The training run's output folder (relative TensorBoard folders are under it, and MLflow's
    /// run id is kept in it).
    pub output_dir: &'a Path,
    /// Whether the training run resumed from a checkpoint (MLflow's run is then continued).
    pub resumed: bool,
    /// The run's parameters: the resolved config, flattened ([`params::flatten`]).
    pub params: Vec<(String, String)>,
}

impl Tracker {
    /// Starts what `config` asks for (within a tokio runtime, where MLflow's task runs). An event
    /// file that cannot be created is an error: the folder is wrong, and nothing would be written
    /// there.
    pub fn start(config: &TrackingConfig, run: Run<'_>) -> std::io::Result<Tracker> {
        let tensorboard = match &config.tensorboard {
            Some(tb) => {
                let writer = EventWriter::create(&run.output_dir.join(&tb.dir))?;
                tracing::info!(file = %writer.path().display(), "TensorBoard: writing events");
                Some(Arc::new(Mutex::new(Some(writer))))
            }
            None => None,
        };
        let mlflow = config.mlflow.as_ref().map(|m| {
            let name = run
                .output_dir
                .file_name()
                .map_or_else(|| "kart".into(), |n| n.to_string_lossy().into_owned());
            let mlflow = MlflowRun::start(m, &name, run.output_dir, run.resumed);
            // A resumed run's parameters were logged when it started (MLflow refuses to change one).
            if !run.resumed {
                mlflow.params(run.params);
            }
            Arc::new(mlflow)
        });
        Ok(Tracker { mlflow, tensorboard })
    }

    /// Whether anything is tracked.
    pub fn is_active(&self) -> bool {
        self.mlflow.is_some() || self.tensorboard.is_some()
    }

    /// Logs the metrics of `step` (non-finite values are left out).
    pub fn log(&self, step: u64, metrics: &[(String, f64)]) {
        if let Some(mlflow) = &self.mlflow {
            mlflow.metrics(step, metrics);
        }
        if let Some(tb) = &self.tensorboard {
            let mut writer = tb.lock().expect("event writer lock");
            if let Some(w) = writer.as_mut()
                && let Err(error) = w.scalars(step, metrics)
            {
                tracing::warn!(file = %w.path().display(), %error, step, "TensorBoard: the event file cannot be written; no more events are");
                *writer = None;
            }
        }
    }

    /// Records `dir` as the run's newest checkpoint.
    pub fn checkpoint(&self, dir: &Path) {
        if let Some(mlflow) = &self.mlflow {
            mlflow.tag(CHECKPOINT_TAG, &dir.display().to_string());
        }
    }

    /// Ends the run with `status`: MLflow gets what it has not yet taken (within its
    /// `flush_secs`); what it never got is in the answer and a warning.
    pub async fn finish(&self, status: RunStatus) -> Option<Flushed> {
        match &self.mlflow {
            Some(mlflow) => Some(mlflow.finish(status).await),
            None => None,
        }
    }
}
