//! Helpers for kart's process-level tests: locating the built binaries and the shared test material.

use std::path::{Path, PathBuf};

/// The repository root (the workspace folder).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_path_buf()
}

/// `../shared` beside the repository: conformance vectors, fixtures and seeds.
pub fn shared_dir() -> PathBuf {
    repo_root().join("../shared")
}

/// A binary of the workspace, built in the same profile as the running test.
///
/// Test executables live in `<target>/<profile>/deps/`; binaries in `<target>/<profile>/`. The
/// binaries must be built first (`cargo build --release --workspace --bins`, as `make test` does).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("test executable in <profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} not found: build the binaries first (cargo build --release --workspace --bins)",
        path.display()
    );
    path
}
