//! `kart bench retriever --dense`: the dense index's approximate graph (usearch's HNSW, as
//! `kart retriever index --ann hnsw` builds it) against the exact scan it replaces and against
//! faiss's HNSW, on the same embeddings in the same run.
//!
//! The embeddings are synthetic, from a seed: unit vectors of `--dim` dimensions near a
//! 64-dimensional subspace, drawn around 1024 topics (a random linear map of Gaussian points
//! around Gaussian topic centres, plus noise in every dimension), as sentence embeddings
//! concentrate near a low-dimensional manifold in clusters; queries are drawn the same way. No encoder runs: its cost is the same for both searches (`kart bench encoder` measures
//! it). The exact scan is the dense index's own ([`kart_retriever::flat::FlatIndex`]: f32 on the
//! CPU, f16 sharded over every GPU with `--device cuda`) and gives the true neighbours recall is
//! measured against. The anchor (`scripts/bench/dense_anchor.py`)
//! builds faiss's HNSW with the same links per node, insertion and search candidates, inner
//! product and vector type, and is timed the same ways: single queries one at a time on one
//! thread, and batches on every core. The exact scan has an anchor of its own
//! (`scripts/bench/exact_anchor.py`): a torch matrix product and `topk` over the same embeddings
//! on the same device, in the same kind, timed the same ways. `--exact-only` measures the exact
//! scan and its anchor alone.

use super::retriever::{AnchorScript, Args, WorkDir, folder_size, progress_bar, run_anchor};
use anyhow::Context;
use kart_core::config::retriever::{AnnConfig, AnnQuantization, Method};
use kart_retriever::ann::{self, Graph};
use kart_retriever::dense::EMBEDDINGS;
use kart_retriever::docstore::{FORMAT, Manifest};
use kart_retriever::flat::{FlatIndex, Placement};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Dimensions of the subspace the synthetic embeddings lie near.
const LATENT: i64 = 64;

/// Topics the synthetic passages and queries are drawn around, and their spread (a topic's
/// centre has unit variance per latent dimension).
const TOPICS: i64 = 1024;
const TOPIC_SPREAD: f64 = 1.0;

/// Rows generated at a time.
const CHUNK: i64 = 65_536;

/// Results per query; recall is measured at this depth.
const K: usize = 10;

/// The targets: recall@10 and the graph's batched QPS over the exact scan's (the compressed,
/// one-bit graph's own).
const RECALL_TARGET: f64 = 0.95;
const SPEEDUP_TARGET: f64 = 20.0;
const COMPRESSED_SPEEDUP_TARGET: f64 = 50.0;

/// The recalls at which kart's and faiss's best QPS are compared.
const EQUAL_RECALLS: [f64; 2] = [0.95, 0.99];

/// Re-scoring depths measured when `--ann-rerank` is not given.
const RERANKS: [usize; 3] = [10, 25, 50];
const B1_RERANKS: [usize; 4] = [70, 100, 200, 400];

/// Search-R1's wiki-18 corpus, for the projection.
const WIKI18_PASSAGES: f64 = 21_015_324.0;

/// One side's figures at one setting.
#[derive(Debug, Serialize, Deserialize)]
struct Search {
    /// Candidates explored (HNSW's efSearch), or lists probed (IVF's nprobe).
    expansion_search: usize,
    /// Candidates re-scored against the f32 embeddings.
    rerank: usize,
    single_qps: f64,
    batch_qps: f64,
    recall: f64,
}

/// Figures of one side.
#[derive(Debug, Serialize, Deserialize)]
struct Measures {
    build_secs: f64,
    index_bytes: u64,
    searches: Vec<Search>,
}

/// The exact scan's torch anchor's figures.
#[derive(Debug, Serialize, Deserialize)]
struct ExactAnchor {
    /// Where it ran, e.g. `cuda:0 float16`.
    on: String,
    single_qps: f64,
    batch_qps: f64,
    /// The share of kart's exact top 10 it finds too.
    recall: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    passages: u64,
    queries: usize,
    dim: usize,
    ann: AnnConfig,
    reranks: Vec<usize>,
    /// Where the exact scan ran, e.g. `Cpu f32` or `2 x Cuda f16`.
    exact_on: String,
    exact_single_qps: f64,
    exact_batch_qps: f64,
    /// torch's matrix product and `topk` on the same embeddings (`None` with `--no-anchor`).
    torch_exact: Option<ExactAnchor>,
    /// The graph (`None` with `--exact-only`).
    kart: Option<Measures>,
    /// faiss's HNSW of the same settings (not for b1, which faiss's float HNSW lacks).
    faiss: Option<Measures>,
    /// faiss's IVF-PQ, beside the b1 graph.
    faiss_ivfpq: Option<Measures>,
}

/// The highest QPS (single, batched) among `searches` of recall at least `recall`.
fn best_at(searches: &[Search], recall: f64) -> Option<(f64, f64)> {
    let reaching = searches.iter().filter(|s| s.recall >= recall);
    let single = reaching.clone().map(|s| s.single_qps).max_by(f64::total_cmp)?;
    let batch = reaching.map(|s| s.batch_qps).max_by(f64::total_cmp)?;
    Some((single, batch))
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.dim > 0, "--dim must be at least 1");
    let placement = Placement::for_device(kart_torch::choose("dense bench", "--device", args.device, 0)?);
    let work = WorkDir::new(args.work.clone())?;
    let dir = work.path.join("dense");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let (n, dim) = (args.passages as i64, args.dim as i64);
    let threads = rayon::current_num_threads();
    tch::set_num_threads(threads as i32);
    tch::manual_seed(args.seed as i64);
    let basis = Tensor::randn([LATENT, dim], (Kind::Float, Device::Cpu));
    let topics = Tensor::randn([TOPICS, LATENT], (Kind::Float, Device::Cpu));

    tracing::info!(passages = n, dim, "writing the synthetic embeddings");
    let bar = progress_bar("{spinner} embeddings [{elapsed_precise}] {bar:40} {pos}/{len}");
    bar.set_length(n as u64);
    let mut file = BufWriter::new(std::fs::File::create(dir.join(EMBEDDINGS))?);
    for start in (0..n).step_by(CHUNK as usize) {
        let rows = synthetic(&basis, &topics, CHUNK.min(n - start));
        file.write_all(&le_bytes(&rows)?)?;
        bar.set_position((start + rows.size()[0]) as u64);
    }
    file.flush()?;
    drop(file);
    bar.finish_and_clear();
    let manifest = Manifest {
        format: FORMAT,
        method: Method::Dense,
        documents: n as u64,
        encoder: None,
        dim: Some(args.dim),
        embeddings_crc32: None,
        ann: None,
    };
    manifest.write(&dir)?;
    let queries = synthetic(&basis, &topics, args.queries as i64);
    let queries_path = work.path.join("queries.f32");
    std::fs::write(&queries_path, le_bytes(&queries)?)?;

    // The exact scan: the true neighbours, and its speed.
    let flat = FlatIndex::read(&dir.join(EMBEDDINGS), n as u64, args.dim, None, &placement)?;
    let queries_on = queries.to_device(placement.devices[0]);
    let exact_on = match placement.devices.as_slice() {
        [device] => format!("{device:?} {:?}", placement.kind),
        devices => format!("{} x {:?} {:?}", devices.len(), devices[0], placement.kind),
    };
    flat.search(&queries_on.narrow(0, 0, 1), K)?; // warm-up
    tracing::info!(queries = args.queries, "exact scan, batched");
    let started = Instant::now();
    let mut truth: Vec<Vec<u64>> = Vec::with_capacity(args.queries as usize);
    for start in (0..queries.size()[0]).step_by(args.batch) {
        let batch = queries_on.narrow(0, start, (args.batch as i64).min(queries.size()[0] - start));
        truth.extend(
            flat.search(&batch, K)?.into_iter().map(|hits| hits.into_iter().map(|(row, _)| row).collect()),
        );
    }
    let exact_batch_qps = args.queries as f64 / started.elapsed().as_secs_f64();
    let single = (args.queries as usize).min(100);
    tracing::info!(queries = single, "exact scan, single queries on one thread");
    tch::set_num_threads(1);
    let started = Instant::now();
    for i in 0..single as i64 {
        flat.search(&queries_on.narrow(0, i, 1), K)?;
    }
    let exact_single_qps = single as f64 / started.elapsed().as_secs_f64();
    tch::set_num_threads(threads as i32);
    drop((flat, queries_on));
    let truth_path = work.path.join("truth.txt");
    let lines: Vec<String> =
        truth.iter().map(|r| r.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")).collect();
    std::fs::write(&truth_path, lines.join("\n") + "\n")?;
    let embeddings = dir.join(EMBEDDINGS);
    let files =
        AnchorFiles { embeddings: &embeddings, queries: &queries_path, truth: &truth_path, work: &work.path };
    let torch_exact = match args.no_anchor {
        true => None,
        false => Some(exact_anchor(args, &files, placement.devices[0].is_cuda(), threads)?),
    };
    let mut report = Report {
        passages: n as u64,
        queries: args.queries as usize,
        dim: args.dim,
        ann: AnnConfig {
            connectivity: args.ann_connectivity,
            expansion_add: args.ann_expansion_add,
            quantization: args.ann_quantization.into(),
        },
        reranks: reranks(args),
        exact_on,
        exact_single_qps,
        exact_batch_qps,
        torch_exact,
        kart: None,
        faiss: None,
        faiss_ivfpq: None,
    };
    if !args.exact_only {
        report.kart = Some(graph(args, &dir, &queries, &truth)?);
        if !args.no_anchor {
            match AnnQuantization::from(args.ann_quantization) {
                AnnQuantization::B1 => report.faiss_ivfpq = Some(ivfpq_anchor(args, &files, threads)?),
                _ => report.faiss = Some(anchor(args, &files, threads)?),
            }
        }
    }
    report.print(threads);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// kart's graph, built as `kart retriever index --ann hnsw` builds it in `dir`, searched with
/// `queries` at each `--ann-expansion-search`, its recall against `truth`.
fn graph(args: &Args, dir: &Path, queries: &Tensor, truth: &[Vec<u64>]) -> anyhow::Result<Measures> {
    let ann = AnnConfig {
        connectivity: args.ann_connectivity,
        expansion_add: args.ann_expansion_add,
        quantization: args.ann_quantization.into(),
    };
    tracing::info!(?ann, "building the approximate graph");
    let bar = progress_bar("{spinner} graph [{elapsed_precise}] {bar:40} {pos}/{len} ({eta} left)");
    bar.set_length(args.passages);
    let started = Instant::now();
    ann::build(dir, &ann, |added, _| bar.set_position(added))?;
    let build_secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut graph = Graph::open(dir, &Manifest::read(dir)?, 64, 0)?;
    let flat = Vec::<f32>::try_from(queries.flatten(0, -1))?;
    graph.search(&flat[..args.batch.min(args.queries as usize) * args.dim], K)?; // warm-up
    let mut searches = Vec::new();
    for (rerank, &expansion_search) in grid(args) {
        graph.set_rerank(rerank);
        graph.set_expansion_search(expansion_search);
        let started = Instant::now();
        let mut found = Vec::with_capacity(truth.len());
        for batch in flat.chunks(args.batch * args.dim) {
            found.extend(graph.search(batch, K)?);
        }
        let batch_qps = args.queries as f64 / started.elapsed().as_secs_f64();
        let single = (args.queries as usize).min(2000);
        let started = Instant::now();
        for query in flat.chunks(args.dim).take(single) {
            graph.search_one(query, K)?;
        }
        let single_qps = single as f64 / started.elapsed().as_secs_f64();
        let hits: usize =
            found.iter().zip(truth).map(|(f, t)| f.iter().filter(|(o, _)| t.contains(o)).count()).sum();
        let recall = hits as f64 / (truth.len() * K) as f64;
        searches.push(Search { expansion_search, rerank, single_qps, batch_qps, recall });
    }
    Ok(Measures {
        build_secs,
        index_bytes: folder_size(dir)? - std::fs::metadata(dir.join(EMBEDDINGS))?.len(),
        searches,
    })
}

/// The re-scoring depths measured.
fn reranks(args: &Args) -> Vec<usize> {
    match (args.ann_rerank.is_empty(), AnnQuantization::from(args.ann_quantization)) {
        (false, _) => args.ann_rerank.clone(),
        (true, AnnQuantization::B1) => B1_RERANKS.to_vec(),
        (true, _) => RERANKS.to_vec(),
    }
}

/// Every (re-scoring depth, efSearch) measured.
fn grid(args: &Args) -> impl Iterator<Item = (usize, &usize)> {
    reranks(args).into_iter().flat_map(|rerank| args.ann_expansion_search.iter().map(move |ef| (rerank, ef)))
}

/// `rows` unit vectors near the span of `basis` `(LATENT, D)`, around the `topics` `(TOPICS,
/// LATENT)`.
fn synthetic(basis: &Tensor, topics: &Tensor, rows: i64) -> Tensor {
    let dim = basis.size()[1];
    let topic = Tensor::randint(topics.size()[0], [rows], (Kind::Int64, Device::Cpu));
    let spread = Tensor::randn([rows, LATENT], (Kind::Float, Device::Cpu)) * TOPIC_SPREAD;
    let latent = topics.index_select(0, &topic) + spread;
    // Noise in every dimension, of a tenth of the signal's scale.
    let noise = Tensor::randn([rows, dim], (Kind::Float, Device::Cpu)) * (LATENT as f64).sqrt() * 0.1;
    let x = latent.matmul(basis) + noise;
    let norm = x.norm_scalaropt_dim(2, [1i64].as_slice(), true);
    x / norm
}

/// The rows of an f32 tensor as little-endian bytes.
fn le_bytes(rows: &Tensor) -> anyhow::Result<Vec<u8>> {
    let values = Vec::<f32>::try_from(rows.flatten(0, -1))?;
    Ok(values.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// The files the anchors read: the embeddings, the queries and kart's exact top 10 of each.
struct AnchorFiles<'a> {
    embeddings: &'a Path,
    queries: &'a Path,
    truth: &'a Path,
    work: &'a Path,
}

impl AnchorFiles<'_> {
    /// The flags naming them, and the depth and timing shared by every anchor.
    fn arguments(&self, args: &Args, threads: usize) -> Vec<OsString> {
        let mut arguments: Vec<OsString> = vec![
            "--embeddings".into(),
            self.embeddings.into(),
            "--queries".into(),
            self.queries.into(),
            "--truth".into(),
            self.truth.into(),
        ];
        for (flag, value) in [
            ("--dim", args.dim.to_string()),
            ("--k", K.to_string()),
            ("--batch", args.batch.to_string()),
            ("--threads", threads.to_string()),
        ] {
            arguments.extend([flag.into(), value.into()]);
        }
        arguments
    }
}

/// The torch anchor of the exact scan, on the GPU when kart's scan ran on one.
fn exact_anchor(args: &Args, files: &AnchorFiles, cuda: bool, threads: usize) -> anyhow::Result<ExactAnchor> {
    tracing::info!("running the exact scan's torch anchor (scripts/bench/exact_anchor.py)");
    let mut arguments = files.arguments(args, threads);
    for (flag, value) in [("--single", "100"), ("--device", if cuda { "cuda" } else { "cpu" })] {
        arguments.extend([flag.into(), value.into()]);
    }
    run_anchor(args, AnchorScript::EXACT, &arguments, files.work, "exact-anchor.json")
}

fn anchor(args: &Args, files: &AnchorFiles, threads: usize) -> anyhow::Result<Measures> {
    tracing::info!("running the faiss anchor (scripts/bench/dense_anchor.py)");
    let quantization = match AnnQuantization::from(args.ann_quantization) {
        AnnQuantization::F32 => "f32",
        AnnQuantization::F16 => "f16",
        AnnQuantization::I8 => "i8",
        AnnQuantization::B1 => "b1",
    };
    let mut arguments = files.arguments(args, threads);
    for (flag, value) in [
        ("--m", args.ann_connectivity.to_string()),
        ("--ef-construction", args.ann_expansion_add.to_string()),
        ("--ef-search", joined(&args.ann_expansion_search)),
        ("--quantization", quantization.to_string()),
        ("--single", args.queries.min(2000).to_string()),
        ("--rerank", joined(&reranks(args))),
    ] {
        arguments.extend([flag.into(), value.into()]);
    }
    run_anchor(args, AnchorScript::FAISS, &arguments, files.work, "dense-anchor.json")
}

/// faiss's IVF-PQ over the same embeddings: `--ivf-lists` lists, a byte per 8 dimensions (the b1
/// graph's size), the candidates re-scored by `IndexRefineFlat`.
fn ivfpq_anchor(args: &Args, files: &AnchorFiles, threads: usize) -> anyhow::Result<Measures> {
    tracing::info!("running the faiss IVF-PQ anchor (scripts/bench/dense_anchor.py --ivfpq)");
    anyhow::ensure!(
        args.dim.is_multiple_of(8),
        "--dim {}: the IVF-PQ anchor needs a multiple of 8",
        args.dim
    );
    let mut arguments = files.arguments(args, threads);
    for (flag, value) in [
        ("--ivfpq", args.ivf_lists.to_string()),
        ("--pq-bytes", (args.dim / 8).to_string()),
        ("--ef-search", joined(&args.ivf_probes)),
        ("--single", args.queries.min(2000).to_string()),
        ("--rerank", joined(&reranks(args))),
    ] {
        arguments.extend([flag.into(), value.into()]);
    }
    run_anchor(args, AnchorScript::FAISS, &arguments, files.work, "ivfpq-anchor.json")
}

fn joined(values: &[usize]) -> String {
    values.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

impl Report {
    /// The exact scan's figures, and its torch anchor's beside them.
    fn print_exact(&self) {
        println!(
            "exact scan ({}): {:.1} QPS single (one thread), {:.1} QPS batched (all threads)",
            self.exact_on, self.exact_single_qps, self.exact_batch_qps
        );
        if let Some(torch) = &self.torch_exact {
            println!(
                "torch matmul + topk ({}): {:.1} QPS single, {:.1} QPS batched; kart {:.2}x and {:.2}x of it; \
                 it finds {:.4} of kart's exact top {K}",
                torch.on,
                torch.single_qps,
                torch.batch_qps,
                self.exact_single_qps / torch.single_qps,
                self.exact_batch_qps / torch.batch_qps,
                torch.recall
            );
        }
    }

    fn print(&self, threads: usize) {
        let million = self.passages as f64 / 1e6;
        println!(
            "{} passages x {} dimensions, {} queries, recall@{K} against the exact scan; graph: {} links \
             per node, {} insertion candidates, {:?} vectors; {threads} threads",
            self.passages,
            self.dim,
            self.queries,
            self.ann.connectivity,
            self.ann.expansion_add,
            self.ann.quantization
        );
        let Some(kart) = &self.kart else {
            self.print_exact();
            return;
        };
        let (anchor_name, f) = match (&self.faiss, &self.faiss_ivfpq) {
            (_, Some(ivfpq)) => ("faiss IVF-PQ", Some(ivfpq)),
            (faiss, None) => ("faiss HNSW", faiss.as_ref()),
        };
        let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio =
            |kart: f64, faiss: Option<f64>| faiss.map_or("-".to_string(), |f| format!("{:.2}x", kart / f));
        let mib = |bytes: u64| bytes as f64 / million / (1 << 20) as f64;
        println!("{:<38} {:>12} {:>12} {:>8}", "build", "kart", anchor_name, "ratio");
        let (build, faiss_build) = (kart.build_secs / million, f.map(|f| f.build_secs / million));
        println!(
            "{:<38} {:>12.1} {:>12} {:>8}",
            "s per million passages",
            build,
            cell(faiss_build),
            ratio(faiss_build.unwrap_or(f64::NAN), Some(build))
        );
        let (size, faiss_size) = (mib(kart.index_bytes), f.map(|f| mib(f.index_bytes)));
        println!(
            "{:<38} {:>12.1} {:>12} {:>8}",
            "index MiB per million passages",
            size,
            cell(faiss_size),
            ratio(faiss_size.unwrap_or(f64::NAN), Some(size))
        );
        let paired = self.faiss.as_ref();
        println!(
            "{:>6} {:>6} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9}",
            "ef",
            "rerank",
            "single",
            "batch",
            "recall",
            "faiss 1",
            "faiss b",
            "recall",
            "1 ratio",
            "b ratio",
            "vs exact"
        );
        for s in &kart.searches {
            let a = paired.and_then(|f| {
                f.searches.iter().find(|x| x.expansion_search == s.expansion_search && x.rerank == s.rerank)
            });
            println!(
                "{:>6} {:>6} {:>10.1} {:>10.1} {:>7.3} {:>10} {:>10} {:>7} {:>8} {:>8} {:>8.1}x",
                s.expansion_search,
                s.rerank,
                s.single_qps,
                s.batch_qps,
                s.recall,
                cell(a.map(|a| a.single_qps)),
                cell(a.map(|a| a.batch_qps)),
                a.map_or("-".into(), |a| format!("{:.3}", a.recall)),
                ratio(s.single_qps, a.map(|a| a.single_qps)),
                ratio(s.batch_qps, a.map(|a| a.batch_qps)),
                s.batch_qps / self.exact_batch_qps
            );
        }
        if let Some(ivfpq) = &self.faiss_ivfpq {
            println!(
                "{:>6} {:>6} {:>10} {:>10} {:>7} {:>9}",
                "nprobe", "rerank", "single", "batch", "recall", "vs exact"
            );
            for s in &ivfpq.searches {
                println!(
                    "{:>6} {:>6} {:>10.1} {:>10.1} {:>7.3} {:>8.1}x",
                    s.expansion_search,
                    s.rerank,
                    s.single_qps,
                    s.batch_qps,
                    s.recall,
                    s.batch_qps / self.exact_batch_qps
                );
            }
        }
        self.print_exact();
        if let Some(f) = f {
            for recall in EQUAL_RECALLS {
                let (ours, theirs) = (best_at(&kart.searches, recall), best_at(&f.searches, recall));
                let text = |b: Option<(f64, f64)>| {
                    b.map_or("not reached".to_string(), |(s, b)| format!("{s:.0} single, {b:.0} batched"))
                };
                let ratios = match (ours, theirs) {
                    (Some(o), Some(t)) => format!("{:.2}x single, {:.2}x batched", o.0 / t.0, o.1 / t.1),
                    _ => "-".into(),
                };
                println!(
                    "best QPS at recall@{K} >= {recall}: kart {}, {anchor_name} {}: {ratios}",
                    text(ours),
                    text(theirs)
                );
            }
        }
        let target = match self.ann.quantization {
            AnnQuantization::B1 => COMPRESSED_SPEEDUP_TARGET,
            _ => SPEEDUP_TARGET,
        };
        let best = kart
            .searches
            .iter()
            .filter(|s| s.recall >= RECALL_TARGET)
            .max_by(|a, b| a.batch_qps.total_cmp(&b.batch_qps));
        match best {
            Some(s) => {
                let speedup = s.batch_qps / self.exact_batch_qps;
                let met = if speedup >= target { "met" } else { "missed" };
                println!(
                    "target: recall@10 >= {RECALL_TARGET} at >= {target}x the exact scan's QPS: ef {} rerank {} gives \
                     recall {:.3} at {speedup:.1}x ({met})",
                    s.expansion_search, s.rerank, s.recall
                );
            }
            None => println!(
                "target: recall@10 >= {RECALL_TARGET} at >= {target}x: no setting reaches the recall (missed)"
            ),
        }
        let scale = WIKI18_PASSAGES / self.passages as f64;
        println!(
            "wiki-18 ({WIKI18_PASSAGES} passages x {} dims): the exact scan reads {:.1} GB of f32 per query; the graph \
             takes {:.1} GB and builds in about {:.1} h on {threads} threads (linear in passages; HNSW grows slightly faster)",
            self.dim,
            WIKI18_PASSAGES * self.dim as f64 * 4.0 / 1e9,
            kart.index_bytes as f64 * scale / 1e9,
            kart.build_secs * scale / 3600.0
        );
    }
}
