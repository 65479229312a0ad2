//! ASearcher's local pages: `/access` answered from a JSON-lines file of web pages keyed by their
//! `url` (its `wiki_webpages.jsonl`), as its local retrieval server does, instead of from the web.
//!
//! Every page is held in memory, as upstream holds them. A URL is looked up exactly, after
//! upstream's one rewrite (`index.php/` to `index.php?title=`); a later line with the same `url`
//! replaces an earlier one.

use crate::RetrieverError;
use crate::corpus::open_lines;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// A page: the file's JSON object (`url`, `contents`, …).
pub type Page = Map<String, Value>;

/// Pages by URL.
pub struct LocalPages {
    pages: HashMap<String, Page>,
}

impl LocalPages {
    /// Reads the pages file at `path` (plain or gzipped); a line that is not a JSON object with a
    /// string `url` is an error naming the line.
    pub fn load(path: &Path) -> Result<Self, RetrieverError> {
        let mut pages = HashMap::new();
        for (i, line) in open_lines(path)?.reader.split(b'\n').enumerate() {
            let line = line.map_err(|source| RetrieverError::Io { path: path.to_path_buf(), source })?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let bad = |reason: String| RetrieverError::Corpus {
                path: path.to_path_buf(),
                line: i as u64 + 1,
                reason,
            };
            let page: Page = match serde_json::from_slice(&line) {
                Ok(Value::Object(page)) => page,
                Ok(other) => {
                    return Err(bad(format!(
                        "expected a JSON object, found {}",
                        kart_core::json::kind(&other)
                    )));
                }
                Err(e) => return Err(bad(format!("invalid JSON: {e}"))),
            };
            let Some(url) = page.get("url").and_then(Value::as_str) else {
                return Err(bad("missing string field \"url\"".into()));
            };
            pages.insert(url.to_owned(), page);
        }
        Ok(LocalPages { pages })
    }

    /// The page of `url`, if the file has it.
    pub fn get(&self, url: &str) -> Option<&Page> {
        self.pages.get(url.replace("index.php/", "index.php?title=").as_str())
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_found_by_url_after_upstream_s_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages.jsonl");
        let rows = [
            r#"{"url": "https://en.wikipedia.org/w/index.php?title=Nile", "contents": "old"}"#,
            "",
            r#"{"url": "https://en.wikipedia.org/w/index.php?title=Nile", "contents": "The Nile.", "title": "Nile"}"#,
        ];
        std::fs::write(&path, rows.join("\n")).unwrap();
        let pages = LocalPages::load(&path).unwrap();
        assert_eq!(pages.len(), 1);
        let nile = pages.get("https://en.wikipedia.org/w/index.php/Nile").unwrap();
        assert_eq!((&nile["contents"], &nile["title"]), (&Value::from("The Nile."), &Value::from("Nile")));
        assert!(pages.get("https://en.wikipedia.org/wiki/Nile").is_none(), "no other rewriting, as upstream");

        for (line, reason) in [
            (r#"{"contents": "x"}"#, "pages.jsonl:1: missing string field \"url\""),
            ("[1]", "pages.jsonl:1: expected a JSON object, found an array"),
            ("{", "pages.jsonl:1: invalid JSON"),
        ] {
            std::fs::write(&path, line).unwrap();
            let err = LocalPages::load(&path).err().unwrap().to_string();
            assert!(err.contains(reason), "{line}: {err}");
        }
    }
}
