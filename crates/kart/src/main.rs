//! The `kart` command: every kart pod and `kart local` run it.

mod cli;

/// mimalloc for every Rust allocation: the rollout loop's tokenizer and HTTP work allocate small
/// buffers from many threads, where glibc's arenas contend (`kart bench rollout`: 30% less CPU
/// per trajectory at 256 in flight). libtorch's tensors keep their own allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::run()
}
