//! `kart bench retriever`: BM25 index build and query speed, and retrieval quality, on a
//! synthetic corpus, against Lucene and bm25s on the same corpus and queries in the same run.
//!
//! The corpus is generated from a seed: English stop words then synthetic words (consonant-vowel
//! syllables, which English stemming leaves intact) with Zipf-distributed frequencies, passages of
//! 80 to 120 words under a title of 1 to 3 words, written in Search-R1's corpus format. Each query
//! takes 4 to 6 distinct words of a known answer passage, in random order, sometimes with stop
//! words, so recall is measurable. The anchors index the same files, scoring like tantivy (k1 =
//! 1.2, b = 0.75, the same analysis): Lucene (`scripts/bench/LuceneAnchor.java`, pyserini's
//! engine), whose top k of every query is compared with kart's, and bm25s
//! (`scripts/bench/retriever_anchor.py`).

use crate::cli::retriever::Quantization;
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kart_core::config::retriever::AnnConfig;
use kart_core::config::train::Device;
use kart_retriever::LocalIndex;
use kart_retriever::bm25::{self, Bm25Index};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Benchmark BM25 retrieval against Lucene and bm25s on a synthetic corpus.
///
/// Prints a table of index build speed and size, query throughput (single queries one at a time,
/// single queries from one concurrent client per core, batches), single-query latency and recall,
/// with the anchors' figures and the ratios against them (above 1 means kart is better), and how
/// often kart's top k equals Lucene's.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Passages in the synthetic corpus.
    #[arg(long, default_value_t = 1_000_000)]
    pub(super) passages: u64,
    /// Queries, each with a known answer passage.
    #[arg(long, default_value_t = 10_000)]
    pub(super) queries: u64,
    /// Queries per batch in the batched measurement.
    #[arg(long, default_value_t = 512)]
    pub(super) batch: usize,
    /// Results per query; recall is measured at this depth.
    #[arg(long, default_value_t = 3)]
    pub(super) topk: usize,
    /// Words in the vocabulary (English stop words, then synthetic words).
    #[arg(long, default_value_t = 200_000)]
    pub(super) vocab: usize,
    /// Zipf exponent of word frequencies.
    #[arg(long, default_value_t = 1.0)]
    pub(super) zipf: f64,
    /// Seed of the corpus and queries.
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Indexing memory budget in MiB.
    #[arg(long, default_value_t = 1024)]
    pub(super) memory_mb: usize,
    /// Folder for the corpus, queries and index, kept afterwards [default: a temporary folder].
    #[arg(long)]
    pub(super) work: Option<PathBuf>,
    /// Search the corpus, queries and index an earlier run of the same settings left in `--work`
    /// (its `settings.json` says which) instead of generating and indexing them again (wiki-18's
    /// size takes 20 minutes); the build is then not measured.
    #[arg(long, requires = "work")]
    pub(super) reuse: bool,
    /// Skip the anchors.
    #[arg(long)]
    pub(super) no_anchor: bool,
    /// The BM25 anchors to run.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "lucene,bm25s")]
    pub(super) anchors: Vec<Bm25Anchor>,
    /// Java launcher of the Lucene anchor (JDK 17 or newer).
    #[arg(long, default_value = "java")]
    pub(super) java: PathBuf,
    /// Folder of the Lucene anchor's jars [default: $KART_LUCENE_JARS, else ~/.cache/kart/lucene,
    /// where scripts/lucene.sh fetches them].
    #[arg(long)]
    pub(super) lucene_jars: Option<PathBuf>,
    /// Python interpreter of the anchor, with the packages of scripts/requirements.txt.
    #[arg(long, default_value = "python3")]
    pub(super) python: PathBuf,
    /// Also write the results to this file as JSON.
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
    /// Benchmark the dense index instead: its approximate graph (usearch HNSW) against the exact
    /// scan and faiss's HNSW, on `--passages` synthetic embeddings (`--queries`, `--batch`,
    /// `--seed`, `--work`, `--no-anchor`, `--python` and `--json` apply too).
    #[arg(long)]
    pub(super) dense: bool,
    /// Dimension of the synthetic embeddings (--dense; e5-base's 768 by default).
    #[arg(long, requires = "dense", default_value_t = 768)]
    pub(super) dim: usize,
    /// Links per node of the graph (--dense).
    #[arg(long, requires = "dense", default_value_t = AnnConfig::default().connectivity)]
    pub(super) ann_connectivity: usize,
    /// Candidates kept while inserting (--dense).
    #[arg(long, requires = "dense", default_value_t = AnnConfig::default().expansion_add)]
    pub(super) ann_expansion_add: usize,
    /// Candidates explored per query (--dense): each value is measured on the same graph.
    #[arg(long, requires = "dense", value_delimiter = ',', default_value = "16,32,64,128")]
    pub(super) ann_expansion_search: Vec<usize>,
    /// How the graph stores each vector (--dense).
    #[arg(long, requires = "dense", value_enum, default_value = "i8")]
    pub(super) ann_quantization: Quantization,
    /// Candidates re-scored exactly against the f32 embeddings (--dense; at least 10 are): each
    /// value is measured with each `--ann-expansion-search` [default: 10,25,50; 70,100,200,400 for
    /// b1].
    #[arg(long, requires = "dense", value_delimiter = ',')]
    pub(super) ann_rerank: Vec<usize>,
    /// Lists of the faiss IVF-PQ anchor of a b1 graph (--dense; each vector stored in as many
    /// bytes as b1 stores it, 8 dimensions a byte).
    #[arg(long, requires = "dense", default_value_t = 1024)]
    pub(super) ivf_lists: usize,
    /// Lists probed per query by the IVF-PQ anchor (--dense): each value is measured.
    #[arg(long, requires = "dense", value_delimiter = ',', default_value = "2,4,8,16,32,64")]
    pub(super) ivf_probes: Vec<usize>,
    /// Where the exact scan runs (--dense): `cpu`, or `cuda` (f16, sharded over every visible
    /// GPU, as a dense index is served there).
    #[arg(long, requires = "dense", default_value = "cpu", value_parser = super::parse_device)]
    pub(super) device: Device,
    /// Only the exact scan, against its torch anchor (--dense): no graph, no faiss.
    #[arg(long, requires = "dense")]
    pub(super) exact_only: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.dense {
        return super::dense::run(&args);
    }
    anyhow::ensure!(args.passages > 0 && args.queries > 0, "--passages and --queries must be at least 1");
    anyhow::ensure!(args.topk > 0 && args.batch > 0, "--topk and --batch must be at least 1");
    anyhow::ensure!(args.vocab > STOPWORDS.len(), "--vocab must exceed the {} stop words", STOPWORDS.len());
    let work = WorkDir::new(args.work.clone())?;
    let corpus = work.path.join("corpus.jsonl");
    let queries_path = work.path.join("queries.jsonl");
    let index_dir = work.path.join("index");
    let settings = Settings::of(&args);
    let generator = Generator::new(args.seed, args.vocab, args.zipf);
    let queries = generator.queries(args.queries, args.passages);
    let texts: Vec<String> = queries.iter().map(|q| q.text.clone()).collect();
    let (corpus_bytes, docs, build_secs) = match args.reuse {
        true => {
            settings.check(&work.path)?;
            tracing::info!(dir = %work.path.display(), "reusing the corpus, queries and index");
            (std::fs::metadata(&corpus)?.len(), args.passages, f64::NAN)
        }
        false => {
            if index_dir.exists() {
                std::fs::remove_dir_all(&index_dir)
                    .with_context(|| format!("removing {}", index_dir.display()))?;
            }
            let _ = std::fs::remove_file(work.path.join(Settings::FILE));
            let corpus_bytes = generator.write_corpus(&corpus, args.passages)?;
            write_queries(&queries_path, &queries)?;
            tracing::info!(passages = args.passages, "building the BM25 index");
            let bar =
                progress_bar("{spinner} index [{elapsed_precise}] {bar:40} {bytes}/{total_bytes} {msg}");
            let started = Instant::now();
            let docs = bm25::build(&corpus, &index_dir, args.memory_mb << 20, |read, total, docs| {
                bar.set_length(total);
                bar.set_position(read);
                bar.set_message(format!("{docs} passages"));
            })?;
            let build_secs = started.elapsed().as_secs_f64();
            bar.finish_and_clear();
            settings.write(&work.path)?;
            (corpus_bytes, docs, build_secs)
        }
    };
    let index = Bm25Index::open(&index_dir)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    tracing::info!(queries = texts.len(), "warming up: one batched pass over the queries");
    batched(&index, &texts, args.batch, args.topk)?;
    tracing::info!("single queries, one at a time");
    let (sequential, results) = sequential(&index, &texts, args.topk)?;
    tracing::info!(clients = cores, "single queries, concurrent clients");
    let concurrent = concurrent(&index, &texts, args.topk, cores)?;
    tracing::info!(batch = args.batch, "batched queries");
    let batch_secs = batched(&index, &texts, args.batch, args.topk)?;
    drop(index);
    tracing::info!("single queries over HTTP, kart retriever serve");
    let served = super::served::served(&index_dir, &texts, args.topk, cores)?;
    let served_sequential = Timings { latencies: served.sequential, wall: served.sequential_wall };
    let served_concurrent = Timings { latencies: served.concurrent, wall: served.concurrent_wall };
    let found = queries
        .iter()
        .zip(&results)
        .filter(|(query, hits)| hits.iter().any(|hit| hit.document.id == query.answer.to_string()))
        .count();

    let kart = Measures {
        index_passages_per_second: docs as f64 / build_secs,
        index_seconds: build_secs,
        index_bytes: folder_size(&index_dir)?,
        single_qps: sequential.qps(),
        single_p50_ms: sequential.percentile_ms(50.0),
        single_p99_ms: sequential.percentile_ms(99.0),
        concurrent_qps: concurrent.qps(),
        concurrent_p99_ms: concurrent.percentile_ms(99.0),
        batch_qps: texts.len() as f64 / batch_secs,
        served_qps: served_sequential.qps(),
        served_p50_ms: served_sequential.percentile_ms(50.0),
        served_p99_ms: served_sequential.percentile_ms(99.0),
        served_concurrent_qps: served_concurrent.qps(),
        served_concurrent_p99_ms: served_concurrent.percentile_ms(99.0),
        served_rss_mb: served.server_rss_mb,
        recall: found as f64 / queries.len() as f64,
    };
    let wanted = |anchor: Bm25Anchor| !args.no_anchor && args.anchors.contains(&anchor);
    let lucene = match wanted(Bm25Anchor::Lucene) {
        true => Some(lucene_anchor(&args, &corpus, &queries_path, &work.path, cores)?),
        false => None,
    };
    let agreement = lucene.as_ref().map(|l| Agreement::measure(&results, l)).transpose()?;
    let bm25s = match wanted(Bm25Anchor::Bm25s) {
        true => Some(bm25s_anchor(&args, &corpus, &queries_path, &work.path)?),
        false => None,
    };

    let report = Report {
        passages: docs,
        corpus_bytes,
        queries: texts.len(),
        topk: args.topk,
        batch: args.batch,
        vocab: args.vocab,
        zipf: args.zipf,
        seed: args.seed,
        cores,
        rows: rows(&kart, [bm25s.as_ref(), lucene.as_ref()], &args, cores),
        kart,
        bm25s,
        lucene,
        agreement,
    };
    report.print();
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a corpus, its queries and its index were generated from, kept beside them for `--reuse`.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Settings {
    passages: u64,
    queries: u64,
    vocab: usize,
    zipf: f64,
    seed: u64,
}

impl Settings {
    const FILE: &str = "settings.json";

    fn of(args: &Args) -> Settings {
        Settings {
            passages: args.passages,
            queries: args.queries,
            vocab: args.vocab,
            zipf: args.zipf,
            seed: args.seed,
        }
    }

    fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(Self::FILE);
        std::fs::write(&path, serde_json::to_string(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Fails unless `dir` holds a complete run of these settings.
    fn check(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(Self::FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!("--reuse: {} has no complete earlier run ({} is missing)", dir.display(), path.display())
        })?;
        let earlier: Settings =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        anyhow::ensure!(
            earlier == *self,
            "--reuse: {} holds a run of {earlier:?}, not of {self:?}; run without --reuse to rebuild it",
            dir.display()
        );
        Ok(())
    }
}

/// Lucene's English stop words (tantivy's list): the most frequent words of the vocabulary.
const STOPWORDS: [&str; 33] = [
    "the", "of", "and", "in", "to", "a", "is", "was", "for", "as", "on", "by", "with", "that", "it", "at",
    "be", "are", "this", "an", "or", "not", "their", "they", "these", "such", "no", "if", "into", "then",
    "there", "but", "will",
];
const CONSONANTS: &[u8; 16] = b"bdfghjklmnprtvwz";
/// No `e`, `i` or `y`: an English (Porter2) stemmer strips none of the resulting word endings.
const VOWELS: &[u8; 3] = b"aou";

/// Stream numbers of [`Rng::new`].
const PASSAGE_STREAM: u64 = 1;
const QUERY_STREAM: u64 = 2;

/// SplitMix64: small, fast and fixed forever, so a seed names the same corpus on every platform and
/// kart version, and each passage or query has its own generator (generation is parallel).
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64, item: u64) -> Self {
        let mut mixer = Rng(seed ^ stream.rotate_left(32));
        Rng(mixer.next_u64() ^ item.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `range`.
    fn between(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        let span = range.end() - range.start() + 1;
        range.start() + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }
}

/// Words of the synthetic corpus by rank and their Zipf sampler.
struct Generator {
    seed: u64,
    words: Vec<String>,
    /// Cumulative Zipf weights of the ranks.
    cumulative: Vec<f64>,
}

/// A passage or query, as word ranks.
struct Passage {
    title: Vec<usize>,
    text: Vec<usize>,
}

/// A query and the corpus ordinal (also its id) of the passage it was drawn from.
#[derive(Serialize)]
struct Query {
    #[serde(rename = "query")]
    text: String,
    #[serde(serialize_with = "serialize_id")]
    answer: u64,
}

/// Ids are written as JSON strings, as in Search-R1's corpora.
fn serialize_id<S: serde::Serializer>(id: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(id)
}

impl Generator {
    fn new(seed: u64, vocab: usize, exponent: f64) -> Self {
        let synthetic = (0..vocab - STOPWORDS.len()).map(synthetic_word);
        let words = STOPWORDS.iter().map(|w| w.to_string()).chain(synthetic).collect();
        let cumulative = (1..=vocab)
            .scan(0.0, |sum, rank| {
                *sum += (rank as f64).powf(-exponent);
                Some(*sum)
            })
            .collect();
        Generator { seed, words, cumulative }
    }

    fn word(&self, rng: &mut Rng) -> usize {
        let target = rng.unit() * self.cumulative.last().expect("a vocabulary");
        self.cumulative.partition_point(|&c| c <= target).min(self.words.len() - 1)
    }

    fn content_word(&self, rng: &mut Rng) -> usize {
        loop {
            let word = self.word(rng);
            if word >= STOPWORDS.len() {
                return word;
            }
        }
    }

    fn passage(&self, ordinal: u64) -> Passage {
        let mut rng = Rng::new(self.seed, PASSAGE_STREAM, ordinal);
        let title = (0..rng.between(1..=3)).map(|_| self.content_word(&mut rng)).collect();
        let text = (0..rng.between(80..=120)).map(|_| self.word(&mut rng)).collect();
        Passage { title, text }
    }

    fn words(&self, ranks: &[usize]) -> String {
        ranks.iter().map(|&r| self.words[r].as_str()).collect::<Vec<_>>().join(" ")
    }

    /// Writes `passages` passages as Search-R1 JSON lines; returns the file's size.
    fn write_corpus(&self, path: &Path, passages: u64) -> anyhow::Result<u64> {
        #[derive(Serialize)]
        struct Row {
            id: String,
            contents: String,
        }
        const CHUNK: u64 = 20_000;
        tracing::info!(passages, path = %path.display(), "generating the corpus");
        let bar = progress_bar("{spinner} corpus [{elapsed_precise}] {bar:40} {pos}/{len} passages");
        bar.set_length(passages);
        let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::new(file);
        for start in (0..passages).step_by(CHUNK as usize) {
            let lines: Vec<String> = (start..passages.min(start + CHUNK))
                .into_par_iter()
                .map(|ordinal| {
                    let passage = self.passage(ordinal);
                    let contents = kart_core::agent::search_r1::contents(
                        &self.words(&passage.title),
                        &self.words(&passage.text),
                    );
                    serde_json::to_string(&Row { id: ordinal.to_string(), contents })
                        .expect("a row serialises")
                })
                .collect();
            for line in lines {
                writeln!(out, "{line}")?;
            }
            bar.inc(CHUNK.min(passages - start));
        }
        out.flush()?;
        bar.finish_and_clear();
        Ok(std::fs::metadata(path)?.len())
    }

    /// `n` queries over a corpus of `passages` passages.
    fn queries(&self, n: u64, passages: u64) -> Vec<Query> {
        (0..n)
            .into_par_iter()
            .map(|i| {
                let mut rng = Rng::new(self.seed, QUERY_STREAM, i);
                let answer = rng.between(0..=passages - 1);
                let mut pool: Vec<usize> =
                    self.passage(answer).text.into_iter().filter(|&w| w >= STOPWORDS.len()).collect();
                pool.sort_unstable();
                pool.dedup();
                // A partial Fisher-Yates shuffle picks the query's words.
                let k = (rng.between(4..=6) as usize).min(pool.len());
                for j in 0..k {
                    let pick = rng.between(j as u64..=pool.len() as u64 - 1) as usize;
                    pool.swap(j, pick);
                }
                pool.truncate(k);
                if rng.between(0..=1) == 1 {
                    let at = rng.between(0..=k as u64) as usize;
                    pool.insert(at, rng.between(0..=STOPWORDS.len() as u64 - 1) as usize);
                }
                Query { text: self.words(&pool), answer }
            })
            .collect()
    }
}

/// The synthetic word of a rank: the rank (offset to have at least two digits) in base 48, one
/// consonant-vowel syllable per digit. Distinct ranks give distinct words, never stop words.
fn synthetic_word(rank: usize) -> String {
    let base = CONSONANTS.len() * VOWELS.len();
    let mut digits = Vec::new();
    let mut n = rank + base;
    while n > 0 {
        digits.push(n % base);
        n /= base;
    }
    digits
        .iter()
        .rev()
        .flat_map(|&d| [CONSONANTS[d / VOWELS.len()] as char, VOWELS[d % VOWELS.len()] as char])
        .collect()
}

fn write_queries(path: &Path, queries: &[Query]) -> anyhow::Result<()> {
    let mut out =
        BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?);
    for query in queries {
        serde_json::to_writer(&mut out, query)?;
        out.write_all(b"\n")?;
    }
    Ok(out.flush()?)
}

/// Latencies of single queries and the wall time they took.
struct Timings {
    latencies: Vec<Duration>,
    wall: Duration,
}

impl Timings {
    fn qps(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }

    /// Linearly interpolated, like numpy's default.
    fn percentile_ms(&self, p: f64) -> f64 {
        let mut ms: Vec<f64> = self.latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let rank = p / 100.0 * (ms.len() - 1) as f64;
        let (low, high) = (rank.floor() as usize, rank.ceil() as usize);
        ms[low] + (ms[high] - ms[low]) * (rank - low as f64)
    }
}

type Hits = Vec<kart_core::agent::search_r1::RetrievalResult>;

/// One query at a time on this thread.
fn sequential(index: &Bm25Index, queries: &[String], topk: usize) -> anyhow::Result<(Timings, Vec<Hits>)> {
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(queries.len());
    let mut results = Vec::with_capacity(queries.len());
    for query in queries {
        let began = Instant::now();
        results.push(index.search(query, topk)?);
        latencies.push(began.elapsed());
    }
    Ok((Timings { latencies, wall: started.elapsed() }, results))
}

/// `clients` threads, each sending one query at a time, as concurrent clients of a server do.
fn concurrent(index: &Bm25Index, queries: &[String], topk: usize, clients: usize) -> anyhow::Result<Timings> {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let per_client = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                scope.spawn(|| {
                    let mut latencies = Vec::new();
                    while let Some(query) = queries.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let began = Instant::now();
                        index.search(query, topk)?;
                        latencies.push(began.elapsed());
                    }
                    anyhow::Ok(latencies)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    Ok(Timings { latencies: per_client.concat(), wall: started.elapsed() })
}

/// Seconds to answer all queries in batches of `batch` through [`LocalIndex::search_batch`].
fn batched(index: &Bm25Index, queries: &[String], batch: usize, topk: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for chunk in queries.chunks(batch) {
        index.search_batch(chunk, topk)?;
    }
    Ok(started.elapsed().as_secs_f64())
}

pub(super) fn folder_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

pub(super) fn progress_bar(template: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    bar
}

/// The bench's folder: the one given, or a temporary one removed when the bench ends.
pub(super) struct WorkDir {
    pub(super) path: PathBuf,
    temporary: bool,
}

impl WorkDir {
    pub(super) fn new(given: Option<PathBuf>) -> anyhow::Result<Self> {
        let (path, temporary) = match given {
            Some(path) => (path, false),
            None => (std::env::temp_dir().join(format!("kart-bench-retriever-{}", std::process::id())), true),
        };
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(WorkDir { path, temporary })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.temporary {
            // Best effort: a leftover temporary folder is harmless.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// kart's figures.
#[derive(Debug, Serialize)]
struct Measures {
    index_seconds: f64,
    index_passages_per_second: f64,
    index_bytes: u64,
    single_qps: f64,
    single_p50_ms: f64,
    single_p99_ms: f64,
    concurrent_qps: f64,
    concurrent_p99_ms: f64,
    batch_qps: f64,
    /// Single queries over HTTP (`kart retriever serve`), one client.
    served_qps: f64,
    served_p50_ms: f64,
    served_p99_ms: f64,
    /// Single queries over HTTP, one client per core.
    served_concurrent_qps: f64,
    served_concurrent_p99_ms: f64,
    /// The server's resident memory after the queries, MB.
    served_rss_mb: f64,
    recall: f64,
}

/// The BM25 anchors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Bm25Anchor {
    /// Lucene 9 (`scripts/bench/LuceneAnchor.java`), the engine of pyserini and Anserini.
    Lucene,
    /// bm25s with its numba backend (`scripts/bench/retriever_anchor.py`).
    Bm25s,
}

/// An anchor's figures, as its script writes them (the fields it cannot measure absent).
#[derive(Debug, Serialize, Deserialize)]
struct Anchor {
    anchor: String,
    index_seconds: f64,
    index_passages_per_second: f64,
    index_bytes: Option<u64>,
    single_qps: f64,
    single_p50_ms: f64,
    single_p99_ms: f64,
    concurrent_qps: f64,
    concurrent_p99_ms: Option<f64>,
    batch_qps: Option<f64>,
    recall: f64,
    /// Lucene's: the file of every query's hits, `id score` pairs on one line per query.
    hits: Option<PathBuf>,
}

/// The flags every BM25 anchor takes: the corpus, the queries and the depth.
fn files_arguments(args: &Args, corpus: &Path, queries: &Path) -> Vec<OsString> {
    vec![
        "--corpus".into(),
        corpus.into(),
        "--queries".into(),
        queries.into(),
        "--topk".into(),
        args.topk.to_string().into(),
    ]
}

fn bm25s_anchor(args: &Args, corpus: &Path, queries: &Path, work: &Path) -> anyhow::Result<Anchor> {
    tracing::info!("running the bm25s anchor (scripts/bench/retriever_anchor.py)");
    let mut arguments = files_arguments(args, corpus, queries);
    arguments.extend(["--batch".into(), args.batch.to_string().into()]);
    run_anchor(args, AnchorScript::BM25S, &arguments, work, "anchor.json")
}

fn lucene_anchor(
    args: &Args,
    corpus: &Path,
    queries: &Path,
    work: &Path,
    cores: usize,
) -> anyhow::Result<Anchor> {
    tracing::info!("running the Lucene anchor (scripts/bench/LuceneAnchor.java)");
    let mut arguments = files_arguments(args, corpus, queries);
    arguments.extend(["--threads".into(), cores.to_string().into(), "--work".into(), work.into()]);
    run_anchor(args, AnchorScript::LUCENE, &arguments, work, "lucene.json")
}

/// Lucene's BM25 leaves out the `k1 + 1` factor of the term frequency's numerator that tantivy
/// keeps (a constant, so the ranking is the same): kart's score is Lucene's times this.
const LUCENE_SCORE_SCALE: f32 = 1.0 + 1.2;
/// Scores closer than this (relative) are equal: the engines add a query's terms in different
/// orders, in f32.
const EQUAL_SCORES: f32 = 1e-5;

/// How kart's top k compares with Lucene's, query by query.
#[derive(Debug, Serialize)]
struct Agreement {
    queries: usize,
    /// The same passages in the same order.
    identical: usize,
    /// Different passages or order only where the two scores at that rank are equal.
    equal_scores_apart: usize,
    /// The rest: the first few queries' hits, kart's then Lucene's.
    different: usize,
    examples: Vec<String>,
    /// The largest relative difference between kart's and Lucene's (scaled) score of a passage
    /// both ranked.
    max_score_difference: f32,
}

impl Agreement {
    fn measure(kart: &[Hits], lucene: &Anchor) -> anyhow::Result<Agreement> {
        let path = lucene.hits.as_deref().context("the Lucene anchor wrote no hits file")?;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let lines: Vec<&str> = text.lines().collect();
        anyhow::ensure!(
            lines.len() == kart.len(),
            "{} has {} queries' hits, kart answered {}",
            path.display(),
            lines.len(),
            kart.len()
        );
        let mut agreement = Agreement {
            queries: kart.len(),
            identical: 0,
            equal_scores_apart: 0,
            different: 0,
            examples: Vec::new(),
            max_score_difference: 0.0,
        };
        let relative = |a: f32, b: f32| (a - b).abs() / a.abs().max(b.abs()).max(f32::MIN_POSITIVE);
        for (ours, line) in kart.iter().zip(lines) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let theirs = words
                .chunks(2)
                .map(|pair| match pair {
                    [id, score] => Ok((*id, score.parse::<f32>()? * LUCENE_SCORE_SCALE)),
                    _ => bail!("{}: a hit without its score in {line:?}", path.display()),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            for (hit, (id, score)) in ours.iter().zip(&theirs) {
                if hit.document.id == *id {
                    agreement.max_score_difference =
                        agreement.max_score_difference.max(relative(hit.score as f32, *score));
                }
            }
            let same = ours.len() == theirs.len()
                && ours.iter().zip(&theirs).all(|(h, (id, _))| h.document.id == *id);
            let tied = ours.len() == theirs.len()
                && ours
                    .iter()
                    .zip(&theirs)
                    .all(|(h, (_, score))| relative(h.score as f32, *score) <= EQUAL_SCORES);
            if same {
                agreement.identical += 1;
            } else if tied {
                agreement.equal_scores_apart += 1;
            } else {
                agreement.different += 1;
                if agreement.examples.len() < 5 {
                    let ours: Vec<String> =
                        ours.iter().map(|h| format!("{} {:.5}", h.document.id, h.score)).collect();
                    let theirs: Vec<String> = theirs.iter().map(|(id, s)| format!("{id} {s:.5}")).collect();
                    agreement.examples.push(format!(
                        "kart [{}], Lucene [{}]",
                        ours.join(", "),
                        theirs.join(", ")
                    ));
                }
            }
        }
        Ok(agreement)
    }
}

/// An anchor script, built into the binary so that it runs wherever the binary does.
#[derive(Clone, Copy)]
pub(super) struct AnchorScript {
    name: &'static str,
    source: &'static str,
    runner: Runner,
}

/// What runs an anchor script.
#[derive(Clone, Copy)]
enum Runner {
    /// `--python`.
    Python,
    /// `--java` as a single-file program, with the jars of `--lucene-jars`.
    Java,
}

impl AnchorScript {
    /// bm25s on the same corpus and queries.
    pub(super) const BM25S: Self = Self {
        name: "retriever_anchor.py",
        source: include_str!("../../../../../scripts/bench/retriever_anchor.py"),
        runner: Runner::Python,
    };
    /// Lucene on the same corpus and queries.
    pub(super) const LUCENE: Self = Self {
        name: "LuceneAnchor.java",
        source: include_str!("../../../../../scripts/bench/LuceneAnchor.java"),
        runner: Runner::Java,
    };
    /// torch's exact scan of the dense embeddings.
    pub(super) const EXACT: Self = Self {
        name: "exact_anchor.py",
        source: include_str!("../../../../../scripts/bench/exact_anchor.py"),
        runner: Runner::Python,
    };
    /// faiss's HNSW graph of the dense embeddings.
    pub(super) const FAISS: Self = Self {
        name: "dense_anchor.py",
        source: include_str!("../../../../../scripts/bench/dense_anchor.py"),
        runner: Runner::Python,
    };
}

/// Writes `anchor` into `work`, runs it with `arguments` and `--json work/out`, and reads its figures;
/// a failing anchor is an error saying how to install its packages.
pub(super) fn run_anchor<T: serde::de::DeserializeOwned>(
    args: &Args,
    anchor: AnchorScript,
    arguments: &[OsString],
    work: &Path,
    out: &str,
) -> anyhow::Result<T> {
    let script = work.join(anchor.name);
    std::fs::write(&script, anchor.source).with_context(|| format!("writing {}", script.display()))?;
    let out = work.join(out);
    let (mut command, launcher, install) = match anchor.runner {
        Runner::Python => (
            Command::new(&args.python),
            &args.python,
            "install its packages with `bash scripts/setup.sh` (scripts/requirements.txt)",
        ),
        Runner::Java => {
            let mut java = Command::new(&args.java);
            java.arg("-Xmx4g").arg("-cp").arg(lucene_classpath(args)?);
            (
                java,
                &args.java,
                "install a JDK and fetch its jars with `bash scripts/setup.sh` (scripts/lucene.sh)",
            )
        }
    };
    let status = command
        .arg(&script)
        .args(arguments)
        .arg("--json")
        .arg(&out)
        .status()
        .with_context(|| format!("starting {}", launcher.display()))?;
    if !status.success() {
        bail!("the anchor scripts/bench/{} failed ({status}); {install}, or pass --no-anchor", anchor.name);
    }
    let json = std::fs::read(&out).with_context(|| format!("reading {}", out.display()))?;
    serde_json::from_slice(&json).with_context(|| format!("parsing {}", out.display()))
}

/// The Lucene anchor's class path: the jars of `--lucene-jars`.
fn lucene_classpath(args: &Args) -> anyhow::Result<OsString> {
    let dir = match &args.lucene_jars {
        Some(dir) => dir.clone(),
        None => match std::env::var_os("KART_LUCENE_JARS") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/kart/lucene"),
        },
    };
    let mut jars: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    jars.retain(|p| p.extension().is_some_and(|e| e == "jar"));
    jars.sort();
    if jars.is_empty() {
        bail!(
            "--lucene-jars {}: no jars there; fetch them with `bash scripts/lucene.sh`, or pass --anchors bm25s",
            dir.display()
        );
    }
    Ok(std::env::join_paths(jars)?)
}

/// One line of the table.
#[derive(Debug, Serialize)]
struct Row {
    metric: String,
    kart: f64,
    /// bm25s's figure, then Lucene's, where measured.
    anchors: [Option<f64>; 2],
    /// How many times better kart is than each anchor.
    ratios: [Option<f64>; 2],
    target: Option<String>,
    met: Option<bool>,
}

/// Ratio targets against bm25s and Lucene, and the absolute ones of the retriever issues.
const QPS_RATIO_TARGETS: [f64; 2] = [3.0, 1.5];
const P99_TARGET_MS: f64 = 20.0;
/// wiki-18's served top 3 on 2 cores.
const SERVED_P99_TARGET_MS: f64 = 5.0;
const RECALL_TARGET: f64 = 0.95;

fn rows(kart: &Measures, anchors: [Option<&Anchor>; 2], args: &Args, cores: usize) -> Vec<Row> {
    let figure = |f: fn(&Anchor) -> Option<f64>| anchors.map(|a| a.and_then(f));
    let throughput = |metric: String, kart: f64, of: fn(&Anchor) -> Option<f64>, targeted: bool| {
        let values = figure(of);
        let ratios = values.map(|a| a.map(|a| kart / a));
        // Judged against the anchors that ran; without one there is nothing to judge.
        let compared = targeted && ratios.iter().any(Option::is_some);
        let met = compared.then(|| {
            ratios.iter().zip(QPS_RATIO_TARGETS).all(|(ratio, target)| ratio.is_none_or(|r| r >= target))
        });
        let target = targeted.then(|| format!(">= {}x/{}x", QPS_RATIO_TARGETS[0], QPS_RATIO_TARGETS[1]));
        Row { metric, kart, anchors: values, ratios, target, met }
    };
    let latency = |metric: String, kart: f64, of: fn(&Anchor) -> Option<f64>, target: Option<f64>| {
        let values = figure(of);
        Row {
            metric,
            kart,
            anchors: values,
            ratios: values.map(|a| a.map(|a| a / kart)),
            target: target.map(|t| format!("<= {t} ms")),
            met: target.map(|t| kart <= t),
        }
    };
    let recall = figure(|a| Some(a.recall));
    vec![
        throughput(
            "index build, passages/s".into(),
            kart.index_passages_per_second,
            |a| Some(a.index_passages_per_second),
            false,
        ),
        Row {
            metric: "index size, MB".into(),
            kart: kart.index_bytes as f64 / 1e6,
            anchors: figure(|a| a.index_bytes.map(|b| b as f64 / 1e6)),
            ratios: figure(|a| a.index_bytes.map(|b| b as f64))
                .map(|b| b.map(|b| b / kart.index_bytes as f64)),
            target: None,
            met: None,
        },
        throughput(
            "QPS, single queries, sequential (1 thread)".into(),
            kart.single_qps,
            |a| Some(a.single_qps),
            true,
        ),
        throughput(
            format!("QPS, single queries, {cores} concurrent clients"),
            kart.concurrent_qps,
            |a| Some(a.concurrent_qps),
            true,
        ),
        throughput(
            format!("QPS, batches of {} ({cores} cores)", args.batch),
            kart.batch_qps,
            |a| a.batch_qps,
            true,
        ),
        latency(
            "latency p50, single sequential, ms".into(),
            kart.single_p50_ms,
            |a| Some(a.single_p50_ms),
            None,
        ),
        latency(
            "latency p99, single sequential, ms".into(),
            kart.single_p99_ms,
            |a| Some(a.single_p99_ms),
            Some(P99_TARGET_MS),
        ),
        latency(
            format!("latency p99, {cores} concurrent clients, ms"),
            kart.concurrent_p99_ms,
            |a| a.concurrent_p99_ms,
            Some(P99_TARGET_MS),
        ),
        throughput("served over HTTP: QPS, one client".into(), kart.served_qps, |_| None, false),
        latency("served over HTTP: latency p50, ms".into(), kart.served_p50_ms, |_| None, None),
        latency(
            "served over HTTP: latency p99, ms".into(),
            kart.served_p99_ms,
            |_| None,
            Some(SERVED_P99_TARGET_MS),
        ),
        throughput(
            format!("served over HTTP: QPS, {cores} clients"),
            kart.served_concurrent_qps,
            |_| None,
            false,
        ),
        latency(
            format!("served over HTTP: latency p99, {cores} clients, ms"),
            kart.served_concurrent_p99_ms,
            |_| None,
            None,
        ),
        Row {
            metric: "served: the server's resident memory, MB".into(),
            kart: kart.served_rss_mb,
            anchors: [None, None],
            ratios: [None, None],
            target: None,
            met: None,
        },
        Row {
            metric: format!("recall@{}", args.topk),
            kart: kart.recall,
            anchors: recall,
            ratios: recall.map(|a| a.map(|a| kart.recall / a)),
            target: Some(format!(">= {RECALL_TARGET}")),
            met: Some(kart.recall >= RECALL_TARGET),
        },
    ]
}

/// Everything the bench measured (the `--json` file).
#[derive(Debug, Serialize)]
struct Report {
    passages: u64,
    corpus_bytes: u64,
    queries: usize,
    topk: usize,
    batch: usize,
    vocab: usize,
    zipf: f64,
    seed: u64,
    cores: usize,
    kart: Measures,
    bm25s: Option<Anchor>,
    lucene: Option<Anchor>,
    /// kart's top k against Lucene's.
    agreement: Option<Agreement>,
    rows: Vec<Row>,
}

impl Report {
    fn print(&self) {
        println!(
            "corpus: {} passages ({:.0} MB), vocabulary {} (Zipf {}), seed {}; {} queries, top {}; {} cores",
            self.passages,
            self.corpus_bytes as f64 / 1e6,
            self.vocab,
            self.zipf,
            self.seed,
            self.queries,
            self.topk,
            self.cores
        );
        let built = match self.kart.index_seconds {
            s if s.is_nan() => "reused (--reuse), build not measured".to_string(),
            s => format!("{s:.1}s"),
        };
        println!("kart: tantivy BM25, index {built} ({:.0} MB)", self.kart.index_bytes as f64 / 1e6);
        for anchor in [&self.lucene, &self.bm25s].into_iter().flatten() {
            println!("anchor: {}", anchor.anchor);
        }
        println!(
            "ratio: how many times better kart is (throughput kart/anchor, latency and size anchor/kart)\n"
        );
        println!(
            "{:<44} {:>10} {:>10} {:>7} {:>10} {:>7} {:>12} {:>5}",
            "metric", "kart", "bm25s", "ratio", "Lucene", "ratio", "target", "met?"
        );
        let value = |v: f64| match v {
            v if v.is_nan() => "-".to_string(),
            v if v < 10.0 => format!("{v:.3}"),
            v => format!("{v:.0}"),
        };
        let ratio = |r: Option<f64>| r.filter(|r| !r.is_nan()).map_or("-".into(), |r| format!("{r:.2}x"));
        for row in &self.rows {
            println!(
                "{:<44} {:>10} {:>10} {:>7} {:>10} {:>7} {:>12} {:>5}",
                row.metric,
                value(row.kart),
                row.anchors[0].map_or("-".into(), value),
                ratio(row.ratios[0]),
                row.anchors[1].map_or("-".into(), value),
                ratio(row.ratios[1]),
                row.target.as_deref().unwrap_or("-"),
                row.met.map_or("-", |met| if met { "yes" } else { "NO" }),
            );
        }
        if let Some(a) = &self.agreement {
            println!(
                "\ntop {} against Lucene's: {} of {} queries identical, {} apart only where the scores are equal \
                 (within {EQUAL_SCORES:e}), {} different; the largest score difference of a passage both ranked {:.1e}",
                self.topk, a.identical, a.queries, a.equal_scores_apart, a.different, a.max_score_difference
            );
            for example in &a.examples {
                println!("  {example}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kart_retriever::docstore::english_analyzer;

    #[test]
    fn synthetic_words_are_distinct_and_survive_english_analysis() {
        let mut analyzer = english_analyzer();
        let generator = Generator::new(0, 200_000, 1.0);
        let synthetic = &generator.words[STOPWORDS.len()..];
        for word in synthetic {
            let mut tokens = Vec::new();
            analyzer.token_stream(word).process(&mut |t| tokens.push(t.text.clone()));
            assert_eq!(tokens, [word.as_str()]);
        }
        let mut sorted = synthetic.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), synthetic.len());
        for stopword in STOPWORDS {
            let mut tokens = 0;
            analyzer.token_stream(stopword).process(&mut |_| tokens += 1);
            assert_eq!(tokens, 0, "{stopword}");
        }
    }

    #[test]
    fn generation_is_deterministic_and_queries_come_from_their_answer() {
        let generator = Generator::new(7, 1000, 1.0);
        let queries = generator.queries(50, 100);
        let again = Generator::new(7, 1000, 1.0).queries(50, 100);
        assert!(queries.iter().zip(&again).all(|(a, b)| a.text == b.text && a.answer == b.answer));
        for query in &queries {
            let passage = generator.words(&generator.passage(query.answer).text);
            let words: Vec<&str> = query.text.split(' ').collect();
            assert!((4..=7).contains(&words.len()), "{}", query.text);
            assert!(words.iter().all(|w| STOPWORDS.contains(w) || passage.split(' ').any(|p| p == *w)));
        }
    }
}
