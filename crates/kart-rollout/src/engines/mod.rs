//! Engines served by other processes, built from the worker's configuration: SGLang or vLLM
//! servers, one client per URL, balanced client-side when there are several.
//!
//! - [`sglang`], [`vllm`]: one server each, over [`http`]'s shared client;
//! - [`balanced`]: several engines behind one, the least loaded first;
//! - [`TensorMeta`]: a tensor announced to a server ahead of its broadcast.

pub mod balanced;
mod http;
pub mod sglang;
pub mod vllm;

use balanced::Balanced;
use kart_core::config::rollout::EngineConfig;
use kart_core::engine::Engine;
use sglang::SglangEngine;
use std::sync::Arc;
use std::time::Duration;
use vllm::VllmEngine;

/// A tensor announced to a server ahead of its broadcast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub name: String,
    /// Its dtype as `torch` names it (`bfloat16`, `float32`).
    pub dtype: &'static str,
    pub shape: Vec<i64>,
}

/// The remote engine `config` describes; an error names the field at fault.
pub fn remote(config: &EngineConfig) -> Result<Arc<dyn Engine>, String> {
    let (urls, timeout_secs) = match config {
        EngineConfig::Sglang { urls, timeout_secs } | EngineConfig::Vllm { urls, timeout_secs, .. } => {
            (urls, *timeout_secs)
        }
        EngineConfig::Embedded { .. } => return Err("engine.kind: `embedded` is not a remote engine".into()),
    };
    if urls.is_empty() {
        return Err("engine.urls: at least one URL is needed".into());
    }
    if !(timeout_secs > 0.0 && timeout_secs.is_finite()) {
        return Err(format!("engine.timeout_secs: must be positive, got {timeout_secs}"));
    }
    let timeout = Duration::from_secs_f64(timeout_secs);
    let engines: Vec<Arc<dyn Engine>> = urls
        .iter()
        .map(|url| -> Arc<dyn Engine> {
            match config {
                EngineConfig::Vllm { model, .. } => Arc::new(VllmEngine::new(url, model, timeout)),
                _ => Arc::new(SglangEngine::new(url, timeout)),
            }
        })
        .collect();
    match engines.len() {
        1 => Ok(engines.into_iter().next().expect("one engine")),
        _ => Ok(Arc::new(Balanced::new(engines).map_err(|e| format!("engine.urls: {e}"))?)),
    }
}
