//! The window maxima of a BM25 index's common terms, computed once when the index is built and
//! kept beside it in [`FILE`], so that no query scores a common term's postings for its bounds.
//!
//! [`max_score`](crate::max_score) bounds each term by its best score in every window and part of
//! a window. Computing them reads every posting of the term: a few hundred microseconds for a
//! term in 65,536 documents, tens of milliseconds for a common word of a 21M-passage corpus, and
//! the cache that keeps them cannot hold every common word of a large index. A term in at least
//! [`MIN_DOCS`] documents of a segment has its maxima stored here; a rarer one's are still
//! computed on first use (from at most that many postings) and cached.
//!
//! The file (little-endian): the magic `KARTWMX1`; the window and part sizes it was written for
//! and the number of terms (`u32` each, and a `u32` of padding); a table of terms, each its
//! segment ordinal, key length and window count (`u32` each), the offset of its data (`u64`) and
//! its key (the term's bytes, padded to 4); then each term's data, its windows (`u32` each) and
//! their bounds (the window's as an `f32` and a byte per part). It is written through a temporary
//! file, so an index has it whole or not at all; an index without it searches as before.

use crate::RetrieverError;
use crate::max_score::{PARTS, PackedBounds, WINDOW, WindowMaxima};
use memmap2::Mmap;
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use tantivy::query::Bm25Weight;
use tantivy::schema::Field;
use tantivy::{Searcher, Term};

/// The file in an index folder.
pub const FILE: &str = "window-maxima.bin";

/// Terms in at least this many documents of a segment have their maxima stored.
pub const MIN_DOCS: u32 = 65_536;

const MAGIC: &[u8; 8] = b"KARTWMX1";
const HEADER: usize = 8 + 4 * 4;
/// A table entry before its key.
const ENTRY: usize = 3 * 4 + 8;
/// Bytes of one window's bounds.
const BOUNDS: usize = 4 + PARTS;

/// What [`write`] stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Terms stored (a term counts once per segment holding it).
    pub terms: usize,
    /// Size of the file.
    pub bytes: u64,
}

/// Computes the window maxima of every term of `field` in at least `min_docs` documents of a
/// segment of `searcher`'s index (on all cores) and writes them to [`FILE`] in `dir`, the index's
/// folder.
pub fn write(
    dir: &Path,
    searcher: &Searcher,
    field: Field,
    min_docs: u32,
) -> Result<Written, RetrieverError> {
    let tantivy_error = |source| RetrieverError::Tantivy { path: dir.to_path_buf(), source };
    let mut terms: Vec<(u32, Vec<u8>, WindowMaxima)> = Vec::new();
    for (segment_ord, segment) in (0u32..).zip(searcher.segment_readers()) {
        let inverted_index = segment.inverted_index(field).map_err(tantivy_error)?;
        let fieldnorms = segment.get_fieldnorms_reader(field).map_err(tantivy_error)?;
        let mut common = Vec::new();
        let mut stream = inverted_index.terms().stream().map_err(|e| tantivy_error(e.into()))?;
        // The field is text: its terms are UTF-8.
        while let Some((key, info)) = stream.next() {
            if info.doc_freq >= min_docs {
                common.push(key.to_vec());
            }
        }
        let computed = common
            .into_par_iter()
            .filter_map(|key| String::from_utf8(key).ok())
            .map(|text| {
                let term = Term::from_field_text(field, &text);
                // The weight a query gives the term (see `bm25`): the maxima are of its scores.
                let weight = Bm25Weight::for_terms(searcher, std::slice::from_ref(&term))?;
                let maxima = WindowMaxima::read(&inverted_index, &term, &weight, &fieldnorms)?;
                Ok(maxima.map(|m| (segment_ord, text.into_bytes(), m)))
            })
            .collect::<tantivy::Result<Vec<_>>>()
            .map_err(tantivy_error)?;
        terms.extend(computed.into_iter().flatten());
    }
    let bytes = encode(&terms);
    let path = dir.join(FILE);
    let partial = dir.join(format!("{FILE}.partial"));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RetrieverError::Io { path, source }
    };
    let mut file = std::fs::File::create(&partial).map_err(io(&partial))?;
    file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(io(&partial))?;
    std::fs::rename(&partial, &path).map_err(io(&path))?;
    Ok(Written { terms: terms.len(), bytes: bytes.len() as u64 })
}

fn encode(terms: &[(u32, Vec<u8>, WindowMaxima)]) -> Vec<u8> {
    let padded = |n: usize| n.div_ceil(4) * 4;
    let table: usize = terms.iter().map(|(_, key, _)| ENTRY + padded(key.len())).sum();
    let mut out = Vec::with_capacity(HEADER + table);
    out.extend_from_slice(MAGIC);
    for n in [WINDOW, PARTS as u32, terms.len() as u32, 0] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    let mut offset = (HEADER + table) as u64;
    for (segment, key, maxima) in terms {
        let windows = maxima.windows().len();
        for n in [*segment, key.len() as u32, windows as u32] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(key);
        out.resize(out.len() + padded(key.len()) - key.len(), 0);
        offset += (windows * (4 + BOUNDS)) as u64;
    }
    for (_, _, maxima) in terms {
        for window in maxima.windows() {
            out.extend_from_slice(&window.to_le_bytes());
        }
        for bounds in maxima.bounds() {
            out.extend_from_slice(&bounds.window.to_le_bytes());
            out.extend_from_slice(&bounds.parts);
        }
    }
    out
}

/// The stored maxima of an index, memory-mapped.
pub struct StoredMaxima {
    map: Mmap,
    terms: TermTable,
}

/// By segment ordinal and term bytes: a term's window count and the offset of its data.
type TermTable = HashMap<(u32, Vec<u8>), (usize, usize)>;

impl StoredMaxima {
    /// The maxima stored in `dir`, `None` for an index built without them; a file that is not
    /// whole is refused, naming it.
    pub fn open(dir: &Path) -> Result<Option<StoredMaxima>, RetrieverError> {
        let path = dir.join(FILE);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(RetrieverError::Io { path, source }),
        };
        // SAFETY: a finished index folder is never written to again (the server may mount it
        // read-only); a file changed under the map could only give wrong bounds, never memory
        // outside it, since every range read is checked against the map's length.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|source| RetrieverError::Io { path: path.clone(), source })?;
        let terms = parse(&map).map_err(|reason| RetrieverError::Index { path, reason })?;
        Ok(Some(StoredMaxima { map, terms }))
    }

    /// Terms stored.
    pub fn len(&self) -> usize {
        self.terms.len()
    }

    /// Whether no term is stored (no term of the index is that common).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The maxima of `term` in segment `segment_ord`, if stored.
    pub fn get(&self, segment_ord: u32, term: &Term) -> Option<WindowMaxima> {
        let key = (segment_ord, term.serialized_value_bytes().to_vec());
        let &(windows, offset) = self.terms.get(&key)?;
        let data = &self.map[offset..offset + windows * (4 + BOUNDS)];
        let (ids, bounds) = data.split_at(windows * 4);
        let ids = ids.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        let bounds = bounds
            .chunks_exact(BOUNDS)
            .map(|b| PackedBounds {
                window: f32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
                parts: b[4..].try_into().expect("a byte per part"),
            })
            .collect();
        Some(WindowMaxima::from_parts(ids, bounds))
    }
}

/// The term table of a file, every range checked.
fn parse(bytes: &[u8]) -> Result<TermTable, String> {
    let u32_at = |at: usize| -> Result<u32, String> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| format!("ends at byte {} inside its table", bytes.len()))
    };
    if bytes.get(..8) != Some(MAGIC.as_slice()) {
        return Err(format!("{FILE} is not a window maxima file (no {MAGIC:?} at its start)"));
    }
    let (window, parts, count) = (u32_at(8)?, u32_at(12)?, u32_at(16)? as usize);
    if (window, parts as usize) != (WINDOW, PARTS) {
        return Err(format!(
            "{FILE} holds windows of {window} documents in {parts} parts, this kart reads {WINDOW} in {PARTS}: rebuild the index"
        ));
    }
    let mut terms = HashMap::with_capacity(count);
    let mut at = HEADER;
    for _ in 0..count {
        let (segment, key_len, windows) = (u32_at(at)?, u32_at(at + 4)? as usize, u32_at(at + 8)? as usize);
        let offset = bytes
            .get(at + 12..at + 20)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .ok_or("ends inside its table")?;
        let key = bytes.get(at + ENTRY..at + ENTRY + key_len).ok_or("ends inside its table")?;
        let end = windows.checked_mul(4 + BOUNDS).and_then(|n| n.checked_add(offset));
        if end.is_none_or(|end| end > bytes.len()) {
            return Err(format!("{FILE} is cut short: a term's data reaches past its {} bytes", bytes.len()));
        }
        terms.insert((segment, key.to_vec()), (windows, offset));
        at += ENTRY + key_len.div_ceil(4) * 4;
    }
    Ok(terms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalIndex;
    use crate::bm25::{self, Bm25Index};
    use crate::docstore::DocStore;

    /// 40,000 passages (three windows) of words drawn with Zipf-like frequencies.
    fn corpus(dir: &Path) -> std::path::PathBuf {
        let words: Vec<String> = (0..400).map(|i| format!("w{i}")).collect();
        let mut state = 7u64;
        let mut next = || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        let rows: Vec<String> = (0..40_000)
            .map(|i| {
                let text: Vec<&str> = (0..12).map(|_| words[(next() % 400) * (next() % 400) / 400].as_str()).collect();
                serde_json::json!({"id": format!("d{i}"), "contents": format!("\"t{i}\"\n{}", text.join(" "))}).to_string()
            })
            .collect();
        let path = dir.join("corpus.jsonl");
        std::fs::write(&path, rows.join("\n")).unwrap();
        path
    }

    #[test]
    fn stored_maxima_are_the_computed_ones_and_searches_rank_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("index");
        bm25::build(&corpus(dir.path()), &out, 200_000_000, |_, _, _| ()).unwrap();
        let stored = StoredMaxima::open(&out).unwrap().expect("written by the build");
        assert!(stored.is_empty(), "no term of 40,000 passages is in {MIN_DOCS} documents");

        let store = DocStore::open(&out).unwrap();
        let searcher = store.searcher();
        let field = store.fields().contents;
        let written = write(&out, searcher, field, 1000).unwrap();
        let stored = StoredMaxima::open(&out).unwrap().unwrap();
        assert!(written.terms > 20 && stored.len() == written.terms, "{written:?}");
        assert_eq!(std::fs::metadata(out.join(FILE)).unwrap().len(), written.bytes);
        let segment = &searcher.segment_readers()[0];
        let inverted_index = segment.inverted_index(field).unwrap();
        let fieldnorms = segment.get_fieldnorms_reader(field).unwrap();
        let (mut common, mut rare) = (0, 0);
        for word in (0..400).map(|i| format!("w{i}")) {
            let term = Term::from_field_text(field, &word);
            let docs = searcher.doc_freq(&term).unwrap();
            let weight = Bm25Weight::for_terms(searcher, std::slice::from_ref(&term)).unwrap();
            let computed = WindowMaxima::read(&inverted_index, &term, &weight, &fieldnorms).unwrap();
            match stored.get(0, &term) {
                Some(maxima) => {
                    assert!(docs >= 1000, "{word} in {docs} documents");
                    assert_eq!(Some(maxima), computed, "{word}");
                    common += 1;
                }
                None => {
                    assert!(docs < 1000, "{word} in {docs} documents is not stored");
                    rare += 1;
                }
            }
        }
        assert!(common > 20 && rare > 20, "{common} common, {rare} rare words");

        let queries: Vec<String> =
            (0..200).map(|i| format!("w{} w{} w{}", i % 7, i * 13 % 400, i * 31 % 400)).collect();
        let with = Bm25Index::open(&out).unwrap().search_batch(&queries, 5).unwrap();
        std::fs::remove_file(out.join(FILE)).unwrap();
        let without = Bm25Index::open(&out).unwrap().search_batch(&queries, 5).unwrap();
        assert_eq!(with, without);

        // A file cut short is refused, naming it.
        std::fs::write(out.join(FILE), b"").unwrap();
        let error = Bm25Index::open(&out).err().expect("an empty file is refused").to_string();
        assert!(error.contains(FILE), "{error}");
        write(&out, searcher, field, 1000).unwrap();
        let whole = std::fs::read(out.join(FILE)).unwrap();
        std::fs::write(out.join(FILE), &whole[..whole.len() - 1]).unwrap();
        let error = Bm25Index::open(&out).err().expect("a file cut short is refused").to_string();
        assert!(error.contains(FILE) && error.contains("cut short"), "{error}");
    }
}
