//! `kart bench sync --lora R`: a publish of LoRA adapters (rank R on every projection) to real
//! vLLM servers through `vllm_disk`, against `vllm_disk` of the whole model to the same servers
//! in the same run: bytes written and seconds until every replica serves the version.
//!
//! Both go through the trainer's own [`Publisher`]: the whole model is a Hugging Face folder each
//! replica reloads in place (`reload_weights`), the adapters a PEFT folder each loads in place
//! over the base it keeps (`/v1/load_lora_adapter`), both between a pause and a resume. The
//! servers are the user's (`--vllm-urls`), serving `--model-dir` with `VLLM_SERVER_DEV_MODE=1`,
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, `--enable-lora` and a `--max-lora-rank` of at least R.

use super::anchor::{Row, median, print_rows};
use kart_core::config::lora::LoraConfig;
use kart_core::config::train::InferenceServer;
use kart_model::CausalLm;
use kart_train::weights::Publisher;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What a run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    parameters: i64,
    rank: usize,
    replicas: usize,
    /// Bytes of tensors one publish writes: the whole model, the adapters.
    model_bytes: u64,
    adapter_bytes: u64,
    /// Median seconds of a publish until every replica serves it.
    model_secs: f64,
    adapter_secs: f64,
    rows: Vec<Row>,
}

/// Publishes `policy` `repeats` times whole, then as adapters of `rank` (attached to it), to the
/// vLLM servers `urls`, writing under `dir`.
pub async fn measure(
    policy: &mut CausalLm,
    model_dir: &Path,
    dir: &Path,
    urls: &[String],
    rank: usize,
    repeats: usize,
) -> anyhow::Result<Report> {
    let publisher = |folder: &str| {
        Publisher::disk(
            InferenceServer::Vllm,
            dir.join(folder),
            urls.to_vec(),
            model_dir.to_path_buf(),
            false,
        )
    };
    let mut version = 0;
    let mut publishes = async |publisher: &Publisher, policy: &CausalLm| -> anyhow::Result<(f64, u64)> {
        let (mut seconds, mut bytes) = (Vec::new(), 0);
        for _ in 0..repeats {
            version += 1;
            let started = Instant::now();
            bytes = publisher.publish(policy, version).await?.bytes;
            seconds.push(started.elapsed().as_secs_f64());
        }
        Ok((median(seconds.into_iter()), bytes))
    };
    let (model_secs, model_bytes) = publishes(&publisher("model"), policy).await?;
    policy.attach_lora(&LoraConfig::all_linear(rank), 0)?;
    let (adapter_secs, adapter_bytes) = publishes(&publisher("adapters"), policy).await?;
    let rows = vec![
        Row::at_most("vllm_disk adapters seconds".into(), adapter_secs, model_secs, 1.0),
        Row::at_most(
            "vllm_disk adapters MB".into(),
            adapter_bytes as f64 / 1e6,
            model_bytes as f64 / 1e6,
            1.0,
        ),
    ];
    Ok(Report {
        parameters: kart_model::transformer::parameter_count(policy.config(), "") as i64,
        rank,
        replicas: urls.len(),
        model_bytes,
        adapter_bytes,
        model_secs,
        adapter_secs,
        rows,
    })
}

pub fn print_report(r: &Report) {
    println!(
        "vllm_disk to {} vLLM replicas: LoRA adapters of rank {} on every projection ({:.2} MB) against the \
         whole model of {:.1}M parameters ({:.0} MB), median of the timed publishes",
        r.replicas,
        r.rank,
        r.adapter_bytes as f64 / 1e6,
        r.parameters as f64 / 1e6,
        r.model_bytes as f64 / 1e6
    );
    print_rows(&r.rows, "whole model");
}
