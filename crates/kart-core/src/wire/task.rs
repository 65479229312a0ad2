//! A task: one prompt of a dataset as the rollout API receives it.

use crate::chat::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One prompt to roll out: `{id, messages | prompt, ground_truth, data_source, tools}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique id of the prompt; the trajectories of one task form a group.
    pub id: String,
    /// The chat messages of the prompt (rendered with the model's chat template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// The question alone, when the environment builds the prompt itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Golden answers.
    pub ground_truth: Vec<String>,
    /// The dataset the task comes from (`nq`, `hotpotqa`, …), for per-source metrics.
    #[serde(default)]
    pub data_source: String,
    /// The functions offered to the model (OpenAI function schemas), for the `tools`
    /// environment; none: those of its config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
}

/// Why a task cannot be rolled out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskError {
    #[error("task `{id}`: needs `messages` or `prompt`")]
    NoPrompt { id: String },
    #[error("task `{id}`: {field}: {reason}")]
    Invalid { id: String, field: &'static str, reason: String },
}

impl Task {
    /// The prompt as chat messages: `messages`, or `prompt` as one user message built by `make`.
    pub fn messages_or(
        &self,
        make: impl FnOnce(&str) -> Result<String, String>,
    ) -> Result<Vec<ChatMessage>, TaskError> {
        match (&self.messages, &self.prompt) {
            (Some(m), _) if !m.is_empty() => Ok(m.clone()),
            (_, Some(p)) => {
                let content = make(p).map_err(|reason| TaskError::Invalid {
                    id: self.id.clone(),
                    field: "prompt",
                    reason,
                })?;
                Ok(vec![ChatMessage::new("user", content)])
            }
            _ => Err(TaskError::NoPrompt { id: self.id.clone() }),
        }
    }

    /// The question: `prompt`, else the last user message's content (empty without either).
    pub fn question(&self) -> String {
        match (&self.prompt, &self.messages) {
            (Some(prompt), _) => prompt.clone(),
            (None, Some(messages)) => messages
                .iter()
                .rev()
                .find(|m| m.role == "user")
                .map(|m| m.content.clone())
                .unwrap_or_default(),
            (None, None) => String::new(),
        }
    }
}
