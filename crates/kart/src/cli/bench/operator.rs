//! `kart bench operator`: the operator at scale on KWOK's simulated nodes, measured by the
//! operator binary beside this one (`kart-operator bench`, whose flags these are: the Kubernetes
//! client lives in the operator's crate, which `kart` does not link).

use anyhow::Context;
use std::process::{Command, ExitCode};

/// Measure the operator at scale on simulated GPU nodes (`kart bench operator --help` lists the
/// flags of `kart-operator bench`).
#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
pub struct Args {
    /// The flags of `kart-operator bench`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("the kart binary's path")?;
    let operator = exe.with_file_name("kart-operator");
    let status = Command::new(&operator).arg("bench").args(&args.args).status().with_context(|| {
        format!("running {} (built with `cargo build -p kart-operator`)", operator.display())
    })?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
