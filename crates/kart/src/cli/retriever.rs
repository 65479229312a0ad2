//! `kart retriever index` and `kart retriever serve`.

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kart_core::config::retriever::{AnnConfig, AnnQuantization, Method, RetrieverConfig};
use kart_retriever::docstore::Manifest;
use std::path::PathBuf;
use std::process::ExitCode;

/// Build a retrieval index, or serve Search-R1's `/retrieve` API.
#[derive(Debug, Subcommand)]
pub enum Command {
    Index(IndexArgs),
    Serve(ServeArgs),
}

/// Build a BM25 or dense index from a Search-R1 corpus (JSON lines, optionally gzipped).
#[derive(Debug, Args)]
pub struct IndexArgs {
    /// Corpus file: `{"id", "contents"}` or `{"id", "title", "text"}` per line.
    #[arg(long)]
    corpus: PathBuf,
    /// `bm25` or `dense`.
    #[arg(long, default_value = "bm25")]
    method: String,
    /// Index folder to create.
    #[arg(long)]
    out: PathBuf,
    /// Encoder model folder (dense): a BERT-family Hugging Face folder.
    #[arg(long)]
    encoder: Option<PathBuf>,
    /// Query prefix for the encoder (E5: "query: ").
    #[arg(long, default_value = "")]
    query_prefix: String,
    /// Passage prefix for the encoder (E5: "passage: ").
    #[arg(long, default_value = "")]
    passage_prefix: String,
    /// Indexing memory budget in MiB (BM25).
    #[arg(long, default_value_t = 512)]
    memory_mb: usize,
    /// Also build an approximate nearest-neighbour graph over the embeddings (dense), searched
    /// instead of the exact scan. The embeddings of a finished dense index already in `--out` are
    /// reused, and a graph build that stopped resumes from its last checkpoint.
    #[arg(long, value_enum)]
    ann: Option<AnnMethod>,
    /// Links per node of the graph (HNSW's M).
    #[arg(long, default_value_t = AnnConfig::default().connectivity)]
    ann_connectivity: usize,
    /// Candidates kept while inserting into the graph (HNSW's efConstruction).
    #[arg(long, default_value_t = AnnConfig::default().expansion_add)]
    ann_expansion_add: usize,
    /// How the graph stores each vector: f32, f16 or i8.
    #[arg(long, value_enum, default_value = "i8")]
    ann_quantization: Quantization,
}

/// Approximate nearest-neighbour methods.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AnnMethod {
    /// A hierarchical navigable small-world graph (usearch).
    Hnsw,
}

/// The scalar type of the graph's vectors.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Quantization {
    F32,
    F16,
    I8,
    /// One bit a dimension, compared by Hamming distance (re-score 100 or more candidates).
    B1,
}

impl From<Quantization> for AnnQuantization {
    fn from(q: Quantization) -> Self {
        match q {
            Quantization::F32 => AnnQuantization::F32,
            Quantization::F16 => AnnQuantization::F16,
            Quantization::I8 => AnnQuantization::I8,
            Quantization::B1 => AnnQuantization::B1,
        }
    }
}

/// Serve `/retrieve`, `/access`, `/healthz`, `/readyz` and `/metrics`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (JSON, the `RetrieverConfig` the operator renders); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Index folder built by `kart retriever index`.
    #[arg(long)]
    index: Option<PathBuf>,
    /// `bm25` or `dense` (read from the index when omitted), or `serper` for web search.
    #[arg(long)]
    method: Option<String>,
    /// Port to listen on.
    #[arg(long)]
    port: Option<u16>,
    /// Address to listen on.
    #[arg(long)]
    host: Option<String>,
    /// Results per query when a request's topk is null.
    #[arg(long)]
    topk: Option<usize>,
    /// ASearcher's local pages file (JSON lines keyed by `url`): `/access` answers from it.
    #[arg(long)]
    pages: Option<PathBuf>,
    /// Candidates a dense index's approximate graph explores per query (HNSW's efSearch).
    #[arg(long)]
    ann_expansion_search: Option<usize>,
    /// Candidates of the graph re-scored exactly against the f32 embeddings (at least topk are).
    #[arg(long)]
    ann_rerank: Option<usize>,
}

pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Index(args) => index(args),
        Command::Serve(args) => serve(args),
    }
}

fn parse_method(value: &str) -> anyhow::Result<Method> {
    serde_json::from_value(serde_json::Value::String(value.to_string()))
        .map_err(|_| anyhow::anyhow!("--method: unknown method `{value}` (expected bm25, dense or serper)"))
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {bytes}/{total_bytes} {msg}")
            .expect("valid template"),
    );
    bar
}

fn index(args: IndexArgs) -> anyhow::Result<ExitCode> {
    let method = parse_method(&args.method)?;
    if args.ann.is_some() && method != Method::Dense {
        anyhow::bail!("--ann: an approximate graph is built over a dense index (`--method dense`)");
    }
    let bar = progress_bar(0);
    let progress = |read: u64, total: u64, docs: u64| {
        bar.set_length(total);
        bar.set_position(read);
        bar.set_message(format!("{docs} passages"));
    };
    let started = std::time::Instant::now();
    let docs = match method {
        Method::Bm25 => kart_retriever::bm25::build(&args.corpus, &args.out, args.memory_mb << 20, progress)?,
        Method::Dense => {
            let finished = Manifest::read(&args.out)
                .ok()
                .filter(|m| m.method == Method::Dense && m.embeddings_crc32.is_some());
            let docs = if let Some(finished) = finished.filter(|_| args.ann.is_some()) {
                println!("reusing the embeddings of the dense index in {}", args.out.display());
                finished.documents
            } else {
                let encoder =
                    args.encoder.clone().context("--encoder: a dense index needs an encoder model folder")?;
                let config = kart_core::config::retriever::EncoderConfig {
                    model: Some(encoder.clone()),
                    query_prefix: args.query_prefix,
                    passage_prefix: args.passage_prefix,
                    ..Default::default()
                };
                kart_retriever::dense::build(&args.corpus, &args.out, &encoder, &config, progress)?
            };
            if args.ann.is_some() {
                let config = AnnConfig {
                    connectivity: args.ann_connectivity,
                    expansion_add: args.ann_expansion_add,
                    quantization: args.ann_quantization.into(),
                };
                anyhow::ensure!(config.connectivity >= 2, "--ann-connectivity must be at least 2");
                anyhow::ensure!(config.expansion_add >= 1, "--ann-expansion-add must be at least 1");
                let graph = ProgressBar::new(docs);
                graph.set_style(
                    ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} vectors in the graph ({eta} left)")
                        .expect("valid template"),
                );
                kart_retriever::ann::build(&args.out, &config, |added, _| graph.set_position(added))?;
                graph.finish_and_clear();
            }
            docs
        }
        Method::Serper => anyhow::bail!("--method: serper searches the web and has no index to build"),
    };
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "indexed {docs} passages into {} in {secs:.1}s ({:.0} passages/s)",
        args.out.display(),
        docs as f64 / secs
    );
    // The operator reads the passage count into the Retriever's status.
    super::status_file::write(&serde_json::json!({"documents": docs, "method": args.method}))?;
    Ok(ExitCode::SUCCESS)
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config: RetrieverConfig = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("--config {}", path.display()))?
        }
        None => RetrieverConfig::default(),
    };
    if let Some(index) = args.index {
        config.index = Some(index);
    }
    if let Some(method) = &args.method {
        config.method = parse_method(method)?;
    } else if args.config.is_none()
        && let Some(index) = &config.index
    {
        config.method = kart_retriever::docstore::Manifest::read(index)?.method;
    }
    if let Some(port) = args.port {
        config.port = port;
    }
    if let Some(host) = args.host {
        config.host = host;
    }
    if let Some(topk) = args.topk {
        anyhow::ensure!(
            (1..=kart_core::config::retriever::MAX_TOPK).contains(&topk),
            "--topk: {topk} is not in 1..=1000"
        );
        config.topk = topk;
    }
    if let Some(pages) = args.pages {
        config.pages = Some(pages);
    }
    if let Some(n) = args.ann_expansion_search {
        config.ann_expansion_search = n;
    }
    if let Some(n) = args.ann_rerank {
        config.ann_rerank = n;
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(kart_retriever::server::run(config))?;
    Ok(ExitCode::SUCCESS)
}
