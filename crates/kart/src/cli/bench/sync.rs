//! `kart bench sync`: the time to bring inference replicas to a new policy version by each
//! weight-sync method, against `sglang_disk` (a Hugging Face folder each replica reloads) in the
//! same run.
//!
//! The random 46.5M-parameter Qwen2 of `kart bench model` (f32) is published by the trainer's own
//! [`Publisher`]s, each to `--replicas` receivers, timing one publish from its call until every
//! receiver holds the version:
//! - `sglang_disk`: the folder written, then each replica (the SGLang stand-in,
//!   `scripts/standins/sglang.py`) reads every shard as SGLang's loader does;
//! - `http_pull`: the safetensors file written and served by the trainer's HTTP server, then each
//!   receiver (a rollout worker's [`WeightLoader`] over an embedded engine) downloads and loads it;
//! - `sglang_broadcast`: the tensors broadcast from this process to the stand-ins' workers over
//!   Gloo (`torch.distributed`, as SGLang's workers join), in buckets of `--bucket-mb`; the
//!   group is formed by a first, untimed publish. A second run with 4 MiB buckets gives the cost of
//!   one bucket (its HTTP round trips), which with the bytes of a 7B model in bf16 projects a
//!   publish over NVLink and InfiniBand at the bandwidths given;
//! - `vllm_broadcast`: the same tensors to vLLM stand-ins (`scripts/standins/vllm.py`) through
//!   vLLM's weight-transfer routes, between a pause and a resume, one broadcast and barrier per
//!   tensor (Gloo), or with `--vllm-urls` and `--device cuda` to real vLLM servers over NCCL.
//!
//! With `--lora R` it measures LoRA adapters against the whole model instead, on the real vLLM
//! servers of `--vllm-urls` ([`super::sync_lora`]).

use super::anchor::{AnchorArgs, Row, check_python, median, print_rows};
use super::model::random_model;
use super::server::Server;
use super::sync_lora;
use anyhow::Context;
use kart_core::config::rollout::WeightDownloadConfig;
use kart_core::config::train::{Device, InferenceServer};
use kart_http::Readiness;
use kart_model::config::BENCHMARK_SIZES;
use kart_model::{CausalLm, EmbeddedEngine, QwenSizes};
use kart_rollout::weights::{Downloader, WeightLoader};
use kart_train::broadcast::{BroadcastConfig, Broadcaster};
use kart_train::server::{StatusHandle, router};
use kart_train::weights::{Published, Publisher, PullFrom, WeightStore};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STANDIN: &str = include_str!("../../../../../scripts/standins/sglang.py");
const VLLM_STANDIN: &str = include_str!("../../../../../scripts/standins/vllm.py");

/// Parameters of a 7B Qwen2 (Qwen2.5-7B), for the projection.
const PARAMS_7B: f64 = 7.6e9;

/// Benchmark the weight-sync methods (disk, HTTP pull, broadcast) on the 46.5M-parameter model.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Receivers of each publish.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    replicas: u16,
    /// Timed publishes per method (the median is reported) [default: 3, 1 with --quick].
    #[arg(long)]
    repeats: Option<usize>,
    /// Bucket size of the broadcast, in MiB.
    #[arg(long, default_value_t = 512.0)]
    bucket_mb: f64,
    /// NVLink bus bandwidth of an NCCL broadcast, in GB/s, for the 7B projection.
    #[arg(long, default_value_t = 300.0)]
    nvlink_gbps: f64,
    /// InfiniBand bandwidth between nodes, in GB/s, for the 7B projection.
    #[arg(long, default_value_t = 45.0)]
    ib_gbps: f64,
    /// The model: this Hugging Face folder (written there with random weights when missing).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// SGLang servers already serving `--model-dir` (real ones: `scripts/gpu-check.sh`) instead
    /// of stand-ins; `--replicas` is then their number.
    #[arg(long, value_delimiter = ',', requires = "model_dir")]
    urls: Vec<String>,
    /// vLLM servers already serving `--model-dir` with the RL routes (`VLLM_SERVER_DEV_MODE=1`,
    /// `--weight-transfer-config '{"backend": "nccl"}'`) instead of stand-ins.
    #[arg(long, value_delimiter = ',', requires = "model_dir")]
    vllm_urls: Vec<String>,
    /// Where the trainer's tensors are: `cpu` (Gloo) or `cuda` (NCCL; the servers on other GPUs).
    #[arg(long, default_value = "cpu", value_parser = super::parse_device)]
    device: Device,
    /// Publish LoRA adapters of this rank (every projection) through `vllm_disk` instead, to the
    /// `--vllm-urls` servers (started with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`,
    /// `--enable-lora` and a `--max-lora-rank` of at least it), against `vllm_disk` of the whole
    /// model to the same servers.
    #[arg(long, requires = "vllm_urls", value_parser = clap::value_parser!(u16).range(1..))]
    lora: Option<u16>,
    #[command(flatten)]
    anchor: AnchorArgs,
}

/// What a run measured.
#[derive(Debug, Serialize)]
struct Report {
    parameters: i64,
    bytes: u64,
    replicas: u16,
    disk_secs: f64,
    pull_secs: f64,
    /// `None` where not measured: with `--device cuda`, the broadcasts of a kind without real
    /// servers (`--urls`, `--vllm-urls`): the stand-ins' workers run on the CPU.
    broadcast_secs: Option<f64>,
    vllm_broadcast_secs: Option<f64>,
    /// The broadcast's backend (`gloo`, `nccl`).
    backend: &'static str,
    /// Seconds one more bucket costs a broadcast (its HTTP round trips), from 4 MiB buckets;
    /// `None` when the model fits one such bucket too (`--quick`), and with it the projections.
    per_bucket_secs: Option<f64>,
    projected_7b_nvlink_secs: Option<f64>,
    projected_7b_ib_secs: Option<f64>,
    rows: Vec<Row>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let python = args.anchor.python();
    check_python(&python, "torch, safetensors, tokenizers")?;
    let dir = tempfile::tempdir()?;
    let model_dir = args.model_dir.clone().unwrap_or_else(|| dir.path().join("model"));
    let (sizes, vocab) = if args.anchor.quick {
        (
            QwenSizes {
                vocab_size: 2048,
                hidden_size: 64,
                intermediate_size: 128,
                num_hidden_layers: 2,
                ..BENCHMARK_SIZES
            },
            512,
        )
    } else {
        (BENCHMARK_SIZES, 8000)
    };
    if !model_dir.join("config.json").exists() {
        random_model(&model_dir, sizes, vocab, args.anchor.seed)?;
    }
    let device = if args.device == Device::Cuda { tch::Device::Cuda(0) } else { tch::Device::Cpu };
    let mut policy = CausalLm::load(&model_dir, device)?;
    let tokenizer = kart_tokenizer::Tokenizer::load(&model_dir)?;
    let repeats = args.anchor.or(args.repeats, 3, 1);
    if let Some(rank) = args.lora {
        let urls = &args.vllm_urls;
        let report = tokio::runtime::Runtime::new()?.block_on(sync_lora::measure(
            &mut policy,
            &model_dir,
            dir.path(),
            urls,
            rank.into(),
            repeats,
        ))?;
        sync_lora::print_report(&report);
        if let Some(path) = &args.anchor.json {
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let script = dir.path().join("sglang.py");
    std::fs::write(&script, STANDIN)?;
    let vllm_script = dir.path().join("vllm.py");
    std::fs::write(&vllm_script, VLLM_STANDIN)?;
    let mut servers = Vec::new();
    let (mut urls, mut vllm_urls) = (args.urls.clone(), args.vllm_urls.clone());
    // The stand-ins' workers receive over Gloo: a CUDA trainer broadcasts to real servers only.
    let on_cpu = !device.is_cuda();
    let broadcast_to_sglang = on_cpu || !urls.is_empty();
    for (urls, script, wanted) in [(&mut urls, &script, true), (&mut vllm_urls, &vllm_script, on_cpu)] {
        for _ in urls.len()..args.replicas as usize * wanted as usize {
            let server = standin(&python, script, &model_dir)?;
            urls.push(server.url.clone());
            servers.push(server);
        }
    }
    let report = tokio::runtime::Runtime::new()?.block_on(async {
        // At most five minutes each: it imports PyTorch, slow on a loaded machine.
        for server in &mut servers {
            server.ready(Duration::from_secs(300)).await?;
        }
        let servers = Servers { sglang: urls, broadcast_to_sglang, vllm: vllm_urls };
        measure(&args, &policy, &tokenizer, &model_dir, dir.path(), servers, repeats).await
    })?;
    drop(servers);
    print_report(&report, &args);
    if let Some(path) = &args.anchor.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The receivers of the publishes.
struct Servers {
    /// SGLang servers: every publish to disk, and broadcasts when `broadcast_to_sglang`.
    sglang: Vec<String>,
    broadcast_to_sglang: bool,
    /// vLLM servers (none: no vLLM broadcast).
    vllm: Vec<String>,
}

async fn measure(
    args: &Args,
    policy: &CausalLm,
    tokenizer: &kart_tokenizer::Tokenizer,
    model_dir: &Path,
    dir: &Path,
    servers: Servers,
    repeats: usize,
) -> anyhow::Result<Report> {
    let mut version = 0;
    let urls = &servers.sglang;
    let urls_count = urls.len() as u16;
    let disk = Publisher::disk(
        InferenceServer::Sglang,
        dir.join("disk"),
        urls.clone(),
        model_dir.to_path_buf(),
        false,
    );
    let mut disk_secs = Vec::new();
    let mut bytes = 0;
    for _ in 0..repeats {
        let (secs, published) = timed(&disk, policy, &mut version).await?;
        disk_secs.push(secs);
        bytes = published.bytes;
    }

    let broadcaster = |server: InferenceServer, bucket_mb: f64| {
        let urls = match server {
            InferenceServer::Sglang => urls.clone(),
            InferenceServer::Vllm => servers.vllm.clone(),
        };
        let config = BroadcastConfig {
            server,
            urls,
            master_address: "127.0.0.1".into(),
            master_port: 0,
            bucket_bytes: (bucket_mb * (1 << 20) as f64) as usize,
            timeout: Duration::from_secs(600),
            interrupt: false,
        };
        Publisher::Broadcast(Broadcaster::new(config, policy.device()))
    };
    // The median seconds of a publish by `publisher`, after an untimed one forms its group.
    let timed_median = async |publisher: &Publisher, version: &mut i64| -> anyhow::Result<f64> {
        timed(publisher, policy, version).await?;
        let mut seconds = Vec::new();
        for _ in 0..repeats {
            seconds.push(timed(publisher, policy, version).await?.0);
        }
        Ok(median(seconds.into_iter()))
    };
    let (mut broadcast_secs, mut per_bucket_secs) = (None, None);
    if servers.broadcast_to_sglang {
        let broadcast =
            timed_median(&broadcaster(InferenceServer::Sglang, args.bucket_mb), &mut version).await?;
        let small = broadcaster(InferenceServer::Sglang, 4.0);
        timed(&small, policy, &mut version).await?;
        let small_secs = timed(&small, policy, &mut version).await?.0;
        let buckets = |mb: f64| (bytes as f64 / (mb * (1 << 20) as f64)).ceil().max(1.0);
        let extra_buckets = buckets(4.0) - buckets(args.bucket_mb);
        per_bucket_secs = (extra_buckets > 0.0).then(|| ((small_secs - broadcast) / extra_buckets).max(0.0));
        broadcast_secs = Some(broadcast);
    }
    let vllm_broadcast_secs = match servers.vllm.is_empty() {
        true => None,
        false => Some(timed_median(&broadcaster(InferenceServer::Vllm, args.bucket_mb), &mut version).await?),
    };

    let pull_secs = pull(policy, tokenizer, model_dir, dir, urls_count, repeats).await?;

    let disk_secs = median(disk_secs.into_iter());
    let bytes_7b = PARAMS_7B * 2.0;
    let buckets_7b = (bytes_7b / (args.bucket_mb * (1 << 20) as f64)).ceil();
    let project =
        |gbps: f64| per_bucket_secs.map(|per_bucket| bytes_7b / (gbps * 1e9) + buckets_7b * per_bucket);
    let mut rows = vec![Row::at_most("http_pull seconds".into(), pull_secs, disk_secs, 1.0)];
    for (name, secs) in [("sglang_broadcast", broadcast_secs), ("vllm_broadcast", vllm_broadcast_secs)] {
        rows.extend(secs.map(|secs| Row::at_most(format!("{name} seconds"), secs, disk_secs, 1.0)));
    }
    Ok(Report {
        parameters: kart_model::transformer::parameter_count(policy.config(), "") as i64,
        bytes,
        replicas: urls_count,
        disk_secs,
        pull_secs,
        broadcast_secs,
        vllm_broadcast_secs,
        backend: if policy.device().is_cuda() { "nccl" } else { "gloo" },
        per_bucket_secs,
        projected_7b_nvlink_secs: project(args.nvlink_gbps),
        projected_7b_ib_secs: project(args.ib_gbps),
        rows,
    })
}

/// The seconds of one publish by `publisher` of the next version after `version`, and what it did.
async fn timed(
    publisher: &Publisher,
    policy: &CausalLm,
    version: &mut i64,
) -> anyhow::Result<(f64, Published)> {
    *version += 1;
    let started = Instant::now();
    let published = publisher.publish(policy, *version).await?;
    Ok((started.elapsed().as_secs_f64(), published))
}

/// The median seconds of `repeats` HTTP-pull publishes, each until `replicas` rollout workers'
/// loaders (over embedded engines) hold it.
async fn pull(
    policy: &CausalLm,
    tokenizer: &kart_tokenizer::Tokenizer,
    model_dir: &Path,
    dir: &Path,
    replicas: u16,
    repeats: usize,
) -> anyhow::Result<f64> {
    let store = WeightStore::default();
    let app = router(
        StatusHandle::default(),
        store.clone(),
        prometheus::Registry::new(),
        Readiness::default(),
        None,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { kart_http::serve(listener, app).await });
    let from = PullFrom::new(url, None);
    let publisher = Publisher::http_pull(Vec::new(), from.clone(), dir.join("pull"), store, 2, None);
    let loads =
        prometheus::IntCounterVec::new(prometheus::Opts::new("loads", "loads"), &["trigger", "outcome"])?;
    let mut loaders = Vec::new();
    for _ in 0..replicas {
        let engine =
            EmbeddedEngine::spawn(CausalLm::load(model_dir, tch::Device::Cpu)?, tokenizer.clone(), 1, 0, 0);
        let downloader = Downloader::new(WeightDownloadConfig::default(), None)?;
        loaders.push(WeightLoader::new(Arc::new(engine), 0, downloader, loads.clone()));
    }
    let mut seconds = Vec::new();
    for version in 1..=repeats as i64 {
        let started = Instant::now();
        publisher.publish(policy, version).await?;
        let source = from.source(version);
        let pulls = loaders.iter().map(|l| l.ensure(&source));
        for pulled in futures::future::join_all(pulls).await {
            pulled.context("pulling the weights")?;
        }
        seconds.push(started.elapsed().as_secs_f64());
    }
    Ok(median(seconds.into_iter()))
}

/// The stand-in `script` serving `model_dir` on a free port.
fn standin(python: &Path, script: &Path, model_dir: &Path) -> anyhow::Result<Server> {
    let port = Server::free_port()?;
    let mut command = Command::new(python);
    command.arg(script).arg(model_dir).arg(port.to_string());
    Server::spawn(&format!("the stand-in {}", script.display()), command, port)
}

fn print_report(r: &Report, args: &Args) {
    println!(
        "weight sync of {:.1}M parameters ({:.0} MB, f32) to {} receivers, median of the timed publishes",
        r.parameters as f64 / 1e6,
        r.bytes as f64 / 1e6,
        r.replicas
    );
    print_rows(&r.rows, "sglang_disk");
    for (name, secs) in [("sglang_broadcast", r.broadcast_secs), ("vllm_broadcast", r.vllm_broadcast_secs)] {
        if let Some(secs) = secs {
            println!("{name}: {:.1} MB/s over {} on this machine", r.bytes as f64 / secs / 1e6, r.backend);
        }
    }
    let (Some(per_bucket), Some(nvlink), Some(ib)) =
        (r.per_bucket_secs, r.projected_7b_nvlink_secs, r.projected_7b_ib_secs)
    else {
        println!(
            "no 7B projection: the model fits one 4 MiB bucket, so the cost of a bucket is not measured"
        );
        return;
    };
    println!("one more bucket costs {:.1} ms", per_bucket * 1e3);
    println!(
        "projected publish of a 7B model (bf16, {:.1} GB, {:.0} MiB buckets): {nvlink:.2} s over NVLink at {} GB/s, {ib:.2} s over InfiniBand at {} GB/s",
        PARAMS_7B * 2.0 / 1e9,
        args.bucket_mb,
        args.nvlink_gbps,
        args.ib_gbps
    );
}
