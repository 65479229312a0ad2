//! BM25 retrieval over a tantivy index.
//!
//! [`build`] streams a corpus into a [`DocStoreWriter`] whose `contents` field is indexed with the
//! [`english_analyzer`], and stores the window maxima of its common terms
//! ([`stored_maxima`](crate::stored_maxima)); [`Bm25Index`] ranks passages by tantivy's BM25
//! (k1 = 1.2, b = 0.75), finding the top k over tantivy's postings with window-max MaxScore
//! (`max_score`).
//!
//! Queries are user text (a model's `<search>` content) and are never parsed as a query language:
//! the query is run through the same analyzer as the passages and a passage scores the sum of the
//! BM25 scores of the distinct tokens it contains (a disjunction, as a `BooleanQuery` of `Should`
//! term queries). Quotes, colons, parentheses, `AND` or emoji are just text, and a query with no
//! indexable token (empty, punctuation, only stop words) finds nothing.
//!
//! ```no_run
//! # use kart_retriever::{bm25::{self, Bm25Index}, LocalIndex};
//! # use std::path::Path;
//! # fn main() -> Result<(), kart_retriever::RetrieverError> {
//! bm25::build(Path::new("wiki-18.jsonl.gz"), Path::new("index"), 1 << 30, |_, _, _| {})?;
//! let index = Bm25Index::open(Path::new("index"))?;
//! let hits = index.search("who wrote the odyssey", 3)?;
//! let batch = index.search_batch(&["capital of france".to_string()], 3)?;
//! # Ok(())
//! # }
//! ```

use crate::corpus::CorpusReader;
use crate::docstore::{DocStore, DocStoreWriter, FORMAT, Manifest, english_analyzer};
use crate::max_score::{self, WindowMaximaCache};
use crate::stored_maxima::{self, StoredMaxima};
use crate::{LocalIndex, RetrieverError};
use kart_core::agent::search_r1::RetrievalResult;
use kart_core::config::retriever::Method;
use rayon::prelude::*;
use std::path::Path;
use tantivy::query::Bm25Weight;
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{DocAddress, Term};

/// Passages between two calls of `build`'s progress callback.
const PROGRESS_EVERY: u64 = 10_000;

/// Builds a BM25 index of `corpus` (Search-R1 JSON lines, optionally gzipped) in `out`, analysing
/// passages on all cores within `memory_budget` bytes. `progress(bytes_read, total_bytes, docs)`
/// is called every few thousand passages and once at the end. Returns the number of passages.
pub fn build(
    corpus: &Path,
    out: &Path,
    memory_budget: usize,
    progress: impl Fn(u64, u64, u64),
) -> Result<u64, RetrieverError> {
    let mut reader = CorpusReader::open(corpus)?;
    let total = reader.total_bytes();
    let mut writer = DocStoreWriter::create(out, true, memory_budget)?;
    while let Some(passage) = reader.next() {
        let docs = writer.add(&passage?)? + 1;
        if docs % PROGRESS_EVERY == 0 {
            progress(reader.bytes_read(), total, docs);
        }
    }
    let manifest = Manifest {
        format: FORMAT,
        method: Method::Bm25,
        documents: 0,
        encoder: None,
        dim: None,
        embeddings_crc32: None,
        ann: None,
    };
    let searcher = writer.merge()?;
    let contents = writer.fields().contents;
    let written = stored_maxima::write(out, &searcher, contents, stored_maxima::MIN_DOCS)?;
    tracing::info!(
        terms = written.terms,
        bytes = written.bytes,
        "stored the window maxima of the common terms"
    );
    let docs = writer.finish(manifest)?;
    progress(reader.bytes_read(), total, docs);
    Ok(docs)
}

/// A BM25 index opened for search.
pub struct Bm25Index {
    store: DocStore,
    analyzer: TextAnalyzer,
    window_maxima: WindowMaximaCache,
}

impl Bm25Index {
    /// Opens an index folder built by [`build`].
    pub fn open(dir: &Path) -> Result<Self, RetrieverError> {
        let store = DocStore::open(dir)?;
        let method = store.manifest().method;
        if method != Method::Bm25 {
            let method = serde_json::json!(method);
            let reason = format!("the manifest's method is {method}, not \"bm25\"");
            return Err(RetrieverError::Index { path: dir.to_path_buf(), reason });
        }
        let stored = StoredMaxima::open(dir)?;
        match &stored {
            Some(stored) => tracing::info!(terms = stored.len(), "window maxima of the common terms loaded"),
            None => tracing::info!(
                "no stored window maxima (an index built before kart stored them): common terms are scored on first use; rebuilding the index stores them"
            ),
        }
        Ok(Bm25Index { store, analyzer: english_analyzer(), window_maxima: WindowMaximaCache::new(stored) })
    }

    /// The `topk` best passages for `query`, best first, with their BM25 scores.
    pub fn search(&self, query: &str, topk: usize) -> Result<Vec<RetrievalResult>, RetrieverError> {
        self.search_with(&mut self.analyzer.clone(), query, topk)
    }

    /// The stored documents.
    pub fn store(&self) -> &DocStore {
        &self.store
    }

    fn search_with(
        &self,
        analyzer: &mut TextAnalyzer,
        query: &str,
        topk: usize,
    ) -> Result<Vec<RetrievalResult>, RetrieverError> {
        let terms = self.terms(analyzer, query);
        if terms.is_empty() || topk == 0 {
            return Ok(Vec::new());
        }
        let tantivy_error = |source| RetrieverError::Tantivy { path: self.store.dir().to_path_buf(), source };
        let searcher = self.store.searcher();
        let weights = terms
            .into_iter()
            .map(|term| Ok((Bm25Weight::for_terms(searcher, std::slice::from_ref(&term))?, term)))
            .collect::<tantivy::Result<Vec<_>>>()
            .map_err(tantivy_error)?;
        let mut hits = Vec::new();
        let field = self.store.fields().contents;
        for (segment_ord, segment) in (0u32..).zip(searcher.segment_readers()) {
            let top = segment.inverted_index(field).and_then(|inverted_index| {
                let fieldnorms = segment.get_fieldnorms_reader(field)?;
                max_score::top_k(
                    segment_ord,
                    &inverted_index,
                    &fieldnorms,
                    &self.window_maxima,
                    &weights,
                    topk,
                )
            });
            let top = top.map_err(tantivy_error)?;
            hits.extend(top.into_iter().map(|hit| (hit.score, DocAddress::new(segment_ord, hit.doc))));
        }
        hits.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        hits.truncate(topk);
        hits.into_iter()
            .map(|(score, address)| {
                Ok(RetrievalResult { document: self.store.document_at(address)?, score: f64::from(score) })
            })
            .collect()
    }

    /// The distinct analysed tokens of a query, as terms of the `contents` field.
    fn terms(&self, analyzer: &mut TextAnalyzer, query: &str) -> Vec<Term> {
        let field = self.store.fields().contents;
        let mut terms = Vec::new();
        analyzer
            .token_stream(query)
            .process(&mut |token| terms.push(Term::from_field_text(field, &token.text)));
        terms.sort_unstable();
        terms.dedup();
        terms
    }
}

impl LocalIndex for Bm25Index {
    /// Runs the queries in parallel on rayon's pool, one query per task; a single query runs on
    /// the calling thread (handing it to the pool costs more than most searches).
    fn search_batch(
        &self,
        queries: &[String],
        topk: usize,
    ) -> Result<Vec<Vec<RetrievalResult>>, RetrieverError> {
        if let [query] = queries {
            return Ok(vec![self.search(query, topk)?]);
        }
        queries
            .par_iter()
            .map_init(|| self.analyzer.clone(), |analyzer, query| self.search_with(analyzer, query, topk))
            .collect()
    }

    fn num_docs(&self) -> u64 {
        self.store.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docstore::DocStoreWriter;
    use std::cell::Cell;
    use tantivy::collector::TopDocs;
    use tantivy::query::BooleanQuery;

    const PASSAGES: [(&str, &str); 8] = [
        (
            "Great Pyramid of Giza",
            "The oldest of the Seven Wonders, the pyramid was constructed for the pharaoh Khufu.",
        ),
        ("Mona Lisa", "A portrait painted by Leonardo da Vinci, displayed at the Louvre in Paris."),
        ("Photosynthesis", "Plants convert sunlight, water and carbon dioxide into glucose and oxygen."),
        ("Mount Everest", "Earth's highest mountain above sea level, on the border of Nepal and China."),
        ("Odyssey", "An ancient Greek epic poem attributed to Homer, following Odysseus's journey home."),
        ("Penicillin", "Alexander Fleming discovered the antibiotic in 1928 when mould killed bacteria."),
        ("Danube", "The river flows through ten countries, including Austria and Hungary, to the Black Sea."),
        ("Paris", "The capital of France, home to the Eiffel Tower and the Louvre museum."),
    ];

    /// A BM25 index of [`PASSAGES`] (ids `p0`… as strings; `p3` is given as a number).
    fn index() -> (tempfile::TempDir, Bm25Index) {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        let rows: Vec<String> = PASSAGES
            .iter()
            .enumerate()
            .map(|(i, (title, text))| match i {
                3 => serde_json::json!({"id": 3, "title": title, "text": text}).to_string(),
                _ => serde_json::json!({"id": format!("p{i}"), "contents": kart_core::agent::search_r1::contents(title, text)})
                    .to_string(),
            })
            .collect();
        std::fs::write(&corpus, rows.join("\n")).unwrap();
        let out = dir.path().join("index");
        let calls = Cell::new(0);
        let docs = build(&corpus, &out, 50_000_000, |read, total, docs| {
            calls.set(calls.get() + 1);
            assert_eq!((read, docs), (total, 8));
        })
        .unwrap();
        assert_eq!((docs, calls.get()), (8, 1));
        (dir, Bm25Index::open(&out).unwrap())
    }

    fn ids(hits: &[RetrievalResult]) -> Vec<&str> {
        hits.iter().map(|h| h.document.id.as_str()).collect()
    }

    #[test]
    fn finds_the_passage_of_paraphrased_queries() {
        let (_dir, index) = index();
        assert_eq!(index.num_docs(), 8);
        let cases = [
            ("When were the pyramids at Giza built?", "p0"),
            ("who paints portraits displayed in the Louvre", "p1"),
            ("how do plants turn sunlight into sugar", "p2"),
            ("highest mountains on Earth", "3"),
            ("Greek epic poems by Homer", "p4"),
            ("discovery of antibiotics killing bacteria", "p5"),
            ("which rivers flow to the Black Sea", "p6"),
        ];
        for (query, expected) in cases {
            let hits = index.search(query, 3).unwrap();
            assert_eq!(hits.first().map(|h| h.document.id.as_str()), Some(expected), "{query}");
        }
        let top = &index.search("Mount Everest", 1).unwrap()[0];
        assert_eq!(top.document.title.as_deref(), Some("Mount Everest"));
        assert!(top.document.contents.starts_with("\"Mount Everest\"\nEarth's highest"));
    }

    #[test]
    fn respects_topk_and_orders_by_score() {
        let (_dir, index) = index();
        // "Louvre" is in p1 and p7, "the" is a stop word.
        let hits = index.search("the Louvre Paris", 1).unwrap();
        assert_eq!(ids(&hits), ["p7"]);
        let hits = index.search("the Louvre Paris", 10).unwrap();
        assert_eq!(ids(&hits), ["p7", "p1"]);
        assert!(hits[0].score > hits[1].score && hits[1].score > 0.0);
        assert!(index.search("Louvre", 0).unwrap().is_empty());
    }

    #[test]
    fn equal_scores_rank_in_corpus_order() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        // Every third passage is the same text: its documents tie on any query of its words.
        let rows: Vec<String> = (0..3000)
            .map(|i| {
                let contents = match i % 3 {
                    0 => "\"Twin\"\nA twin passage about lanterns.".to_string(),
                    _ => format!("\"Other {i}\"\nPassage number {i} about harbours."),
                };
                serde_json::json!({"id": format!("d{i}"), "contents": contents}).to_string()
            })
            .collect();
        std::fs::write(&corpus, rows.join("\n")).unwrap();
        let out = dir.path().join("index");
        build(&corpus, &out, 200_000_000, |_, _, _| ()).unwrap();
        let hits = Bm25Index::open(&out).unwrap().search("twin lanterns", 1000).unwrap();
        let twins: Vec<String> = (0..3000).step_by(3).map(|i| format!("d{i}")).collect();
        assert_eq!(ids(&hits), twins);
        assert!(hits.windows(2).all(|w| w[0].score == w[1].score));
    }

    #[test]
    fn weird_queries_never_error() {
        let (_dir, index) = index();
        for query in [
            "",
            "   ",
            "\"",
            ":",
            "(",
            ")",
            "AND",
            "OR NOT",
            "\"Paris",
            "title:(Paris",
            "🏔️🎨",
            "+-*/\\^~",
            "the of and",
        ] {
            let hits = index.search(query, 3).unwrap_or_else(|e| panic!("{query:?}: {e}"));
            assert!(hits.is_empty() || query.contains("Paris"), "{query:?}: {:?}", ids(&hits));
        }
        assert_eq!(ids(&index.search("title:(\"Paris\" AND 🗼)", 1).unwrap()), ["p7"]);
        assert_eq!(ids(&index.search("ÉVEREST? mountain!!", 1).unwrap()), ["3"]);
    }

    #[test]
    fn batch_equals_individual_searches() {
        let (_dir, index) = index();
        let queries: Vec<String> =
            ["Louvre", "", "greek poem", "the", "river countries", "Fleming 1928"].map(String::from).to_vec();
        let batch = index.search_batch(&queries, 2).unwrap();
        let single: Vec<_> = queries.iter().map(|q| index.search(q, 2).unwrap()).collect();
        assert_eq!(batch, single);
        assert!(index.search_batch(&[], 3).unwrap().is_empty());
    }

    /// A linear congruential generator: deterministic test data without a dependency.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }

        /// Word `w{i}`, smaller `i` more likely; one word in 20 is a rare `r{i}` of 3000.
        fn word(&mut self) -> String {
            if self.below(20) == 0 {
                return format!("r{}", self.below(3000));
            }
            let rank = self.below(300) + 1;
            format!("w{}", self.below(rank))
        }
    }

    #[test]
    fn ranks_as_tantivys_boolean_query() {
        // 50,000 passages of 5 to 40 words from a skewed vocabulary: common words that window
        // bounds cannot set aside, rare words that leave most windows of documents empty, and
        // many windows.
        let dir = tempfile::tempdir().unwrap();
        let mut random = Lcg(7);
        let rows: Vec<String> = (0..50_000)
            .map(|i| {
                let text: Vec<String> = (0..5 + random.below(36)).map(|_| random.word()).collect();
                serde_json::json!({"id": i.to_string(), "contents": text.join(" ")}).to_string()
            })
            .collect();
        let corpus = dir.path().join("corpus.jsonl");
        std::fs::write(&corpus, rows.join("\n")).unwrap();
        build(&corpus, &dir.path().join("index"), 50_000_000, |_, _, _| {}).unwrap();
        let index = Bm25Index::open(&dir.path().join("index")).unwrap();
        let searcher = index.store().searcher();
        for _ in 0..300 {
            let query: Vec<String> = (0..1 + random.below(6)).map(|_| random.word()).collect();
            let query = query.join(" ");
            let k = 1 + random.below(10) as usize;
            let terms = index.terms(&mut english_analyzer(), &query);
            // tantivy's ranking, deep enough to hold every document tied with the k-th.
            let expected = searcher
                .search(
                    &BooleanQuery::new_multiterms_query(terms),
                    &TopDocs::with_limit(k + 100).order_by_score(),
                )
                .unwrap();
            let got = index.search(&query, k).unwrap();
            assert_eq!(got.len(), expected.len().min(k), "{query}");
            for (hit, (score, _)) in got.iter().zip(&expected) {
                assert!((hit.score - f64::from(*score)).abs() < 1e-4, "{query}: {} vs {score}", hit.score);
                // Documents may only differ between equal scores (summed in another order): the
                // document found has the same score in tantivy's ranking.
                let same = expected.iter().any(|(score, address)| {
                    let id = index.store().document_at(*address).unwrap().id;
                    id == hit.document.id && (hit.score - f64::from(*score)).abs() < 1e-4
                });
                assert!(
                    same,
                    "{query}: {} is not in tantivy's ranking with score {}",
                    hit.document.id, hit.score
                );
            }
        }
        assert!(
            crate::max_score::scratch_kept_clean(),
            "the searches leave their scratch for the next, zero"
        );
    }

    #[test]
    fn refuses_indexes_of_other_methods_and_unfinished_builds() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = Manifest {
            format: FORMAT,
            method: Method::Dense,
            documents: 0,
            encoder: None,
            dim: Some(4),
            embeddings_crc32: None,
            ann: None,
        };
        DocStoreWriter::create(dir.path(), false, 50_000_000).unwrap().finish(manifest).unwrap();
        let err = Bm25Index::open(dir.path()).err().unwrap().to_string();
        assert_eq!(
            err,
            format!("{}: the manifest's method is \"dense\", not \"bm25\"", dir.path().display())
        );
        let empty = tempfile::tempdir().unwrap();
        let err = Bm25Index::open(empty.path()).err().unwrap().to_string();
        assert!(err.contains("no kart-index.json"), "{err}");
    }
}
