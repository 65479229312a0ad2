//! Experiment tracking: a training run's parameters, every step's metrics and its outcome sent to
//! an MLflow tracking server and written as TensorBoard event files, beside `metrics.jsonl`.

use super::ConfigError;
use super::rollout::is_http_url;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where a run's metrics go besides `metrics.jsonl` (any of them, or none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrackingConfig {
    /// An MLflow tracking server, through its REST API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowConfig>,
    /// TensorBoard event files (which `wandb sync --sync-tensorboard` imports into W&B).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<TensorboardConfig>,
}

/// An MLflow run: the resolved config as its parameters, each step's metrics, the final
/// checkpoint's path as the tag `kart.checkpoint`, and FINISHED, FAILED or KILLED at the end. A
/// resumed run continues the same MLflow run. The server's credentials come from the variables
/// MLflow's own client reads: `MLFLOW_TRACKING_TOKEN`, or `MLFLOW_TRACKING_USERNAME` and
/// `MLFLOW_TRACKING_PASSWORD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MlflowConfig {
    /// The tracking server's URL (`http://mlflow.mlflow:5000`).
    pub tracking_uri: String,
    /// The experiment the run belongs to, created when missing.
    pub experiment: String,
    /// The run's name; unset: the name of `output_dir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_name: Option<String>,
    /// Steps whose metrics are held while the server cannot be reached (sent once it can); beyond
    /// it the oldest are dropped, and a warning says which.
    pub buffer_steps: usize,
    /// Seconds the end of a run waits for what is still unsent before it gives up on it (and
    /// warns of what was lost).
    pub flush_secs: f64,
}

impl Default for MlflowConfig {
    fn default() -> Self {
        MlflowConfig {
            tracking_uri: String::new(),
            experiment: "kart".into(),
            run_name: None,
            buffer_steps: 100_000,
            flush_secs: 60.0,
        }
    }
}

/// TensorBoard event files, one scalar per metric and step, as TensorBoard's own writers write
/// them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TensorboardConfig {
    /// The folder of the event files (`tensorboard --logdir` it); relative to `output_dir`.
    pub dir: PathBuf,
}

impl Default for TensorboardConfig {
    fn default() -> Self {
        TensorboardConfig { dir: PathBuf::from("tensorboard") }
    }
}

impl TrackingConfig {
    /// Checks what serde cannot (field names relative to the tracking section).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(m) = &self.mlflow {
            m.validate().map_err(|e| e.within("mlflow"))?;
        }
        if let Some(t) = &self.tensorboard
            && t.dir.as_os_str().is_empty()
        {
            return Err(ConfigError::new("tensorboard.dir", "\"\"", "must name a folder"));
        }
        Ok(())
    }
}

impl MlflowConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if !is_http_url(&self.tracking_uri) {
            let value = format!("{:?}", self.tracking_uri);
            return Err(ConfigError::new(
                "tracking_uri",
                value,
                "must be the http(s) URL of a tracking server",
            ));
        }
        if self.experiment.trim().is_empty() {
            return Err(ConfigError::new("experiment", format!("{:?}", self.experiment), "must be a name"));
        }
        if let Some(name) = self.run_name.as_deref().filter(|n| n.trim().is_empty()) {
            return Err(ConfigError::new("run_name", format!("{name:?}"), "must be a name, or unset"));
        }
        if self.buffer_steps == 0 {
            return Err(ConfigError::new("buffer_steps", 0, "must be at least 1"));
        }
        if !(self.flush_secs >= 0.0 && std::time::Duration::try_from_secs_f64(self.flush_secs).is_ok()) {
            return Err(ConfigError::new("flush_secs", self.flush_secs, "must be a number of seconds >= 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlflow(uri: &str) -> TrackingConfig {
        TrackingConfig {
            mlflow: Some(MlflowConfig { tracking_uri: uri.into(), ..MlflowConfig::default() }),
            tensorboard: None,
        }
    }

    #[test]
    fn each_bad_setting_is_named_with_its_value() {
        assert!(mlflow("http://mlflow:5000").validate().is_ok());
        let e = mlflow("mlflow:5000").validate().unwrap_err();
        assert_eq!((e.field.as_str(), e.value.as_str()), ("mlflow.tracking_uri", "\"mlflow:5000\""));
        let mut c = mlflow("https://mlflow");
        c.mlflow.as_mut().unwrap().experiment = " ".into();
        assert_eq!(c.validate().unwrap_err().field, "mlflow.experiment");
        let mut c = mlflow("https://mlflow");
        c.mlflow.as_mut().unwrap().buffer_steps = 0;
        assert_eq!(c.validate().unwrap_err().field, "mlflow.buffer_steps");
        let mut c = mlflow("https://mlflow");
        c.mlflow.as_mut().unwrap().flush_secs = f64::NAN;
        assert_eq!(c.validate().unwrap_err().field, "mlflow.flush_secs");
        let c = TrackingConfig { mlflow: None, tensorboard: Some(TensorboardConfig { dir: PathBuf::new() }) };
        assert_eq!(c.validate().unwrap_err().field, "tensorboard.dir");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = serde_json::from_str::<TrackingConfig>(r#"{"wandb": {}}"#).unwrap_err();
        assert!(e.to_string().contains("wandb"), "{e}");
        let c: TrackingConfig =
            serde_json::from_str(r#"{"mlflow": {"tracking_uri": "http://m:5000"}, "tensorboard": {}}"#)
                .unwrap();
        assert_eq!(c.mlflow.unwrap().experiment, "kart");
        assert_eq!(c.tensorboard.unwrap().dir, PathBuf::from("tensorboard"));
    }
}
