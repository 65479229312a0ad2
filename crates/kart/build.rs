//! Keeps libtorch's CUDA half in the `kart` binary. Nothing in kart calls libtorch_cuda directly,
//! so the linker's `--as-needed` would drop it and CUDA would be missing in a GPU pod; tch's
//! documented remedy links libtorch (which needs libtorch_cuda in a CUDA build) after
//! `--no-as-needed`, so the loader brings libtorch_cuda in with it. A CPU-only libtorch has no libtorch_cuda, and then nothing changes.
fn main() {
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
}
