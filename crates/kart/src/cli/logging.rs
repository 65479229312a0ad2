//! Logs: human-readable on a terminal, JSON lines elsewhere (pods), filtered by `KART_LOG`
//! (default `info`), always on stderr so stdout stays for command output.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber.
pub fn init() {
    let filter = EnvFilter::try_from_env("KART_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if std::io::stderr().is_terminal() {
        builder.init();
    } else {
        builder.json().init();
    }
}
