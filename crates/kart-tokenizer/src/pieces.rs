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

use crate::byte_level::{ByteLevelBpe, GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT};
use crate::remembered::Remembered;

/// Pre-tokenizer patterns that end every pre-token at a line break followed by a letter: Qwen2's
/// and Llama 3's (the same but for runs of up to three digits).
const LINE_SAFE_SPLITS: [&str; 2] = [QWEN2_SPLIT, LLAMA3_SPLIT];

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
    ids: Remembered,
}

impl Pieces {
    /// Pieces for `backend`.
    pub(crate) fn new(backend: &tokenizers::Tokenizer, byte_level: Option<&ByteLevelBpe>) -> Pieces {
        Pieces {
            cut_lines: lines_are_boundaries(backend, byte_level),
            ids: Remembered::new(REMEMBERED, LONGEST_REMEMBERED),
        }
    }

    /// The ids of `text`, each piece's from memory or from `encode`.
    pub(crate) fn encode<E>(
        &self,
        text: &str,
        encode: impl Fn(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        let mut ids = Vec::new();
        self.ids.encode(self.cut(text), encode, &mut ids)?;
        Ok(ids)
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
        self.ids.len()
    }
}

/// Whether `backend` never makes a token across a line break followed by an ASCII letter: its
/// pipeline is byte-level BPE splitting with GPT-2's pattern or a [`LINE_SAFE_SPLITS`] one, and no
/// added token holds a line break or strips whitespace.
fn lines_are_boundaries(backend: &tokenizers::Tokenizer, byte_level: Option<&ByteLevelBpe>) -> bool {
    let split =
        byte_level.is_some_and(|b| b.pattern() == GPT2_SPLIT || LINE_SAFE_SPLITS.contains(&b.pattern()));
    let added = backend
        .get_added_tokens_decoder()
        .values()
        .all(|token| !token.lstrip && !token.rstrip && !token.content.contains('\n'));
    split && added
}

#[cfg(test)]
mod tests {
    use crate::Tokenizer;
    use crate::testing::{byte_level_pipelines, texts};
    use serde_json::Value;

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

    fn agree_with_whole_texts(tokenizer: &Tokenizer, what: &str) {
        for round in ["encoded", "remembered"] {
            for text in texts(1500) {
                let whole = tokenizer.backend().encode(text.as_str(), false).unwrap().get_ids().to_vec();
                assert_eq!(tokenizer.encode_cached(&text).unwrap(), whole, "{what}, {round}: {text:?}");
            }
        }
    }

    #[test]
    fn pieces_give_the_ids_of_the_whole_text() {
        for (tokenizer, what) in byte_level_pipelines() {
            assert!(tokenizer.pieces().cut_lines, "{what}");
            agree_with_whole_texts(&tokenizer, what);
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
