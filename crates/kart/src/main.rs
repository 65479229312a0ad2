//! The `kart` command: every kart pod and `kart local` run it.

mod cli;

fn main() -> std::process::ExitCode {
    cli::run()
}
