//! The crate layout's promise: libtorch stays out of every crate that does not use it (the
//! operator, the pure core, and the rollout worker that SGLang and vLLM engines run in), without
//! feature flags.

use kart_tests::repo_root;
use std::process::Command;

/// The packages `package` depends on to build and run (dev-dependencies aside), one per line.
fn dependencies(package: &str) -> String {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(repo_root())
        .args(["tree", "--locked", "-p", package, "-e", "normal,build", "--prefix", "none"])
        .output()
        .expect("run cargo tree");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("cargo tree prints UTF-8")
}

#[test]
fn libtorch_stays_out_of_the_crates_that_do_not_use_it() {
    for package in [
        "kart-core",
        "kart-tokenizer",
        "kart-http",
        "kart-tools",
        "kart-tracking",
        "kart-viewer",
        "kart-rollout",
        "kart-operator",
    ] {
        let tree = dependencies(package);
        assert!(tree.lines().any(|l| l.starts_with(package)), "{package}: {tree}");
        assert!(
            !tree.lines().any(|l| l.starts_with("torch-sys") || l.starts_with("tch ")),
            "{package} links libtorch"
        );
    }
    assert!(
        dependencies("kart-model").lines().any(|l| l.starts_with("torch-sys")),
        "the check sees libtorch"
    );
}
