//! What every benchmark shares: the Python that runs the anchor, the anchor as a JSON-lines
//! subprocess, taking turns with it, and the rows of the report.

use anyhow::{Context, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The flags of every benchmark that runs its anchor in Python.
#[derive(Debug, clap::Args)]
pub struct AnchorArgs {
    /// A small workload that finishes in seconds, to check the bench itself runs; its figures are
    /// not the benchmark's.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the workload (weights, prompts, batches, sentences).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Python interpreter of the anchor [default: $KART_VENV/bin/python, else the repository's
    /// .venv/bin/python].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Also write the figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl AnchorArgs {
    /// The Python that runs the anchor.
    pub fn python(&self) -> PathBuf {
        self.python.clone().unwrap_or_else(|| {
            let venv = std::env::var_os("KART_VENV")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
            venv.join("bin/python")
        })
    }

    /// A count: `given`, else `full`, or `quick` with `--quick`.
    pub fn or(&self, given: Option<usize>, full: usize, quick: usize) -> usize {
        given.unwrap_or(if self.quick { quick } else { full }).max(1)
    }
}

/// Fails with the way to install the anchor's packages when `python` cannot run `import {modules}`.
pub fn check_python(python: &Path, modules: &str) -> anyhow::Result<()> {
    let output = Command::new(python).args(["-c", &format!("import {modules}")]).output();
    let reason = match output {
        Ok(output) if output.status.success() => return Ok(()),
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().lines().last().unwrap_or("").to_owned(),
        Err(e) => e.to_string(),
    };
    bail!(
        "the anchor needs {modules}, which {} cannot import ({reason}); install them with \
         `bash scripts/setup.sh` (or pass --python)",
        python.display()
    )
}

/// The median of `values` (of which there is at least one).
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.collect();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) { (sorted[mid - 1] + sorted[mid]) / 2.0 } else { sorted[mid] }
}

/// Runs kart and the anchor `n` times each, alternating which goes first, so that a change in
/// the machine's load during the run favours neither.
pub fn take_turns<T, U>(
    n: usize,
    mut kart: impl FnMut() -> anyhow::Result<T>,
    mut anchor: impl FnMut() -> anyhow::Result<U>,
) -> anyhow::Result<(Vec<T>, Vec<U>)> {
    let (mut ours, mut theirs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for turn in 0..n {
        if turn % 2 == 0 {
            ours.push(kart()?);
            theirs.push(anchor()?);
        } else {
            theirs.push(anchor()?);
            ours.push(kart()?);
        }
    }
    Ok((ours, theirs))
}

/// One line of a report's table.
#[derive(Debug, Serialize)]
pub struct Row {
    pub metric: String,
    pub kart: f64,
    pub anchor: f64,
    /// kart / anchor.
    pub ratio: f64,
    /// The ratio's target, as shown (`>= 1.5x`).
    pub target: String,
    pub met: bool,
}

impl Row {
    /// A throughput row (higher is better): met when the ratio reaches `target`.
    pub fn at_least(metric: String, kart: f64, anchor: f64, target: f64) -> Self {
        let ratio = kart / anchor;
        Row { metric, kart, anchor, ratio, target: format!(">= {target:.1}x"), met: ratio >= target }
    }

    /// A duration row (lower is better): met when the ratio stays within `target`.
    pub fn at_most(metric: String, kart: f64, anchor: f64, target: f64) -> Self {
        let ratio = kart / anchor;
        Row { metric, kart, anchor, ratio, target: format!("<= {target:.1}x"), met: ratio <= target }
    }
}

/// Prints `rows` as a table: the metric, kart's figure, the anchor's (its column headed
/// `anchor`), the ratio and the target.
pub fn print_rows(rows: &[Row], anchor: &str) {
    println!("{:<28} {:>10} {:>12} {:>7} {:>8}  met?", "metric", "kart", anchor, "ratio", "target");
    for row in rows {
        let met = if row.met { "yes" } else { "no" };
        println!(
            "{:<28} {:>10.3} {:>12.3} {:>6.2}x {:>8}  {met}",
            row.metric, row.kart, row.anchor, row.ratio, row.target
        );
    }
}

/// An anchor script running in Python, answering one JSON request per line with one JSON line.
pub struct Anchor {
    name: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Anchor {
    /// Writes `source` to `dir/name` and starts it with `args`; returns the anchor and its first
    /// line (its configuration, printed once it is ready).
    pub fn start<I: DeserializeOwned>(
        python: &Path,
        dir: &Path,
        name: &str,
        source: &str,
        args: &[&OsStr],
    ) -> anyhow::Result<(Self, I)> {
        let script = dir.join(name);
        std::fs::write(&script, source).with_context(|| format!("writing {}", script.display()))?;
        let mut child = Command::new(python)
            .arg(&script)
            .args(args)
            .env("TRANSFORMERS_VERBOSITY", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().context("the anchor's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the anchor's stdout")?);
        let mut anchor = Anchor { name: name.to_string(), child, stdin, stdout };
        let info = anchor.read()?;
        Ok((anchor, info))
    }

    /// Sends `request` and reads the reply.
    pub fn call<T: DeserializeOwned>(&mut self, request: &Value) -> anyhow::Result<T> {
        writeln!(self.stdin, "{request}")
            .and_then(|()| self.stdin.flush())
            .context("writing to the anchor")?;
        self.read()
    }

    fn read<T: DeserializeOwned>(&mut self) -> anyhow::Result<T> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line).context("reading from the anchor")? == 0 {
            let status = self.child.wait()?;
            bail!("the anchor (scripts/bench/{}) exited ({status}); its error is above", self.name);
        }
        serde_json::from_str(&line).with_context(|| format!("the anchor's reply {line:?}"))
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        // Best effort: the anchor exits at the end of its input; make sure of it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 3.0, 2.0].into_iter()), 2.5);
    }
}
