//! The configuration of every component: one serde type each, read by the `kart` commands
//! (`--config FILE`) and embedded by the operator in its custom resources (`spec.config`), which
//! renders them into the ConfigMaps the pods read. Defaults follow the upstream reference where
//! one exists; unknown keys are errors naming the key.

pub mod env;
pub mod functions;
pub mod lora;
pub mod memory;
pub mod overrides;
pub mod retriever;
pub mod retry;
pub mod reward;
pub mod rollout;
pub mod sandbox;
pub mod tracking;
pub mod train;
pub mod weight_sources;
pub mod workflow;

/// A setting out of its range, naming the field (its path from the config's root) and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub value: String,
    pub reason: &'static str,
}

impl ConfigError {
    /// `field` holds `value`, which is wrong because of `reason`.
    pub fn new(field: impl Into<String>, value: impl std::fmt::Display, reason: &'static str) -> Self {
        ConfigError { field: field.into(), value: value.to_string(), reason }
    }

    /// The same error for a field inside `parent` (`index` within `rollout` is `rollout.index`).
    pub fn within(self, parent: &str) -> Self {
        ConfigError { field: format!("{parent}.{}", self.field), ..self }
    }
}
