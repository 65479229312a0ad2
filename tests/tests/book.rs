//! The book in docs/ (mdBook): its generated reference pages are current, it builds, and every
//! link in it and in the README resolves.

use kart_tests::reference::pages;
use kart_tests::{repo_root, walk_files};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn the_generated_reference_pages_are_current() {
    let bless = std::env::var_os("KART_BLESS").is_some();
    let mut stale = Vec::new();
    let root = repo_root().canonicalize().unwrap();
    for page in pages() {
        // A page naming this checkout's folder would be stale in every other clone.
        assert!(
            !page.text.contains(root.to_str().unwrap()),
            "{} names this checkout's folder {}; a default must not depend on where the repository is",
            page.path,
            root.display()
        );
        let path = repo_root().join("docs/src").join(page.path);
        if bless {
            std::fs::write(&path, &page.text).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(page.text.as_str()) {
            stale.push(page.path);
        }
    }
    assert!(
        stale.is_empty(),
        "stale in docs/src: {stale:?}; `KART_BLESS=1 cargo test --release --workspace --test book` rewrites them"
    );
}

/// The `href`s and `src`s of an HTML page.
fn links(html: &str) -> Vec<String> {
    let pattern = regex::Regex::new(r#"(?:href|src)="([^"]*)""#).unwrap();
    pattern.captures_iter(html).map(|c| c[1].to_string()).collect()
}

/// The `id`s of an HTML page.
fn ids(html: &str) -> BTreeSet<String> {
    let pattern = regex::Regex::new(r#"\bid="([^"]*)""#).unwrap();
    pattern.captures_iter(html).map(|c| c[1].to_string()).collect()
}

/// Whether `link` leaves the site.
fn external(link: &str) -> bool {
    ["http://", "https://", "mailto:", "javascript:"].iter().any(|s| link.starts_with(s))
}

/// The file `link` of `from` names, and its fragment.
fn target(from: &Path, link: &str) -> (PathBuf, Option<String>) {
    let (path, fragment) = match link.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment.to_string())),
        None => (link, None),
    };
    let path = path.split('?').next().unwrap_or_default();
    let file = if path.is_empty() { from.to_path_buf() } else { from.parent().unwrap().join(path) };
    (file, fragment)
}

/// mdBook: on the `PATH`, else where `cargo install` (`make mdbook`) put it.
fn mdbook() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|p| p.join("mdbook")).find(|p| p.is_file()))
        .unwrap_or_default();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    on_path.or_else(|| cargo_home.map(|h| h.join("bin/mdbook"))).unwrap_or_else(|| "mdbook".into())
}

#[test]
fn the_book_builds_and_every_link_resolves() {
    let out = tempfile::tempdir().unwrap();
    let built = Command::new(mdbook())
        .arg("build")
        .arg(repo_root().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .expect("mdbook (`make mdbook` installs it)");
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success() && !stderr.contains("WARN"), "mdbook build: {stderr}");
    let pages: Vec<PathBuf> = walk_files(out.path())
        .into_iter()
        // print.html repeats every page; 404.html's links are absolute, for the site's root.
        .filter(|p| p.extension().is_some_and(|e| e == "html"))
        .filter(|p| !p.ends_with("print.html") && !p.ends_with("404.html"))
        .collect();
    assert!(pages.len() >= 20, "{pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let html = std::fs::read_to_string(page).unwrap();
        for link in links(&html).iter().filter(|l| !external(l)) {
            let (file, fragment) = target(page, link);
            let found = match std::fs::read_to_string(&file) {
                Err(_) => file.is_file() || file.join("index.html").is_file(),
                Ok(text) => fragment.as_ref().is_none_or(|f| ids(&text).contains(f)),
            };
            if !found {
                broken.push(format!("{}: {link}", page.strip_prefix(out.path()).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn every_link_of_the_readme_resolves() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let pattern = regex::Regex::new(r"\]\(([^)]+)\)").unwrap();
    let mut broken = Vec::new();
    for link in pattern.captures_iter(&readme).map(|c| c[1].to_string()).filter(|l| !external(l)) {
        let (file, _) = target(&repo_root().join("README.md"), &link);
        if !file.exists() {
            broken.push(link);
        }
    }
    assert!(broken.is_empty(), "README links to nothing: {broken:?}");
}
