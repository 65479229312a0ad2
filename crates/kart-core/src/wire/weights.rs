//! Where a policy version's weights are: what the trainer names and a worker loads.

use super::InvalidField;
use crate::config::lora::LoraConfig;
use crate::config::rollout::is_http_url;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the weights of a policy version are: the body of `POST /weights` and the `weights` field
/// of `POST /rollout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightSource {
    /// The policy version.
    pub version: i64,
    /// A URL serving the safetensors file (the trainer's `/weights/{version}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A safetensors file, or a folder holding `model.safetensors`, on a shared volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The trainer attempt (process) that published the version; engines holding weights of
    /// another attempt load it whatever its number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// With LoRA, the adapters' settings: the file then holds the adapters alone (PEFT's tensor
    /// names), applied over the base model the engine started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

const ONE_OF: &str = "give exactly one of `url` and `path`";

impl WeightSource {
    /// Checks the version and that exactly one of `url` (HTTP) and `path` is given.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let invalid = |field: &str, reason: String| Err(InvalidField::new(field, reason));
        if self.version < 0 {
            return invalid("version", format!("{} is negative", self.version));
        }
        if let Some(lora) = &self.lora {
            lora.validate().map_err(|e| {
                InvalidField::new(format!("lora.{}", e.field), format!("{} {}", e.value, e.reason))
            })?;
        }
        match (&self.url, &self.path) {
            (Some(url), None) if !is_http_url(url) => {
                invalid("url", format!("`{url}` is not an http(s) URL"))
            }
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => invalid("url", ONE_OF.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_their_bad_field() {
        let bad = [
            (r#"{"version": -1, "url": "http://t/weights/1"}"#, "version"),
            (r#"{"version": 1}"#, "url"),
            (r#"{"version": 1, "url": "http://t/w", "path": "/w"}"#, "url"),
            (r#"{"version": 1, "url": "/weights/1"}"#, "url"),
            (r#"{"version": 1, "url": "http://t/weights/1", "lora": {"r": 0}}"#, "lora.r"),
        ];
        for (text, field) in bad {
            let source: WeightSource = serde_json::from_str(text).unwrap();
            match source.validate() {
                Err(InvalidField { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let source: WeightSource = serde_json::from_str(r#"{"version": 2, "path": "/w"}"#).unwrap();
        assert!(source.validate().is_ok());
        let adapters: WeightSource = serde_json::from_str(
            r#"{"version": 2, "path": "/w", "lora": {"r": 4, "target_modules": "all-linear"}}"#,
        )
        .unwrap();
        assert_eq!(adapters.lora.as_ref().map(|l| l.r), Some(4));
        assert!(adapters.validate().is_ok());
        assert!(serde_json::from_str::<WeightSource>(r#"{"version": 2, "uri": "x"}"#).is_err());
    }
}
