//! The progress bars of long local work (hidden when stderr is not a terminal, as in pods).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar named `prefix` over `total` steps starting at `done`.
pub fn bar(prefix: &'static str, total: u64, done: u64) -> ProgressBar {
    let bar = ProgressBar::new(total).with_position(done);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {pos}/{len} steps · {elapsed}, ETA {eta} · {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(prefix);
    bar
}
