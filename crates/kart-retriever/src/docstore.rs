//! The documents stored beside every local index.
//!
//! A local index folder is a tantivy index holding each passage's corpus id, its Search-R1
//! `contents` and its ordinal (its position in the corpus, from 0), plus a [`Manifest`] at
//! `kart-index.json` saying how the index was built. BM25 also indexes `contents` for full-text
//! search with an English analyzer ([`english_analyzer`]); a dense index stores the documents only
//! and finds them by ordinal, the row of their embedding.
//!
//! The manifest is written last, once every document is committed and merged, so a folder without
//! one is an index whose build did not finish, and [`DocStore::open`] refuses it. Opening also
//! checks every file of the index against the checksum tantivy wrote in its footer, so a damaged
//! file is an error naming it, never a panic in a search.
//!
//! The index is sorted by ordinal: however the indexing threads shared the documents out, the
//! merged segment holds them in corpus order, so equal scores rank in corpus order and the same
//! corpus gives the same index and the same results on every build. Sorting writes each segment's
//! documents twice (unsorted to `.store.temp`, then in order); the writer deletes the finished
//! segments' temporary stores as it goes, which would otherwise double the disk a large build
//! needs until its end (26 GB more for wiki-18).
//!
//! ```text
//! DIR/kart-index.json    {"format": 1, "method": "bm25", "documents": 21015324, ...}
//! DIR/meta.json, *.idx…  the tantivy index: id (STRING), contents (TEXT or stored), ordinal (u64),
//!                        fields (stored JSON text of the row's other fields; absent in older indexes)
//! ```

use crate::RetrieverError;
use crate::corpus::Passage;
use crate::read_only_dir::ReadOnlyDirectory;
use kart_core::agent::search_r1::Document;
use kart_core::agent::search_r1::document;
use kart_core::config::retriever::{AnnConfig, EncoderConfig, Method};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::thread::available_parallelism;
use tantivy::directory::error::OpenReadError;
use tantivy::indexer::{IndexWriterOptions, NoMergePolicy};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
    TokenizerManager,
};
use tantivy::{
    DocAddress, DocSet, Index, IndexReader, IndexSettings, IndexSortByField, IndexWriter, Order,
    ReloadPolicy, Searcher, TERMINATED, TantivyDocument, Term,
};

/// The manifest's file name inside an index folder.
pub const MANIFEST: &str = "kart-index.json";

/// The index format this kart writes and reads.
pub const FORMAT: u32 = 1;

/// Name under which [`english_analyzer`] is registered with the index.
pub const ANALYZER: &str = "kart_en";

/// Tokens longer than this many bytes (base64 blobs, URLs run together) are dropped.
const MAX_TOKEN_BYTES: usize = 40;

/// Bytes of passages compressed together in the document store. A search reads its top k passages
/// at random, decompressing one block each: tantivy's default (16 KiB) spends more time there
/// than in ranking; 4 KiB (about 6 Search-R1 passages) costs a few percent of compression.
const DOCSTORE_BLOCK_BYTES: usize = 4096;

/// The field holding a document's position in the corpus; the index is sorted by it.
const ORDINAL: &str = "ordinal";
/// The stored field holding a row's other fields.
const FIELDS: &str = "fields";

/// tantivy's bounds on one indexing thread's memory arena.
const MIN_THREAD_BUDGET: usize = 15_000_000;
const MAX_THREAD_BUDGET: usize = u32::MAX as usize - 1_000_000;

/// How an index folder was built: written last, so its presence marks a finished build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Index format ([`FORMAT`]).
    pub format: u32,
    /// The retrieval method the index serves.
    pub method: Method,
    /// Documents indexed.
    pub documents: u64,
    /// The encoder that embedded the passages (dense indexes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<EncoderConfig>,
    /// Embedding dimension (dense indexes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    /// CRC-32 of the embeddings file (dense indexes; absent in indexes built before kart wrote it,
    /// whose embeddings are then read unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings_crc32: Option<u32>,
    /// The approximate graph over the embeddings and how it was built (dense indexes built with
    /// `--ann`; absent: searched by an exact scan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ann: Option<AnnConfig>,
}

/// The fields of the document index.
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    /// The corpus id (raw string, stored).
    pub id: Field,
    /// Search-R1's `contents`: stored, and indexed with [`ANALYZER`] in a BM25 index.
    pub contents: Field,
    /// Position in the corpus, from 0 (indexed, fast, stored).
    pub ordinal: Field,
    /// The corpus row's other fields as JSON text, stored (`None` in indexes built before it).
    pub fields: Option<Field>,
}

impl Manifest {
    /// Writes the manifest into the index folder `dir`, replacing the one there at once.
    pub fn write(&self, dir: &Path) -> Result<(), RetrieverError> {
        write_manifest(dir, self)
    }

    /// Reads the manifest of the index folder `dir`, refusing a folder without one (not an index,
    /// or one whose build did not finish) or of another format.
    pub fn read(dir: &Path) -> Result<Self, RetrieverError> {
        let path = dir.join(MANIFEST);
        let json = match std::fs::read(&path) {
            Ok(json) => json,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RetrieverError::Index {
                    path: dir.to_path_buf(),
                    reason: format!(
                        "no {MANIFEST}: not a kart index, or its build did not finish (build it again \
                         with `kart retriever index`)"
                    ),
                });
            }
            Err(source) => return Err(RetrieverError::Io { path, source }),
        };
        let manifest: Manifest = serde_json::from_slice(&json)
            .map_err(|e| RetrieverError::Index { path: path.clone(), reason: e.to_string() })?;
        if manifest.format != FORMAT {
            return Err(RetrieverError::Index {
                path,
                reason: format!(
                    "index format {} cannot be read by this kart (format {FORMAT})",
                    manifest.format
                ),
            });
        }
        Ok(manifest)
    }
}

impl Fields {
    fn of(schema: &Schema) -> tantivy::Result<Self> {
        Ok(Fields {
            id: schema.get_field("id")?,
            contents: schema.get_field("contents")?,
            ordinal: schema.get_field(ORDINAL)?,
            fields: schema.get_field(FIELDS).ok(),
        })
    }
}

/// The English analyzer of BM25 indexes and queries: splits on non-alphanumeric characters, drops
/// tokens over 40 bytes, lowercases, removes English stop words (Lucene's list) and stems
/// (Snowball English).
pub fn english_analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(MAX_TOKEN_BYTES))
        .filter(LowerCaser)
        .filter(StopWordFilter::new(Language::English).expect("tantivy ships English stop words"))
        .filter(Stemmer::new(Language::English))
        .build()
}

fn schema(index_text: bool) -> Schema {
    let mut builder = Schema::builder();
    builder.add_text_field("id", STRING | STORED);
    let contents = if index_text {
        // BM25 needs term frequencies but no positions: no phrase queries are ever run.
        let indexing = TextFieldIndexing::default()
            .set_tokenizer(ANALYZER)
            .set_index_option(IndexRecordOption::WithFreqs);
        TextOptions::default().set_indexing_options(indexing).set_stored()
    } else {
        STORED.into()
    };
    builder.add_text_field("contents", contents);
    builder.add_u64_field(ORDINAL, INDEXED | FAST | STORED);
    builder.add_text_field(FIELDS, STORED);
    builder.build()
}

fn settings() -> IndexSettings {
    IndexSettings {
        docstore_blocksize: DOCSTORE_BLOCK_BYTES,
        sort_by_field: Some(IndexSortByField { field: ORDINAL.into(), order: Order::Asc }),
        ..IndexSettings::default()
    }
}

fn tokenizers() -> TokenizerManager {
    let manager = TokenizerManager::default();
    manager.register(ANALYZER, english_analyzer());
    manager
}

/// Documents added between two deletions of the finished segments' temporary stores.
const COLLECT_EVERY: u64 = 1 << 18;

/// Writes the documents of a new index folder, in corpus order.
pub struct DocStoreWriter {
    dir: PathBuf,
    writer: IndexWriter,
    fields: Fields,
    documents: u64,
    collect_every: u64,
}

impl DocStoreWriter {
    /// Creates the index in `dir` (created if missing; it must not hold an index already), with
    /// `contents` full-text indexed when `index_text`. Documents are analysed and written by one
    /// tantivy thread per core, sharing `memory_budget_bytes`; each thread flushes a segment when
    /// its share is full.
    pub fn create(dir: &Path, index_text: bool, memory_budget_bytes: usize) -> Result<Self, RetrieverError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| RetrieverError::Io { path: dir.to_path_buf(), source })?;
        let tantivy_error = |source| RetrieverError::Tantivy { path: dir.to_path_buf(), source };
        let index = Index::builder()
            .schema(schema(index_text))
            .tokenizers(tokenizers())
            .settings(settings())
            .create_in_dir(dir)
            .map_err(|e| match e {
                tantivy::TantivyError::IndexAlreadyExists => RetrieverError::Index {
                    path: dir.to_path_buf(),
                    reason: "already holds an index; remove it or choose another folder".into(),
                },
                e => tantivy_error(e),
            })?;
        let cores = available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(memory_budget_bytes / MIN_THREAD_BUDGET).max(1);
        let options = IndexWriterOptions::builder()
            .num_worker_threads(threads)
            .memory_budget_per_thread((memory_budget_bytes / threads).min(MAX_THREAD_BUDGET))
            .build();
        let writer = index.writer_with_options(options).map_err(tantivy_error)?;
        // Segments are merged once, all together, by `finish`.
        writer.set_merge_policy(Box::new(NoMergePolicy));
        let fields = Fields::of(&index.schema()).map_err(tantivy_error)?;
        Ok(DocStoreWriter {
            dir: dir.to_path_buf(),
            writer,
            fields,
            documents: 0,
            collect_every: COLLECT_EVERY,
        })
    }

    /// Queues a passage for writing and returns its ordinal: 0, 1, 2, … in the order of the calls.
    pub fn add(&mut self, passage: &Passage) -> Result<u64, RetrieverError> {
        let ordinal = self.documents;
        let mut doc = TantivyDocument::new();
        doc.add_text(self.fields.id, &passage.id);
        doc.add_text(self.fields.contents, &passage.contents);
        doc.add_u64(self.fields.ordinal, ordinal);
        if let Some(field) = self.fields.fields.filter(|_| !passage.fields.is_empty()) {
            doc.add_text(field, serde_json::Value::Object(passage.fields.clone()).to_string());
        }
        self.writer.add_document(doc).map_err(|source| self.tantivy_error(source))?;
        self.documents += 1;
        if self.documents.is_multiple_of(self.collect_every) {
            // Files of the segments being written are tracked, and kept.
            self.writer.garbage_collect_files().wait().map_err(|source| self.tantivy_error(source))?;
        }
        Ok(ordinal)
    }

    /// Commits every document and merges the segments into one (the fastest to search). Returns a
    /// searcher over them, for what is written beside the index before [`Self::finish`] seals it.
    pub fn merge(&mut self) -> Result<Searcher, RetrieverError> {
        self.commit_merged()?;
        let reader: IndexReader = self
            .writer
            .index()
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|source| self.tantivy_error(source))?;
        Ok(reader.searcher())
    }

    /// The schema's fields.
    pub fn fields(&self) -> Fields {
        self.fields
    }

    /// Merges (see [`Self::merge`]; nothing to do if done), then writes `manifest` with the number
    /// of documents written. Returns that number.
    pub fn finish(mut self, manifest: Manifest) -> Result<u64, RetrieverError> {
        self.commit_merged()?;
        let DocStoreWriter { dir, writer, documents, .. } = self;
        writer
            .wait_merging_threads()
            .map_err(|source| RetrieverError::Tantivy { path: dir.clone(), source })?;
        write_manifest(&dir, &Manifest { documents, ..manifest })?;
        Ok(documents)
    }

    /// Commits every document and merges the segments into one.
    fn commit_merged(&mut self) -> Result<(), RetrieverError> {
        self.writer.commit().map_err(|source| self.tantivy_error(source))?;
        let segments =
            self.writer.index().searchable_segment_ids().map_err(|source| self.tantivy_error(source))?;
        if segments.len() > 1 {
            self.writer.merge(&segments).wait().map_err(|source| self.tantivy_error(source))?;
        }
        Ok(())
    }

    fn tantivy_error(&self, source: tantivy::TantivyError) -> RetrieverError {
        RetrieverError::Tantivy { path: self.dir.clone(), source }
    }
}

/// Writes the manifest through a temporary file, so it is either absent or complete.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), RetrieverError> {
    let path = dir.join(MANIFEST);
    let partial = dir.join(format!("{MANIFEST}.partial"));
    let json = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
    std::fs::write(&partial, json).map_err(|source| RetrieverError::Io { path: partial.clone(), source })?;
    std::fs::rename(&partial, &path).map_err(|source| RetrieverError::Io { path, source })
}

/// The documents of a finished index folder, read-only.
pub struct DocStore {
    dir: PathBuf,
    manifest: Manifest,
    index: Index,
    searcher: Searcher,
    fields: Fields,
}

impl DocStore {
    /// Opens the index in `dir` after reading its manifest ([`Manifest::read`]) and checking the
    /// checksum of every file of the index (which reads them all once).
    pub fn open(dir: &Path) -> Result<Self, RetrieverError> {
        let manifest = Manifest::read(dir)?;
        let index_error = |reason: String| RetrieverError::Index { path: dir.to_path_buf(), reason };
        let tantivy_error = |source| RetrieverError::Tantivy { path: dir.to_path_buf(), source };
        // Read-only: a serving retriever's index volume is mounted so (tantivy's own directory
        // would create its lock file there).
        let directory = ReadOnlyDirectory::open(dir).map_err(tantivy_error)?;
        let index = Index::open(directory).map_err(tantivy_error)?;
        verify_checksums(dir, &index)?;
        index.tokenizers().register(ANALYZER, english_analyzer());
        let fields = Fields::of(&index.schema()).map_err(tantivy_error)?;
        let reader =
            index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(tantivy_error)?;
        let searcher = reader.searcher();
        if searcher.num_docs() != manifest.documents {
            return Err(index_error(format!(
                "{MANIFEST} counts {} documents but the index holds {}",
                manifest.documents,
                searcher.num_docs()
            )));
        }
        Ok(DocStore { dir: dir.to_path_buf(), manifest, index, searcher, fields })
    }

    /// The document of a corpus ordinal.
    pub fn get(&self, ordinal: u64) -> Result<Document, RetrieverError> {
        self.document_at(self.address(ordinal)?)
    }

    /// The documents of corpus ordinals, in the order given.
    pub fn get_many(&self, ordinals: &[u64]) -> Result<Vec<Document>, RetrieverError> {
        ordinals.iter().map(|&ordinal| self.get(ordinal)).collect()
    }

    /// The stored document at a tantivy address (as returned by a search).
    pub fn document_at(&self, address: DocAddress) -> Result<Document, RetrieverError> {
        let doc: TantivyDocument = self.searcher.doc(address).map_err(|source| self.tantivy_error(source))?;
        let text = |field: Field, name: &str| {
            doc.get_first(field).and_then(|v| v.as_str().map(str::to_string)).ok_or_else(|| {
                RetrieverError::Index {
                    path: self.dir.clone(),
                    reason: format!("document {address:?} has no stored {name}"),
                }
            })
        };
        let mut found = document(text(self.fields.id, "id")?, text(self.fields.contents, "contents")?);
        if let Some(json) = self.fields.fields.and_then(|f| doc.get_first(f)).and_then(|v| v.as_str()) {
            found.fields = serde_json::from_str(json).map_err(|e| RetrieverError::Index {
                path: self.dir.clone(),
                reason: format!("document {address:?}: stored fields are not a JSON object: {e}"),
            })?;
        }
        Ok(found)
    }

    /// Where the document of `ordinal` lives: a term lookup of the ordinal in each segment.
    fn address(&self, ordinal: u64) -> Result<DocAddress, RetrieverError> {
        let term = Term::from_field_u64(self.fields.ordinal, ordinal);
        for (segment_ord, segment) in self.searcher.segment_readers().iter().enumerate() {
            let postings = segment
                .inverted_index(self.fields.ordinal)
                .map_err(|source| self.tantivy_error(source))?
                .read_postings(&term, IndexRecordOption::Basic)
                .map_err(|source| RetrieverError::Io { path: self.dir.clone(), source })?;
            if let Some(doc) = postings.map(|p| p.doc()).filter(|&doc| doc != TERMINATED) {
                return Ok(DocAddress::new(segment_ord as u32, doc));
            }
        }
        Err(RetrieverError::Index {
            path: self.dir.clone(),
            reason: format!("no document with ordinal {ordinal} (the index holds {})", self.len()),
        })
    }

    /// Number of documents.
    pub fn len(&self) -> u64 {
        self.manifest.documents
    }

    /// Whether the index holds no document.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How the index was built.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The index folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tantivy index (with [`ANALYZER`] registered).
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// A searcher over the committed documents; cheap to clone and shareable across threads.
    pub fn searcher(&self) -> &Searcher {
        &self.searcher
    }

    /// The schema's fields.
    pub fn fields(&self) -> Fields {
        self.fields
    }

    fn tantivy_error(&self, source: tantivy::TantivyError) -> RetrieverError {
        RetrieverError::Tantivy { path: self.dir.clone(), source }
    }
}

/// Refuses an index one of whose files does not match the checksum in its footer, or has no
/// readable footer, naming the file.
fn verify_checksums(dir: &Path, index: &Index) -> Result<(), RetrieverError> {
    const REBUILD: &str = "rebuild the index with `kart retriever index`";
    let damaged = index.validate_checksum().map_err(|error| match error {
        tantivy::TantivyError::OpenReadError(OpenReadError::IoError { io_error, filepath }) => {
            let reason = format!("damaged or unreadable: its footer cannot be read ({io_error}); {REBUILD}");
            RetrieverError::Index { path: dir.join(filepath), reason }
        }
        tantivy::TantivyError::OpenReadError(OpenReadError::FileDoesNotExist(path)) => {
            RetrieverError::Index { path: dir.join(path), reason: format!("missing; {REBUILD}") }
        }
        source => RetrieverError::Tantivy { path: dir.to_path_buf(), source },
    })?;
    let mut damaged: Vec<PathBuf> = damaged.into_iter().collect();
    damaged.sort();
    let Some(first) = damaged.first() else { return Ok(()) };
    let others = match damaged.len() {
        1 => String::new(),
        n => format!(" ({} other files too: {})", n - 1, names(&damaged[1..])),
    };
    Err(RetrieverError::Index {
        path: dir.join(first),
        reason: format!("damaged: its contents do not match the checksum written with it{others}; {REBUILD}"),
    })
}

fn names(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn manifest(method: Method) -> Manifest {
        Manifest {
            format: FORMAT,
            method,
            documents: 0,
            encoder: None,
            dim: None,
            embeddings_crc32: None,
            ann: None,
        }
    }

    fn passages(n: usize) -> Vec<Passage> {
        (0..n)
            .map(|i| Passage {
                id: format!("doc-{i}"),
                contents: format!("\"Title {i}\"\nText of passage {i}."),
                fields: serde_json::json!({"url": format!("https://wiki/{i}")}).as_object().unwrap().clone(),
            })
            .collect()
    }

    #[test]
    fn round_trips_documents_by_ordinal() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = passages(500);
        let mut writer = DocStoreWriter::create(dir.path(), false, 50_000_000).unwrap();
        for (i, passage) in corpus.iter().enumerate() {
            assert_eq!(writer.add(passage).unwrap(), i as u64);
        }
        let dense =
            Manifest { encoder: Some(EncoderConfig::default()), dim: Some(384), ..manifest(Method::Dense) };
        assert_eq!(writer.finish(dense.clone()).unwrap(), 500);

        let store = DocStore::open(dir.path()).unwrap();
        assert_eq!((store.len(), store.is_empty()), (500, false));
        assert_eq!(store.manifest(), &Manifest { documents: 500, ..dense });
        let got = store.get(137).unwrap();
        let expected = document("doc-137".into(), corpus[137].contents.clone());
        assert_eq!(got, Document { fields: corpus[137].fields.clone(), ..expected });
        assert_eq!(serde_json::to_value(&got).unwrap()["url"], "https://wiki/137", "the row's own fields");
        assert_eq!(got.title.as_deref(), Some("Title 137"));
        let many = store.get_many(&[499, 0, 250]).unwrap();
        assert_eq!(many.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["doc-499", "doc-0", "doc-250"]);
        let err = store.get(500).unwrap_err().to_string();
        assert!(err.contains("no document with ordinal 500 (the index holds 500)"), "{err}");
    }

    #[test]
    fn documents_are_stored_in_corpus_order_whatever_the_indexing_threads() {
        let dir = tempfile::tempdir().unwrap();
        // Enough budget for several indexing threads, which take documents as they come.
        let mut writer = DocStoreWriter::create(dir.path(), true, 4 * MIN_THREAD_BUDGET).unwrap();
        for passage in &passages(3000) {
            writer.add(passage).unwrap();
        }
        writer.finish(manifest(Method::Bm25)).unwrap();
        let store = DocStore::open(dir.path()).unwrap();
        assert_eq!(store.searcher().segment_readers().len(), 1);
        for doc in 0..3000 {
            let id = store.document_at(DocAddress::new(0, doc)).unwrap().id;
            assert_eq!(id, format!("doc-{doc}"));
        }
    }

    #[test]
    fn the_finished_segments_temporary_stores_are_deleted_as_the_build_goes() {
        let dir = tempfile::tempdir().unwrap();
        // One indexing thread, whose budget fills every few thousand of these passages.
        let mut writer = DocStoreWriter::create(dir.path(), true, MIN_THREAD_BUDGET).unwrap();
        writer.collect_every = 1000;
        let mut words = 0u64;
        for i in 0..20_000u64 {
            let text: Vec<String> = (0..60)
                .map(|_| {
                    words = words.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    format!("w{}", (words >> 40) % 50_000)
                })
                .collect();
            let passage =
                Passage { id: format!("doc-{i}"), contents: text.join(" "), fields: Default::default() };
            writer.add(&passage).unwrap();
        }
        let count = |suffix: &str| {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(suffix))
                .count()
        };
        let (finished, temporary) = (count(".store"), count(".store.temp"));
        // At most the segment being written and one finished since the last collection.
        assert!(
            finished >= 4 && temporary <= 2,
            "{finished} segments finished, {temporary} temporary stores"
        );
        assert_eq!(writer.finish(manifest(Method::Bm25)).unwrap(), 20_000);
        assert_eq!((count(".store"), count(".store.temp")), (1, 0));
        assert_eq!(DocStore::open(dir.path()).unwrap().len(), 20_000);
    }

    /// Opening takes no lock and writes nothing: where tantivy's lock file cannot be made (here a
    /// folder of its name; on a read-only volume, any file), the index still opens.
    #[test]
    fn an_index_opens_where_nothing_can_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = DocStoreWriter::create(dir.path(), true, 50_000_000).unwrap();
        for passage in &passages(10) {
            writer.add(passage).unwrap();
        }
        writer.finish(manifest(Method::Bm25)).unwrap();
        let lock = dir.path().join(".tantivy-meta.lock");
        let _ = std::fs::remove_file(&lock);
        std::fs::create_dir(&lock).unwrap();
        let before: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        let store = DocStore::open(dir.path()).unwrap();
        assert_eq!(store.len(), 10);
        let after: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn manifest_missing_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = DocStoreWriter::create(dir.path(), true, 50_000_000).unwrap();
        writer.add(&passages(1)[0]).unwrap();
        writer.finish(manifest(Method::Bm25)).unwrap();
        std::fs::remove_file(dir.path().join(MANIFEST)).unwrap();
        let err = DocStore::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.starts_with(&format!("{}: no kart-index.json: not a kart index", dir.path().display())),
            "{err}"
        );
    }

    /// The files of the index's segments (named by the segment's id, a 32-digit hex uuid).
    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                let name = path.file_name().unwrap().to_str().unwrap();
                name.split('.')
                    .next()
                    .is_some_and(|id| id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()))
            })
            .collect();
        files.sort();
        files
    }

    /// A copy of the index folder `from` in a new temporary folder.
    fn copy_index(from: &Path) -> tempfile::TempDir {
        let to = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, to.path().join(path.file_name().unwrap())).unwrap();
        }
        to
    }

    /// Overwrites `len` bytes of `path` from `start` with pseudo-random bytes.
    pub(crate) fn scribble(path: &Path, start: usize, len: usize) {
        let mut bytes = std::fs::read(path).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for byte in &mut bytes[start..start + len] {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_damaged_segment_file_is_refused_at_open_naming_it() {
        let built = tempfile::tempdir().unwrap();
        let mut writer = DocStoreWriter::create(built.path(), true, 50_000_000).unwrap();
        for passage in &passages(2000) {
            writer.add(passage).unwrap();
        }
        writer.finish(manifest(Method::Bm25)).unwrap();
        DocStore::open(built.path()).unwrap();
        let files = segment_files(built.path());
        let extensions: Vec<&str> = files.iter().map(|f| f.extension().unwrap().to_str().unwrap()).collect();
        assert!(extensions.contains(&"store") && extensions.contains(&"idx"), "{extensions:?}");

        for file in &files {
            let name = file.file_name().unwrap();
            // The issue's reproduction: half of one file overwritten with random bytes.
            let copy = copy_index(built.path());
            let path = copy.path().join(name);
            let len = std::fs::metadata(&path).unwrap().len() as usize;
            scribble(&path, 0, len / 2);
            let error = DocStore::open(copy.path()).err().map(|e| e.to_string());
            // The checksum does not match, or (in a file whose first half holds its footer) the
            // footer holding it is damaged too.
            let expected = [": damaged: its contents do not match the checksum", ": damaged or unreadable: "]
                .map(|what| format!("{}{what}", path.display()));
            let named = error.as_ref().is_some_and(|e| expected.iter().any(|x| e.starts_with(x)));
            assert!(named, "{name:?}: {error:?}");
            assert!(error.unwrap().ends_with("rebuild the index with `kart retriever index`"));

            // The footer holding the checksum itself damaged.
            let copy = copy_index(built.path());
            let path = copy.path().join(name);
            scribble(&path, len - 8, 8);
            let error = DocStore::open(copy.path()).err().map(|e| e.to_string());
            let expected = format!("{}: damaged or unreadable: its footer cannot be read", path.display());
            assert!(error.as_ref().is_some_and(|e| e.starts_with(&expected)), "{name:?}: {error:?}");
        }
    }

    #[test]
    fn other_formats_and_existing_indexes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        DocStoreWriter::create(dir.path(), true, 50_000_000).unwrap().finish(manifest(Method::Bm25)).unwrap();
        let err = DocStoreWriter::create(dir.path(), true, 50_000_000).err().unwrap().to_string();
        assert!(err.ends_with("already holds an index; remove it or choose another folder"), "{err}");
        let path = dir.path().join(MANIFEST);
        std::fs::write(&path, r#"{"format": 9, "method": "bm25", "documents": 0}"#).unwrap();
        let err = DocStore::open(dir.path()).err().unwrap().to_string();
        assert_eq!(err, format!("{}: index format 9 cannot be read by this kart (format 1)", path.display()));
    }
}
