//! `kart conformance PATH...`: checks kart against upstream test vectors.

use kart::conformance::{self, Report};
use std::path::PathBuf;
use std::process::ExitCode;

/// Check kart against test vectors produced by the upstream reference code.
///
/// Each PATH is a JSON-lines vector file or a folder searched for `*.jsonl` files. The schema of each
/// case is recognised from its fields. Every failing case is printed with its first difference; the
/// last line is `N passed, M failed`. Exits 1 when any case fails or a file cannot be read.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Vector files or folders.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut total = Report::default();
    let mut unreadable = 0;
    for path in &args.paths {
        let files = match conformance::vector_files(path) {
            Ok(files) if files.is_empty() => {
                eprintln!("error: {}: no *.jsonl vector files found", path.display());
                unreadable += 1;
                continue;
            }
            Ok(files) => files,
            Err(e) => {
                eprintln!("error: {e}");
                unreadable += 1;
                continue;
            }
        };
        for file in files {
            match conformance::check_file(&file) {
                Ok(report) => {
                    for failure in &report.failures {
                        println!("{failure}");
                    }
                    println!("{}: {}", file.display(), report.summary());
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
