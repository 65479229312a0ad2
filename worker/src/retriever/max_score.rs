//! Exact top-k of a disjunction of BM25 terms over tantivy postings: MaxScore (Turtle & Flood,
//! 1995) with block-max bounds per window of documents, as Lucene's `MaxScoreBulkScorer`.
//!
//! A segment is scored a window of [`WINDOW`] doc ids at a time. In each window every term gets
//! the best score it can give a document there, the maximum of its postings' block maxima
//! ([`BlockMaxima`]) over the window. Terms are ordered by that bound; once `k` documents are
//! found, the terms whose bounds add up to no more than the `k`-th best score are non-essential in
//! the window: a document containing only them cannot enter the top `k`. Windows where no term is
//! essential are skipped without reading a posting. The essential terms' postings are walked,
//! their scores summed in an array; each document found is then completed with the non-essential
//! terms (a skip-list seek each), most promising first, only while they can still lift it into the
//! top `k`. Scores and ranks are those of tantivy's `BooleanQuery` of `Should` term queries, up to
//! float rounding.
//!
//! Block maxima make the bounds tight: tantivy's own bound, [`Bm25Weight::max_score`], assumes an
//! unbounded term frequency in the shortest document and is about twice the best score a common
//! word really reaches, and a word's best score in a window is often well below its best anywhere.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, RwLock};
use tantivy::fieldnorm::FieldNormReader;
use tantivy::postings::{Postings, SegmentPostings};
use tantivy::query::Bm25Weight;
use tantivy::schema::IndexRecordOption;
use tantivy::{DocId, DocSet, InvertedIndexReader, Score, TERMINATED, Term};

/// Doc ids scored together.
const WINDOW: DocId = 4096;

/// The postings of one term in one segment as blocks of 128: each block's last doc id and the
/// best score of its documents.
#[derive(Debug)]
pub struct BlockMaxima {
    last_docs: Vec<DocId>,
    scores: Vec<Score>,
}

impl BlockMaxima {
    /// Reads the blocks of `term`'s postings (decoding each once); `None` when the segment lacks
    /// the term.
    fn read(
        inverted_index: &InvertedIndexReader,
        term: &Term,
        weight: &Bm25Weight,
        fieldnorms: &FieldNormReader,
    ) -> tantivy::Result<Option<Self>> {
        let Some(mut blocks) = inverted_index.read_block_postings(term, IndexRecordOption::WithFreqs)? else {
            return Ok(None);
        };
        let (mut last_docs, mut scores) = (Vec::new(), Vec::new());
        while let Some(&last) = blocks.docs().last() {
            last_docs.push(last);
            scores.push(blocks.block_max_score(fieldnorms, weight));
            blocks.advance();
        }
        Ok(Some(BlockMaxima { last_docs, scores }))
    }

    /// The first block at or after `from` whose last doc is at least `doc`.
    fn block_of(&self, from: usize, doc: DocId) -> usize {
        from + self.last_docs[from..].partition_point(|&last| last < doc)
    }
}

/// The [`BlockMaxima`] of every term queried so far, by segment, read the first time a query uses
/// the term and kept for the index's lifetime (the index never changes once built). Memory grows
/// at most to 8 bytes per 128 postings of the index.
#[derive(Debug, Default)]
pub struct BlockMaximaCache(RwLock<HashMap<SegmentTerm, Option<Arc<BlockMaxima>>>>);

/// A term in a segment (by ordinal).
type SegmentTerm = (u32, Term);

impl BlockMaximaCache {
    fn get(
        &self,
        segment_ord: u32,
        term: &Term,
        weight: &Bm25Weight,
        fieldnorms: &FieldNormReader,
        inverted_index: &InvertedIndexReader,
    ) -> tantivy::Result<Option<Arc<BlockMaxima>>> {
        let key = (segment_ord, term.clone());
        if let Some(blocks) = self.0.read().expect("block maxima lock").get(&key) {
            return Ok(blocks.clone());
        }
        let blocks = BlockMaxima::read(inverted_index, term, weight, fieldnorms)?.map(Arc::new);
        self.0.write().expect("block maxima lock").insert(key, blocks.clone());
        Ok(blocks)
    }
}

/// A scored document of a segment; greater is better, and the lower document wins a tie.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub score: Score,
    pub doc: DocId,
}

impl Eq for Hit {}

impl Ord for Hit {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&other.score).then(other.doc.cmp(&self.doc))
    }
}

impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One term's postings, positioned in the segment.
struct Cursor<'a> {
    postings: SegmentPostings,
    weight: &'a Bm25Weight,
    blocks: Arc<BlockMaxima>,
    /// The first block that may hold a doc of the current window or a later one.
    block: usize,
    /// The term's bound in the current window.
    bound: Score,
}

impl Cursor<'_> {
    /// The best score the term gives a document in `[base, end)`; moves `block` to `base`.
    fn window_bound(&mut self, base: DocId, end: DocId) -> Score {
        self.block = self.blocks.block_of(self.block, base);
        if self.postings.doc() >= end {
            return 0.0;
        }
        let BlockMaxima { last_docs, scores } = &*self.blocks;
        let mut bound: Score = 0.0;
        for (&last, &score) in last_docs[self.block..].iter().zip(&scores[self.block..]) {
            bound = bound.max(score);
            if last >= end - 1 {
                break;
            }
        }
        bound
    }

    /// A lower bound of the term's first doc at or after `end`: exact when the postings are there
    /// already, else the start of the first block that can hold one ([`TERMINATED`] if none can).
    fn next_doc_from(&self, end: DocId) -> DocId {
        let doc = self.postings.doc();
        if doc >= end {
            return doc;
        }
        let block = self.blocks.block_of(self.block, end);
        match block {
            b if b == self.blocks.last_docs.len() => TERMINATED,
            0 => end,
            b => end.max(self.blocks.last_docs[b - 1] + 1),
        }
    }

    fn score(&self, fieldnorms: &FieldNormReader, doc: DocId) -> Score {
        self.weight.score(fieldnorms.fieldnorm_id(doc), self.postings.term_freq())
    }
}

/// The `k` best documents of a segment for the sum of the BM25 scores of `terms` (each with its
/// weight), best first not guaranteed.
pub fn top_k(
    segment_ord: u32,
    inverted_index: &InvertedIndexReader,
    fieldnorms: &FieldNormReader,
    cache: &BlockMaximaCache,
    terms: &[(Bm25Weight, Term)],
    k: usize,
) -> tantivy::Result<Vec<Hit>> {
    let mut cursors = Vec::with_capacity(terms.len());
    for (weight, term) in terms {
        let blocks = cache.get(segment_ord, term, weight, fieldnorms, inverted_index)?;
        let postings = inverted_index.read_postings(term, IndexRecordOption::WithFreqs)?;
        if let (Some(blocks), Some(postings)) = (blocks, postings) {
            cursors.push(Cursor { postings, weight, blocks, block: 0, bound: 0.0 });
        }
    }
    let mut top = BinaryHeap::with_capacity(k + 1);
    let mut threshold = Score::MIN;
    let mut scores = vec![0.0; WINDOW as usize];
    let mut matched = [0u64; WINDOW as usize / 64];
    // The cursors by their bound in the window (cursors are large: they are not moved), and
    // bounds[i]: the best score the cursors order[..=i] give a document together.
    let mut order: Vec<usize> = (0..cursors.len()).collect();
    let mut bounds = Vec::with_capacity(cursors.len());
    let mut base = cursors.iter().map(|c| c.postings.doc()).min().unwrap_or(TERMINATED);
    while base != TERMINATED {
        let end = base.saturating_add(WINDOW);
        for cursor in &mut cursors {
            cursor.bound = cursor.window_bound(base, end);
        }
        order.sort_unstable_by(|&a, &b| cursors[a].bound.total_cmp(&cursors[b].bound));
        bounds.clear();
        bounds.extend(order.iter().scan(0.0, |sum, &c| {
            *sum += cursors[c].bound;
            Some(*sum)
        }));
        // order[..essential] are non-essential in this window.
        let essential = bounds.partition_point(|&bound| bound <= threshold);
        for &c in &order[essential..] {
            let cursor = &mut cursors[c];
            let mut doc = cursor.postings.doc();
            if doc < base {
                doc = cursor.postings.seek(base);
            }
            while doc < end {
                let i = (doc - base) as usize;
                scores[i] += cursor.score(fieldnorms, doc);
                matched[i / 64] |= 1 << (i % 64);
                doc = cursor.postings.advance();
            }
        }
        for (word_index, word) in matched.iter_mut().enumerate() {
            let mut bits = std::mem::take(word);
            while bits != 0 {
                let i = word_index * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let doc = base + i as DocId;
                let mut score = std::mem::take(&mut scores[i]);
                for (&c, &bound) in order[..essential].iter().zip(&bounds[..essential]).rev() {
                    if score + bound <= threshold {
                        break;
                    }
                    let cursor = &mut cursors[c];
                    if cursor.postings.doc() < doc {
                        cursor.postings.seek(doc);
                    }
                    if cursor.postings.doc() == doc {
                        score += cursor.score(fieldnorms, doc);
                    }
                }
                if score > threshold {
                    top.push(Reverse(Hit { score, doc }));
                    if top.len() > k {
                        top.pop();
                    }
                    if top.len() == k {
                        threshold = top.peek().map_or(Score::MIN, |hit| hit.0.score);
                    }
                }
            }
        }
        base = cursors.iter().map(|c| c.next_doc_from(end)).min().unwrap_or(TERMINATED);
    }
    Ok(top.into_iter().map(|Reverse(hit)| hit).collect())
}
