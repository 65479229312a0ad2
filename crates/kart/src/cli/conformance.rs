//! `kart conformance PATH...`: checks kart against upstream test vectors.

use kart::conformance::{self, Report, Target};
use std::path::PathBuf;
use std::process::ExitCode;

/// Check kart against test vectors produced by the upstream reference code.
///
/// Each PATH is a JSON-lines vector file, a model folder with transformers' oracle outputs
/// (`expected.json`, `expected.safetensors`), or a folder searched for both. The schema of each
/// vector case is recognised from its fields. With `--encoder`, each PATH is instead a file of
/// sentence embeddings (`sentences`, `embeddings`) checked with that encoder. Every failing case is
/// printed with its first difference; the last line is `N passed, M failed`. Exits 1 when any case fails or a file cannot be read.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Vector files, model folders, or folders holding them.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Check sentence-embedding files with the encoder in this Hugging Face folder.
    #[arg(long, value_name = "MODEL_DIR")]
    encoder: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut total = Report::default();
    let mut unreadable = 0;
    for path in &args.paths {
        let targets = match &args.encoder {
            Some(encoder) => Ok(vec![Target::Embeddings { file: path.clone(), encoder: encoder.clone() }]),
            None => conformance::targets(path),
        };
        let targets = match targets {
            Ok(targets) if targets.is_empty() => {
                eprintln!("error: {}: no *.jsonl vector files or model folders found", path.display());
                unreadable += 1;
                continue;
            }
            Ok(targets) => targets,
            Err(e) => {
                eprintln!("error: {e}");
                unreadable += 1;
                continue;
            }
        };
        for target in targets {
            match conformance::check(&target) {
                Ok(report) => {
                    for failure in &report.failures {
                        println!("{failure}");
                    }
                    println!("{}: {}", target.path().display(), report.summary());
                    total.merge(report);
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    unreadable += 1;
                }
            }
        }
    }
    println!("{}", total.summary());
    Ok(if total.failures.is_empty() && unreadable == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
