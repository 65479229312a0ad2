//! vLLM as a second anchor of `kart bench model`: the engine users would otherwise serve the
//! model with, started on the benchmark's own model folder (`python -m
//! vllm.entrypoints.openai.api_server`, the Python given by `--vllm`), generating greedily through
//! kart's vLLM client (prompts as token ids, exactly `new_tokens` tokens each, the batch's
//! requests sent at once as a rollout worker sends them).

use super::model::greedy;
use super::server::Server;
use anyhow::Context;
use kart_core::engine::Engine;
use kart_rollout::engines::vllm::VllmEngine;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long vLLM may take to start: about two minutes on an idle 2-core machine.
const START: Duration = Duration::from_secs(1200);
/// vLLM's worker keeps polling its request queue for a second after the last request
/// (`busy_loop_s` of its shared-memory broadcast) before it waits idle: the next side's timed
/// run starts after that, not on a core vLLM still spins on.
const SETTLE: Duration = Duration::from_millis(1500);

/// A vLLM server on the benchmark's model and a client of it.
pub struct VllmAnchor {
    _server: Server,
    engine: VllmEngine,
    runtime: tokio::runtime::Runtime,
    /// vLLM's version (`GET /version`).
    pub version: String,
}

impl VllmAnchor {
    /// Starts vLLM with `python` on `model_dir` in `dtype` (`float32`, `bfloat16`) for sequences
    /// of at most `max_len` tokens, and waits until it answers.
    pub fn start(python: &Path, model_dir: &Path, dtype: &str, max_len: usize) -> anyhow::Result<Self> {
        let port = Server::free_port()?;
        let mut command = Command::new(python);
        command
            .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(model_dir)
            .args(["--served-model-name", "bench", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--dtype", dtype, "--max-model-len", &max_len.to_string(), "--seed", "0"])
            .arg("--disable-uvicorn-access-log")
            .env("VLLM_LOGGING_LEVEL", "WARNING")
            .env("HF_HUB_OFFLINE", "1");
        if std::env::var_os("VLLM_CPU_KVCACHE_SPACE").is_none() {
            // GiB of KV cache on the CPU build: its default takes a share of the machine's memory.
            command.env("VLLM_CPU_KVCACHE_SPACE", "2");
        }
        let mut server = Server::spawn("vLLM", command, port)?;
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(server.ready(START))?;
        let version = runtime.block_on(async {
            let answer = reqwest::get(format!("{}/version", server.url)).await?.error_for_status()?;
            anyhow::Ok(
                answer.json::<serde_json::Value>().await?["version"].as_str().unwrap_or("?").to_owned(),
            )
        });
        let version = version.context("asking vLLM its version")?;
        let engine = VllmEngine::new(&server.url, "bench", Duration::from_secs(3600));
        Ok(VllmAnchor { _server: server, engine, runtime, version })
    }

    /// Greedy generation of exactly `new_tokens` tokens after each prompt, all requests at once:
    /// the seconds until the last one finished, and each prompt's tokens. Returns once vLLM is
    /// idle again.
    pub fn generate(&self, prompts: &[Vec<u32>], new_tokens: usize) -> anyhow::Result<(f64, Vec<Vec<u32>>)> {
        let requests = prompts.iter().map(|prompt| self.engine.generate(greedy(prompt, new_tokens)));
        let start = Instant::now();
        let outputs = self.runtime.block_on(futures::future::join_all(requests));
        let seconds = start.elapsed().as_secs_f64();
        std::thread::sleep(SETTLE);
        let tokens = outputs
            .into_iter()
            .map(|output| Ok(output.context("generating on vLLM")?.generation.token_ids))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((seconds, tokens))
    }
}
