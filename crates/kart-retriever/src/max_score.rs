//! Exact top-k of a disjunction of BM25 terms over tantivy postings: MaxScore (Turtle & Flood,
//! 1995) over windows of documents, as Lucene's `MaxScoreBulkScorer`.
//!
//! A segment is scored a window of [`WINDOW`] doc ids at a time (windows aligned to multiples of
//! it). The first time a term is queried, every posting of it is scored once for the best score it
//! gives a document in each window and in each part of [`PART`] doc ids ([`WindowMaxima`], kept in
//! a [`WindowMaximaCache`]). In a window, terms are ordered by their bound there; once `k`
//! documents are found, the terms whose bounds add up to no more than the `k`-th best score are
//! non-essential in the window: a document containing only them cannot enter the top `k`. Windows
//! where no term is essential are skipped without reading a posting. The essential terms' postings
//! are walked a decoded block of 128 at a time, their scores summed by document; a document is
//! kept only if the non-essential terms' bounds in its part can lift it above the threshold (parts
//! where all the terms together cannot are passed over whole). The documents kept are then
//! completed a non-essential term at a time, most promising first, with a seek each, dropping
//! those the terms left cannot lift above the threshold. Scores and ranks are those of tantivy's
//! `BooleanQuery` of `Should` term queries, up to float rounding.
//!
//! Exact maxima make the bounds tight: tantivy's own bound, [`Bm25Weight::max_score`], assumes an
//! unbounded term frequency in the shortest document and is about twice the best score a common
//! word really reaches, and a word's best score in 128 documents is often well below its best
//! anywhere. Fine parts were measured faster (1M passages, 10k queries: 4096-id windows in eighths
//! 0.194 ms per query, 16384-id windows in parts of 128 ids 0.176 ms), and filtering the documents
//! by their part as they are gathered rather than after, faster still (0.158 ms).

use crate::stored_maxima::StoredMaxima;
use lru::LruCache;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use tantivy::fieldnorm::FieldNormReader;
use tantivy::postings::BlockSegmentPostings;
use tantivy::query::Bm25Weight;
use tantivy::schema::IndexRecordOption;
use tantivy::{DocId, InvertedIndexReader, Score, TERMINATED, Term};

/// Doc ids scored together.
pub(crate) const WINDOW: DocId = 16384;

/// Parts of a window with their own bound.
pub(crate) const PARTS: usize = 128;

/// Doc ids in a part of a window.
const PART: usize = WINDOW as usize / PARTS;

/// The best scores one term gives a document in a window and in each of its parts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bounds {
    window: Score,
    parts: [Score; PARTS],
}

impl Bounds {
    const NONE: Bounds = Bounds { window: 0.0, parts: [0.0; PARTS] };

    /// The bounds with a byte per part: each part's as the least fraction `q / 255` of the
    /// window's that is not below it.
    fn pack(&self) -> PackedBounds {
        let parts = self.parts.map(|part| {
            let mut q = (part / self.window * 255.0).ceil().clamp(0.0, 255.0) as u8;
            while q < u8::MAX && unpack(self.window, q) < part {
                q += 1;
            }
            q
        });
        PackedBounds { window: self.window, parts }
    }
}

/// [`Bounds`] packed by [`Bounds::pack`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PackedBounds {
    pub(crate) window: Score,
    pub(crate) parts: [u8; PARTS],
}

impl PackedBounds {
    /// Adds the part bounds to `sums`.
    #[inline]
    fn add_to(&self, sums: &mut PartBounds) {
        for (sum, &q) in sums.iter_mut().zip(&self.parts) {
            *sum += unpack(self.window, q);
        }
    }
}

/// A bound for each part of a window.
type PartBounds = [Score; PARTS];

/// The part bound `q / 255` of `window` (exactly `window` for 255).
#[inline]
fn unpack(window: Score, q: u8) -> Score {
    window * (Score::from(q) / 255.0)
}

/// The postings of one term in one segment summarised by window: the windows where the term has
/// documents, ascending, and its [`Bounds`] there.
#[derive(Debug, PartialEq)]
pub struct WindowMaxima {
    windows: Vec<u32>,
    bounds: Vec<PackedBounds>,
}

impl WindowMaxima {
    /// Scores every posting of `term` once; `None` when the segment lacks the term.
    pub(crate) fn read(
        inverted_index: &InvertedIndexReader,
        term: &Term,
        weight: &Bm25Weight,
        fieldnorms: &FieldNormReader,
    ) -> tantivy::Result<Option<Self>> {
        let Some(mut blocks) = inverted_index.read_block_postings(term, IndexRecordOption::WithFreqs)? else {
            return Ok(None);
        };
        let (mut windows, mut bounds) = (Vec::new(), Vec::new());
        // The bounds of the last window of `windows`, packed into `bounds` once it is passed.
        let mut current = Bounds::NONE;
        while !blocks.docs().is_empty() {
            for (&doc, &freq) in blocks.docs().iter().zip(blocks.freqs()) {
                let score = weight.score(fieldnorms.fieldnorm_id(doc), freq);
                let window = doc / WINDOW;
                if windows.last() != Some(&window) {
                    if !windows.is_empty() {
                        bounds.push(current.pack());
                    }
                    windows.push(window);
                    current = Bounds::NONE;
                }
                current.window = current.window.max(score);
                let part = &mut current.parts[(doc % WINDOW) as usize / PART];
                *part = part.max(score);
            }
            blocks.advance();
        }
        if !windows.is_empty() {
            bounds.push(current.pack());
        }
        Ok(Some(WindowMaxima { windows, bounds }))
    }

    /// Maxima of the `windows` where the term has documents, with their `bounds`.
    pub(crate) fn from_parts(windows: Vec<u32>, bounds: Vec<PackedBounds>) -> Self {
        assert_eq!(windows.len(), bounds.len(), "a bound per window");
        WindowMaxima { windows, bounds }
    }

    /// The windows where the term has documents, ascending.
    pub(crate) fn windows(&self) -> &[u32] {
        &self.windows
    }

    /// The term's bounds in each of [`Self::windows`].
    pub(crate) fn bounds(&self) -> &[PackedBounds] {
        &self.bounds
    }

    /// Bytes held (the vectors' contents).
    fn bytes(&self) -> usize {
        self.windows.len() * std::mem::size_of::<u32>()
            + self.bounds.len() * std::mem::size_of::<PackedBounds>()
    }
}

/// Bytes of [`WindowMaxima`] a [`WindowMaximaCache`] keeps by default.
const CACHE_BYTES: usize = 1 << 30;

/// The [`WindowMaxima`] of the terms queried most recently, by segment: read the first time a
/// query uses a term (from the index's [`StoredMaxima`] for a common term, else from its
/// postings) and kept (the index never changes once built) until the least recently used terms
/// have to make room within the cache's budget. A term takes 136 bytes per window where it has
/// documents: at most that per posting for a rare term, and 8.3 bytes per 1,000 documents of the
/// segment for a common one (175 KB in a 21M-passage index).
pub struct WindowMaximaCache {
    terms: Mutex<CachedTerms>,
    budget: usize,
    stored: Option<StoredMaxima>,
}

/// The terms in a [`WindowMaximaCache`] and the bytes they hold.
struct CachedTerms {
    lru: LruCache<SegmentTerm, Option<Arc<WindowMaxima>>>,
    bytes: usize,
}

/// A term in a segment (by ordinal).
type SegmentTerm = (u32, Term);

impl WindowMaximaCache {
    /// A cache over the maxima an index stored (if any), of the default budget.
    pub fn new(stored: Option<StoredMaxima>) -> Self {
        WindowMaximaCache { stored, ..Self::with_budget(CACHE_BYTES) }
    }

    /// A cache keeping at most about `budget` bytes (always the last term read).
    fn with_budget(budget: usize) -> Self {
        let terms = CachedTerms { lru: LruCache::unbounded(), bytes: 0 };
        WindowMaximaCache { terms: Mutex::new(terms), budget, stored: None }
    }

    fn get(
        &self,
        segment_ord: u32,
        term: &Term,
        weight: &Bm25Weight,
        fieldnorms: &FieldNormReader,
        inverted_index: &InvertedIndexReader,
    ) -> tantivy::Result<Option<Arc<WindowMaxima>>> {
        let key = (segment_ord, term.clone());
        if let Some(maxima) = self.terms.lock().expect("window maxima lock").lru.get(&key) {
            return Ok(maxima.clone());
        }
        let maxima = match self.stored.as_ref().and_then(|stored| stored.get(segment_ord, term)) {
            Some(stored) => Some(stored),
            None => WindowMaxima::read(inverted_index, term, weight, fieldnorms)?,
        };
        let maxima = maxima.map(Arc::new);
        self.insert(key, maxima.clone());
        Ok(maxima)
    }

    /// Keeps `maxima` as the most recently used, letting the least recently used go while the
    /// cache holds more than its budget.
    fn insert(&self, key: SegmentTerm, maxima: Option<Arc<WindowMaxima>>) {
        let size = |key: &SegmentTerm, maxima: &Option<Arc<WindowMaxima>>| {
            std::mem::size_of::<(SegmentTerm, Option<Arc<WindowMaxima>>)>()
                + key.1.serialized_value_bytes().len()
                + maxima.as_ref().map_or(0, |maxima| maxima.bytes())
        };
        let mut terms = self.terms.lock().expect("window maxima lock");
        terms.bytes += size(&key, &maxima);
        // Another thread may have read the same term meanwhile.
        if let Some((key, replaced)) = terms.lru.push(key, maxima) {
            terms.bytes -= size(&key, &replaced);
        }
        while terms.bytes > self.budget && terms.lru.len() > 1 {
            let (key, maxima) = terms.lru.pop_lru().expect("more than one term");
            terms.bytes -= size(&key, &maxima);
        }
    }

    /// Bytes held and terms kept.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let terms = self.terms.lock().expect("window maxima lock");
        (terms.bytes, terms.lru.len())
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

/// One term's postings in the segment, read a decoded block of 128 at a time.
struct Cursor<'a> {
    postings: BlockSegmentPostings,
    /// The current posting's index in the loaded block; the block's length once it is passed
    /// (the postings are exhausted when the block is empty).
    at: usize,
    weight: &'a Bm25Weight,
    maxima: Arc<WindowMaxima>,
    /// The first of `maxima`'s windows not before the current window.
    window_at: usize,
    /// The term's best score in the current window (0 where it has no document).
    bound: Score,
    /// The index of the current window in `maxima`, if the term has documents there.
    here: Option<usize>,
}

impl Cursor<'_> {
    /// Moves to `window`, which follows the previous one, and sets the term's bound there.
    fn enter(&mut self, window: u32) {
        let windows = &self.maxima.windows;
        while self.window_at < windows.len() && windows[self.window_at] < window {
            self.window_at += 1;
        }
        self.here = (windows.get(self.window_at) == Some(&window)).then_some(self.window_at);
        self.bound = self.here.map_or(0.0, |at| self.maxima.bounds[at].window);
    }

    /// Adds the term's part bounds in the current window to `sums`.
    fn add_part_bounds(&self, sums: &mut PartBounds) {
        if let Some(at) = self.here {
            self.maxima.bounds[at].add_to(sums);
        }
    }

    /// The next window after `window` where the term has documents, `None` after its last.
    fn next_window(&self, window: u32) -> Option<u32> {
        let windows = &self.maxima.windows;
        let at = self.window_at + usize::from(windows.get(self.window_at) == Some(&window));
        windows.get(at).copied()
    }

    /// The current doc, [`TERMINATED`] once the postings are exhausted.
    fn doc(&self) -> DocId {
        self.postings.docs().get(self.at).copied().unwrap_or(TERMINATED)
    }

    /// Moves to the first posting at or after `target` (never backwards).
    fn seek(&mut self, target: DocId) {
        let docs = self.postings.docs();
        match docs.last() {
            Some(&last) if last >= target => {
                self.at = gallop(docs, self.at, target);
            }
            // Past the loaded block: the skip list finds the block, decoding no other.
            Some(_) => self.at = self.postings.seek(target),
            None => {}
        }
    }

    /// Calls `found(doc, score)` for every posting in `[from, end)`, in order, and stops at the
    /// first posting at or after `end`.
    fn walk(
        &mut self,
        from: DocId,
        end: DocId,
        fieldnorms: &FieldNormReader,
        mut found: impl FnMut(DocId, Score),
    ) {
        self.seek(from);
        loop {
            let (docs, freqs) = (self.postings.docs(), self.postings.freqs());
            let stop = match docs.last() {
                Some(&last) if last < end => docs.len(),
                Some(_) => self.at + docs[self.at..].partition_point(|&doc| doc < end),
                None => return,
            };
            for (&doc, &freq) in docs[self.at..stop].iter().zip(&freqs[self.at..stop]) {
                found(doc, self.weight.score(fieldnorms.fieldnorm_id(doc), freq));
            }
            self.at = stop;
            if stop < docs.len() {
                return;
            }
            self.postings.advance();
            self.at = 0;
        }
    }

    /// The term's score of `doc` if it contains it, moving to it.
    fn score_of(&mut self, doc: DocId, fieldnorms: &FieldNormReader) -> Option<Score> {
        self.seek(doc);
        (self.doc() == doc)
            .then(|| self.weight.score(fieldnorms.fieldnorm_id(doc), self.postings.freqs()[self.at]))
    }
}

/// The index of the first of `docs` at or after `target`, searching from `from`: doubling steps,
/// then a binary search of the last one (cheap when the target is near).
fn gallop(docs: &[DocId], from: usize, target: DocId) -> usize {
    let (mut low, mut step) = (from, 1);
    if docs[low] >= target {
        return low;
    }
    // docs[low] < target <= docs[last] always holds.
    while low + step < docs.len() && docs[low + step] < target {
        low += step;
        step *= 2;
    }
    let high = (low + step).min(docs.len());
    low + 1 + docs[low + 1..high].partition_point(|&doc| doc < target)
}

/// The `k` best documents of a segment for the sum of the BM25 scores of `terms` (each with its
/// weight), best first not guaranteed.
pub fn top_k(
    segment_ord: u32,
    inverted_index: &InvertedIndexReader,
    fieldnorms: &FieldNormReader,
    cache: &WindowMaximaCache,
    terms: &[(Bm25Weight, Term)],
    k: usize,
) -> tantivy::Result<Vec<Hit>> {
    let mut cursors = Vec::with_capacity(terms.len());
    for (weight, term) in terms {
        let maxima = cache.get(segment_ord, term, weight, fieldnorms, inverted_index)?;
        let postings = inverted_index.read_block_postings(term, IndexRecordOption::WithFreqs)?;
        if let (Some(maxima), Some(postings)) = (maxima, postings) {
            cursors.push(Cursor { postings, at: 0, weight, maxima, window_at: 0, bound: 0.0, here: None });
        }
    }
    let mut scan = Scan::new(k, cursors.len());
    let mut next = cursors.iter().filter_map(|c| c.maxima.windows.first()).min().copied();
    while let Some(window) = next {
        scan.window(&mut cursors, fieldnorms, window);
        next = cursors.iter().filter_map(|c| c.next_window(window)).min();
    }
    SCRATCH.set(Some(scan.scratch));
    Ok(scan.top.into_iter().map(|Reverse(hit)| hit).collect())
}

/// A window's per-document scores and which documents have one, all zero between windows.
struct Scratch {
    scores: Vec<Score>,
    matched: Vec<u64>,
}

impl Scratch {
    fn new() -> Self {
        Scratch { scores: vec![0.0; WINDOW as usize], matched: vec![0; WORDS] }
    }
}

thread_local! {
    /// The scratch of this thread's last finished scan: allocating and zeroing 66 KiB for each
    /// query was a fifth of a small index's search. Every window clears what it touched, so a scan
    /// that finishes leaves it zero; one that panics drops it instead of putting it back.
    static SCRATCH: std::cell::Cell<Option<Scratch>> = const { std::cell::Cell::new(None) };
}

/// Whether this thread keeps a scratch, and it is all zero.
#[cfg(test)]
pub(crate) fn scratch_kept_clean() -> bool {
    let scratch = SCRATCH.take();
    let clean = scratch
        .as_ref()
        .is_some_and(|s| s.scores.iter().all(|&x| x == 0.0) && s.matched.iter().all(|&w| w == 0));
    SCRATCH.set(scratch);
    clean
}

/// Words of 64 bits marking a window's documents.
const WORDS: usize = WINDOW as usize / 64;

/// Part bounds of no term.
const NO_PARTS: PartBounds = [0.0; PARTS];

const _: () = assert!(PART.is_multiple_of(64), "a word of documents lies in one part");

/// A scan of a segment's windows: the best documents so far and scratch space.
struct Scan {
    k: usize,
    top: BinaryHeap<Reverse<Hit>>,
    /// The `k`-th best score so far ([`Score::MIN`] until `k` documents are found).
    threshold: Score,
    /// The cursors by their bound in the window (cursors are large: they are not moved).
    order: Vec<usize>,
    /// `bounds[i]`: the best the cursors `order[..=i]` give a document together in the window.
    bounds: Vec<Score>,
    /// `sums[i]`: the same in each part.
    sums: Vec<PartBounds>,
    /// Essential terms' scores by document of the window and which documents they found, and
    /// which words of `scratch.matched` are not zero.
    scratch: Scratch,
    touched: [u64; WORDS / 64],
    /// The documents that can still enter the top `k`.
    found: Candidates,
}

impl Scan {
    fn new(k: usize, terms: usize) -> Self {
        Scan {
            k,
            top: BinaryHeap::with_capacity(k + 1),
            threshold: Score::MIN,
            order: (0..terms).collect(),
            bounds: Vec::with_capacity(terms),
            sums: Vec::with_capacity(terms),
            scratch: SCRATCH.take().unwrap_or_else(Scratch::new),
            touched: [0; WORDS / 64],
            found: Candidates::new(),
        }
    }

    /// Scores the documents of `window` that can enter the top `k`.
    fn window(&mut self, cursors: &mut [Cursor], fieldnorms: &FieldNormReader, window: u32) {
        for cursor in cursors.iter_mut() {
            cursor.enter(window);
        }
        let Scan { order, bounds, sums, .. } = self;
        let by_bound = |&a: &usize, &b: &usize| cursors[a].bound.total_cmp(&cursors[b].bound);
        if !order.is_sorted_by(|a, b| by_bound(a, b).is_le()) {
            order.sort_unstable_by(by_bound);
        }
        bounds.clear();
        bounds.extend(order.iter().scan(0.0, |sum, &c| {
            *sum += cursors[c].bound;
            Some(*sum)
        }));
        // order[..essential] are non-essential in this window.
        let essential = bounds.partition_point(|&sum| sum <= self.threshold);
        if essential == order.len() {
            return;
        }
        sums.clear();
        let mut sum = NO_PARTS;
        for &c in order.iter() {
            cursors[c].add_part_bounds(&mut sum);
            sums.push(sum);
        }
        let (base, end) = (window * WINDOW, window * WINDOW + WINDOW);
        self.found.clear();
        if let [c] = self.order[essential..] {
            let Scan { threshold, sums, found, .. } = self;
            let rest = rest(sums, essential);
            cursors[c].walk(base, end, fieldnorms, |doc, score| {
                let offset = doc - base;
                found.push_if((offset, score), score + rest[offset as usize / PART] > *threshold);
            });
        } else {
            self.gather(cursors, fieldnorms, essential, base, end);
        }
        self.complete(cursors, fieldnorms, essential, base);
    }

    /// Sums the scores of the essential terms `order[essential..]` for the documents in
    /// `[base, end)` they find, and keeps in `found`, in document order, those the non-essential
    /// terms can lift above the threshold.
    fn gather(
        &mut self,
        cursors: &mut [Cursor],
        fieldnorms: &FieldNormReader,
        essential: usize,
        base: DocId,
        end: DocId,
    ) {
        let Scan { threshold, order, sums, scratch: Scratch { scores, matched }, touched, found, .. } = self;
        for &c in &order[essential..] {
            cursors[c].walk(base, end, fieldnorms, |doc, score| {
                let (i, word) = ((doc - base) as usize, (doc - base) as usize / 64);
                scores[i] += score;
                matched[word] |= 1 << (i % 64);
                touched[word / 64] |= 1 << (word % 64);
            });
        }
        let (all, rest) = (sums.last().expect("an essential term"), rest(sums, essential));
        for (summary_index, summary) in touched.iter_mut().enumerate() {
            let mut words = std::mem::take(summary);
            while words != 0 {
                let word = summary_index * 64 + words.trailing_zeros() as usize;
                words &= words - 1;
                let (mut bits, part) = (std::mem::take(&mut matched[word]), word * 64 / PART);
                if all[part] <= *threshold {
                    // No document of this part can enter the top k.
                    scores[word * 64..word * 64 + 64].fill(0.0);
                    continue;
                }
                while bits != 0 {
                    let i = word * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let score = std::mem::take(&mut scores[i]);
                    found.push_if((i as DocId, score), score + rest[part] > *threshold);
                }
            }
        }
    }

    /// Adds the non-essential terms' scores to the documents found, a term at a time, most
    /// promising first, dropping those the terms left cannot lift above the threshold, and keeps
    /// those that reach the top `k`.
    fn complete(
        &mut self,
        cursors: &mut [Cursor],
        fieldnorms: &FieldNormReader,
        essential: usize,
        base: DocId,
    ) {
        let Scan { k, top, threshold, order, sums, found, .. } = self;
        for term in (0..essential).rev() {
            let cursor = &mut cursors[order[term]];
            for (offset, score) in found.as_mut_slice() {
                *score += cursor.score_of(base + *offset, fieldnorms).unwrap_or(0.0);
            }
            if term > 0 {
                let rest = &sums[term - 1];
                found.retain(|&(offset, score)| score + rest[offset as usize / PART] > *threshold);
            }
        }
        for &(offset, score) in found.as_mut_slice().iter() {
            if score > *threshold {
                top.push(Reverse(Hit { score, doc: base + offset }));
                if top.len() > *k {
                    top.pop();
                }
                if top.len() == *k {
                    *threshold = top.peek().map_or(Score::MIN, |hit| hit.0.score);
                }
            }
        }
    }
}

/// The part bounds of the non-essential terms `order[..essential]` together.
fn rest(sums: &[PartBounds], essential: usize) -> &PartBounds {
    essential.checked_sub(1).map_or(&NO_PARTS, |last| &sums[last])
}

/// Documents of a window that can still enter the top `k` (as offsets in the window) with their
/// scores so far, filtered without a branch per document.
struct Candidates {
    items: Vec<(DocId, Score)>,
    len: usize,
}

impl Candidates {
    fn new() -> Self {
        Candidates { items: vec![(0, 0.0); WINDOW as usize], len: 0 }
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    /// Adds `item` if `keep` (each document of the window at most once).
    #[inline]
    fn push_if(&mut self, item: (DocId, Score), keep: bool) {
        self.items[self.len] = item;
        self.len += usize::from(keep);
    }

    fn as_mut_slice(&mut self) -> &mut [(DocId, Score)] {
        &mut self.items[..self.len]
    }

    /// Keeps the items for which `keep` holds, in order.
    fn retain(&mut self, keep: impl Fn(&(DocId, Score)) -> bool) {
        let mut kept = 0;
        for i in 0..self.len {
            let item = self.items[i];
            self.items[kept] = item;
            kept += usize::from(keep(&item));
        }
        self.len = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Window maxima of `windows` windows.
    fn maxima(windows: u32) -> Option<Arc<WindowMaxima>> {
        let bounds = PackedBounds { window: 1.0, parts: [0; PARTS] };
        Some(Arc::new(WindowMaxima {
            windows: (0..windows).collect(),
            bounds: vec![bounds; windows as usize],
        }))
    }

    fn term(text: &str) -> SegmentTerm {
        (0, Term::from_field_text(tantivy::schema::Field::from_field_id(0), text))
    }

    #[test]
    fn the_cache_lets_the_least_recently_used_terms_go_beyond_its_budget() {
        let entry = maxima(100).unwrap().bytes();
        let cache = WindowMaximaCache::with_budget(3 * entry + 1000);
        for word in ["a", "b", "c"] {
            cache.insert(term(word), maxima(100));
        }
        assert_eq!(cache.usage().1, 3);
        // "a" is used again, so "b" is the least recently used when "d" needs room.
        assert!(cache.terms.lock().unwrap().lru.get(&term("a")).is_some());
        cache.insert(term("d"), maxima(100));
        let (bytes, terms) = cache.usage();
        assert_eq!(terms, 3);
        assert!(bytes <= 3 * entry + 1000, "{bytes}");
        {
            let lru = &cache.terms.lock().unwrap().lru;
            assert!(lru.contains(&term("a")) && !lru.contains(&term("b")) && lru.contains(&term("d")));
        }
        // Reading a term twice (two threads at once) counts it once; a term larger than the
        // budget is still kept, alone.
        cache.insert(term("d"), maxima(100));
        assert_eq!(cache.usage(), (bytes, 3));
        cache.insert(term("huge"), maxima(10_000));
        assert_eq!(cache.usage().1, 1);
        cache.insert(term("absent"), None);
        assert_eq!(cache.usage().1, 1);
    }

    #[test]
    fn packed_part_bounds_are_never_below_the_parts_nor_above_the_window() {
        for window in [1e-3, 0.37, 1.0, 3.3, 7.123_456, 19.9, 1234.5] {
            let mut parts = [0.0; PARTS];
            for (i, part) in parts.iter_mut().enumerate() {
                *part = window * [0.0, 1e-7, 0.5, 0.999_999, 1.0, 0.1, 1.0 / 255.0, 254.5 / 255.0][i % 8];
            }
            let bounds = Bounds { window, parts };
            let packed = bounds.pack();
            assert_eq!(packed.window, window);
            let mut unpacked = [0.0; PARTS];
            packed.add_to(&mut unpacked);
            for (packed, part) in unpacked.iter().zip(parts) {
                assert!(*packed >= part && *packed <= window, "{part} packed as {packed} (window {window})");
                assert!(
                    *packed - part <= window / 255.0 * 1.001,
                    "{part} packed as {packed} (window {window})"
                );
            }
            assert_eq!(unpacked[0], 0.0);
            assert_eq!(unpacked[4], window);
        }
    }

    #[test]
    fn gallop_finds_the_first_doc_at_or_after_the_target() {
        let docs: Vec<DocId> = (0..128).map(|i| i * 3 + i * i / 7).collect();
        let last = *docs.last().unwrap();
        for from in [0, 1, 5, 63, 126, 127] {
            for target in docs[from] + 1..=last {
                let expected = docs.partition_point(|&doc| doc < target);
                assert_eq!(gallop(&docs, from, target), expected, "from {from}, target {target}");
            }
            assert_eq!(gallop(&docs, from, docs[from]), from);
        }
    }
}
