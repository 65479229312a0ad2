//! Encoding text piece by piece, remembering each piece's ids.
//!
//! A rollout worker tokenises the same text again and again: a group's prompt once per episode,
//! the same passages for every episode that retrieves them. [`Pieces`] cuts a text at the points
//! where the tokenizer's pipeline provably never joins the two sides into one token, the start of
//! a line that begins with an ASCII letter, and keeps the ids of the last 4096 pieces of at most
//! 4 KiB it has seen, so a repeated piece costs a lookup and the ids are those of the whole text.
//!
//! Those points are token boundaries only in pipelines that never let a pre-token run from a line
//! break into a letter: byte-level BPE whose pre-tokenizer is GPT-2's (`ByteLevel` with its regex)
//! or a `Split` on the pattern of Qwen2 or Llama 3 before a plain `ByteLevel`, with no prefix
//! space, no normaliser but NFC, no BPE dropout, no truncation or padding, and no added token that
//! holds a line break or strips whitespace. Any other tokenizer gets one piece per text: the
//! whole text, remembered as such.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
use serde_json::Value;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;

use crate::tokenizer::QWEN2_SPLIT;

/// Pre-tokenizer patterns that end every pre-token at a line break followed by a letter: Qwen2's
/// and Llama 3's (the same but for runs of up to three digits).
const LINE_SAFE_SPLITS: [&str; 2] = [
    QWEN2_SPLIT,
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// How many pieces are remembered.
const REMEMBERED: NonZeroUsize = NonZeroUsize::new(4096).expect("nonzero");

/// The longest piece remembered, in bytes: a prompt's lines and passages are shorter, and a long
/// page or tool response, rarely seen twice, would crowd out many of them (with this bound the
/// memory stays within tens of MiB).
const LONGEST_REMEMBERED: usize = 4096;

/// Pieces of text remembered with their ids.
pub(crate) struct Pieces {
    /// Whether texts may be cut at line starts (else each text is one piece).
    cut_lines: bool,
    ids: Mutex<LruCache<Box<str>, Box<[u32]>>>,
}

impl Pieces {
    /// Pieces for `backend`.
    pub(crate) fn new(backend: &tokenizers::Tokenizer) -> Pieces {
        Pieces { cut_lines: lines_are_boundaries(backend), ids: Mutex::new(LruCache::new(REMEMBERED)) }
    }

    /// The ids of `text`, each piece's from memory or from `encode`.
    pub(crate) fn encode<E>(
        &self,
        text: &str,
        encode: impl Fn(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        let mut ids = Vec::new();
        for piece in self.cut(text) {
            let known = self.lock().get(piece).map(|known| ids.extend_from_slice(known)).is_some();
            if !known {
                let fresh = encode(piece)?;
                ids.extend_from_slice(&fresh);
                if piece.len() <= LONGEST_REMEMBERED {
                    self.lock().put(piece.into(), fresh.into());
                }
            }
        }
        Ok(ids)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<Box<str>, Box<[u32]>>> {
        self.ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `text` cut before every line that starts with an ASCII letter (when allowed).
    fn cut<'t>(&self, text: &'t str) -> impl Iterator<Item = &'t str> {
        let bytes = text.as_bytes();
        let mut starts = (1..bytes.len())
            .filter(|&i| self.cut_lines && bytes[i - 1] == b'\n' && bytes[i].is_ascii_alphabetic())
            .chain(std::iter::once(bytes.len()));
        let mut from = 0;
        std::iter::from_fn(move || {
            let to = starts.next()?;
            let piece = &text[from..to];
            from = to;
            Some(piece)
        })
        .filter(|piece| !piece.is_empty())
    }

    /// Pieces remembered (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Whether `backend` never makes a token across a line break followed by an ASCII letter.
fn lines_are_boundaries(backend: &tokenizers::Tokenizer) -> bool {
    let normalizer = matches!(backend.get_normalizer(), None | Some(NormalizerWrapper::NFC(_)));
    let model = matches!(backend.get_model(), ModelWrapper::BPE(bpe) if bpe.dropout.is_none());
    let plain = backend.get_truncation().is_none() && backend.get_padding().is_none();
    let added = backend
        .get_added_tokens_decoder()
        .values()
        .all(|token| !token.lstrip && !token.rstrip && !token.content.contains('\n'));
    let pre_tokenizer = backend.get_pre_tokenizer().and_then(|p| serde_json::to_value(p).ok());
    normalizer && model && plain && added && pre_tokenizer.as_ref().is_some_and(line_safe_pre_tokenizer)
}

/// GPT-2's byte-level pre-tokenizer, or a split on a [`LINE_SAFE_SPLITS`] pattern before a
/// byte-level one without its regex; never a prefix space.
fn line_safe_pre_tokenizer(pre: &Value) -> bool {
    let byte_level = |p: &Value, regex: bool| {
        p["type"] == "ByteLevel" && p["add_prefix_space"] == false && p["use_regex"] == regex
    };
    let split = |p: &Value| {
        p["type"] == "Split"
            && p["behavior"] == "Isolated"
            && p["invert"] == false
            && p["pattern"]["Regex"].as_str().is_some_and(|r| LINE_SAFE_SPLITS.contains(&r))
    };
    match (pre["type"].as_str(), pre["pretokenizers"].as_array().map(Vec::as_slice)) {
        (Some("ByteLevel"), _) => byte_level(pre, true),
        (Some("Sequence"), Some([first, second])) => split(first) && byte_level(second, false),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::Tokenizer;
    use serde_json::Value;

    /// Fragments that meet at every kind of seam: line breaks before letters, digits, marks and
    /// spaces, combining accents, wide characters, special and added tokens, contractions.
    const FRAGMENTS: [&str; 34] = [
        "\n",
        "\n\n",
        "\r\n",
        "Doc 1(Title: \"France\") ",
        "Paris",
        " is",
        "the",
        "A",
        "z",
        "'s",
        "'S",
        "'ll",
        "é",
        "e\u{301}",
        "\u{301}",
        "\u{300}a",
        "中文",
        "🙂",
        "ß",
        "İ",
        "\u{a0}",
        " ",
        "  ",
        "\t",
        ".",
        "...",
        "123",
        "1952",
        "7",
        "<|im_end|>",
        "<|im_start|>",
        "</information>",
        "Zürich",
        "-",
    ];

    /// Random texts of 1 to 24 fragments (a fixed xorshift, so failures reproduce).
    fn texts(n: usize) -> Vec<String> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        (0..n)
            .map(|_| {
                let len = 1 + next() % 24;
                (0..len).map(|_| FRAGMENTS[(next() % FRAGMENTS.len() as u64) as usize]).collect()
            })
            .collect()
    }

    /// A change to a `tokenizer.json`.
    type Edit = fn(&mut Value);

    /// A copy of the fixture `model`'s tokenizer with `edit` applied to its `tokenizer.json`.
    fn edited(model: &str, edit: impl Fn(&mut Value)) -> (tempfile::TempDir, Tokenizer) {
        let from = kart_testing::model(model);
        let dir = tempfile::tempdir().unwrap();
        for file in ["tokenizer_config.json", "config.json"] {
            std::fs::copy(from.join(file), dir.path().join(file)).unwrap();
        }
        let mut json: Value =
            serde_json::from_str(&std::fs::read_to_string(from.join("tokenizer.json")).unwrap()).unwrap();
        edit(&mut json);
        std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        (dir, tokenizer)
    }

    /// Qwen2's pipeline as kart trains it, with added words, and Llama 3's split pattern on it.
    fn split_pipelines() -> Vec<Tokenizer> {
        // Line breaks in every company, so that merges join them to what surrounds them.
        let corpus = [
            "the quick brown fox\nDoc 1 is 1952.\n\n",
            "a search agent reads the page.\n\nDoc 2 \n  Paris\n\n\n",
            "Zürich 北京 'll \r\n\t\n<|im_end|>\n",
        ];
        let texts = corpus.iter().cycle().take(300).copied();
        let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let qwen2 = Tokenizer::train_byte_level_bpe(texts, 320, &special, "<|im_end|>", "<|endoftext|>")
            .unwrap()
            .with_added_words(&["1952", "Paris"])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        qwen2.save(dir.path(), None).unwrap();
        let path = dir.path().join("tokenizer.json");
        let json = std::fs::read_to_string(&path).unwrap().replace(r"\\p{N}|", r"\\p{N}{1,3}|");
        assert!(json.contains(r"\\p{N}{1,3}|"));
        std::fs::write(&path, json).unwrap();
        let llama3 = Tokenizer::load(dir.path()).unwrap();
        vec![qwen2, llama3]
    }

    fn agree_with_whole_texts(tokenizer: &Tokenizer, what: &str) {
        for round in ["encoded", "remembered"] {
            for text in texts(1500) {
                let whole = tokenizer.encode(&text, false).unwrap();
                assert_eq!(tokenizer.encode_cached(&text).unwrap(), whole, "{what}, {round}: {text:?}");
            }
        }
    }

    #[test]
    fn pieces_give_the_ids_of_the_whole_text() {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        assert!(tokenizer.pieces().cut_lines, "GPT-2's byte-level pre-tokenizer");
        agree_with_whole_texts(&tokenizer, "tiny-qwen2");
        for (tokenizer, what) in split_pipelines().iter().zip(["Qwen2's split", "Llama 3's split"]) {
            assert!(tokenizer.pieces().cut_lines, "{what}");
            agree_with_whole_texts(tokenizer, what);
        }
    }

    #[test]
    fn a_pipeline_that_may_join_lines_keeps_texts_whole() {
        let cases: [(&str, Edit); 4] = [
            ("a prefix space", |j| j["pre_tokenizer"]["add_prefix_space"] = true.into()),
            ("a normaliser", |j| j["normalizer"] = serde_json::json!({"type": "Lowercase"})),
            ("an added token holding a line break", |j| {
                j["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
                    "id": 366, "content": "\nDoc", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": false
                }))
            }),
            ("an added token stripping spaces", |j| j["added_tokens"][0]["lstrip"] = true.into()),
        ];
        for (what, edit) in cases {
            let (_dir, tokenizer) = edited("tiny-qwen2", edit);
            assert!(!tokenizer.pieces().cut_lines, "{what}");
            let text = "one\nDoc two\nDoc three";
            assert_eq!(tokenizer.encode_cached(text).unwrap(), tokenizer.encode(text, false).unwrap());
            assert_eq!(tokenizer.pieces().len(), 1, "{what}: the text is one piece");
        }
    }

    #[test]
    fn repeated_passages_are_remembered_piece_by_piece() {
        let tokenizer = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        let observation = |docs: &[&str]| {
            let lines: Vec<String> = docs
                .iter()
                .enumerate()
                .map(|(i, d)| format!("Doc {}(Title: {d}) {d} text.", i + 1))
                .collect();
            format!("\n\n<information>{}</information>\n\n", lines.join("\n"))
        };
        let _ = tokenizer.encode_cached(&observation(&["A", "B", "C"])).unwrap();
        assert_eq!(tokenizer.pieces().len(), 3);
        // The same passages again, and one new one in the middle: one new piece.
        let again = observation(&["A", "X", "C"]);
        assert_eq!(tokenizer.encode_cached(&again).unwrap(), tokenizer.encode(&again, false).unwrap());
        assert_eq!(tokenizer.pieces().len(), 4);
        // A page longer than any remembered piece is encoded every time, never kept.
        let page = "word ".repeat(1000);
        assert_eq!(tokenizer.encode_cached(&page).unwrap(), tokenizer.encode(&page, false).unwrap());
        assert_eq!(tokenizer.pieces().len(), 4);
    }
}
