//! The book's metrics table (docs/src/reference/metrics.md) documents every metric the code
//! registers, and nothing else.

use kart_tests::repo_root;
use std::collections::BTreeSet;

/// Metric names registered in the source: `"kart_<component>_…"` string literals.
fn registered() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let pattern = regex_lite(r#""kart_(retriever|rollout|trainer|operator)_[a-z0-9_]+""#);
    for dir in ["crates", "operator/src"] {
        visit(&repo_root().join(dir), &mut |text| {
            for m in pattern.find_iter(text) {
                names.insert(m.as_str().trim_matches('"').to_string());
            }
        });
    }
    names
}

fn regex_lite(p: &str) -> regex::Regex {
    regex::Regex::new(p).expect("valid pattern")
}

fn visit(dir: &std::path::Path, f: &mut dyn FnMut(&str)) {
    for entry in std::fs::read_dir(dir).expect("source folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            visit(&path, f);
        } else if path.extension().is_some_and(|e| e == "rs") {
            f(&std::fs::read_to_string(&path).expect("readable source"));
        }
    }
}

#[test]
fn the_metrics_table_matches_the_code() {
    let readme = std::fs::read_to_string(repo_root().join("docs/src/reference/metrics.md")).unwrap();
    let documented: BTreeSet<String> =
        regex_lite(r"(?m)^\| `(kart_[a-z0-9_]+)`").captures_iter(&readme).map(|c| c[1].to_string()).collect();
    let code = registered();
    assert!(code.len() >= 15, "expected the services' metrics, found {code:?}");
    let undocumented: Vec<_> = code.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&code).collect();
    assert!(undocumented.is_empty(), "metrics missing from the table: {undocumented:?}");
    assert!(stale.is_empty(), "the table documents metrics the code does not register: {stale:?}");
}
