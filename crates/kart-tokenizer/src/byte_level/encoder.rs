//! The encoder: the pre-tokenizer's pattern, GPT-2's byte alphabet and the pipeline's BPE model.

use std::num::NonZeroUsize;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use tokenizers::models::ModelWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::utils::SysRegex;
use tokenizers::{Model, Token};

use super::alphabet;
use super::split::{AsciiSplit, GPT2_SPLIT};
use crate::remembered::Remembered;

/// How many pre-tokens are remembered (a few MiB at most).
const WORDS: NonZeroUsize = NonZeroUsize::new(1 << 16).expect("nonzero");

/// The longest pre-token remembered, in bytes: longer ones are rare and rarely recur.
const LONGEST_WORD: usize = 64;

/// A byte-level BPE pipeline's encoder for the texts its pipeline treats plainly.
pub(crate) struct ByteLevelBpe {
    /// The pre-tokenizer's pattern.
    pattern: String,
    regex: SysRegex,
    /// The pattern scanned by hand on ASCII text, when it is one kart knows.
    ascii: Option<AsciiSplit>,
    /// The ids of pre-tokens seen before: a cached lookup in the BPE model still builds a
    /// `String` per token and hashes the pre-token mapped to GPT-2's alphabet.
    words: Remembered,
    /// The character each byte stands for in the model's vocabulary.
    alphabet: [char; 256],
    /// Whether a normaliser (NFC) runs first: then only ASCII text is taken.
    normalized: bool,
    /// The added tokens' contents, found leftmost-longest as the pipeline cuts a text at them.
    added: AhoCorasick,
    /// The id of each of `added`'s patterns.
    added_ids: Vec<u32>,
    /// Whether every added token is cut out as it is (not normalised, stripping no space, not
    /// only as a whole word, special ones not encoded as text); else a text holding one is left
    /// to the pipeline.
    added_plain: bool,
}

impl ByteLevelBpe {
    /// The encoder of `backend`, when its pipeline is byte-level BPE: a BPE model without
    /// dropout; NFC or no normaliser; GPT-2's `ByteLevel` pre-tokenizer with its regex, or an
    /// isolating `Split` on a regex before a `ByteLevel` without one; no prefix space; no
    /// truncation or padding.
    pub(crate) fn new(backend: &tokenizers::Tokenizer) -> Option<ByteLevelBpe> {
        let normalized = match backend.get_normalizer() {
            None => false,
            Some(NormalizerWrapper::NFC(_)) => true,
            Some(_) => return None,
        };
        let bpe =
            matches!(backend.get_model(), ModelWrapper::BPE(bpe) if bpe.dropout.is_none_or(|p| p == 0.0));
        let plain = backend.get_truncation().is_none() && backend.get_padding().is_none();
        if !bpe || !plain {
            return None;
        }
        let pattern = split_pattern(&serde_json::to_value(backend.get_pre_tokenizer()?).ok()?)?;
        let regex = SysRegex::new(&pattern).ok()?;
        let mut tokens: Vec<_> = backend.get_added_tokens_decoder().into_iter().collect();
        tokens.sort_unstable_by_key(|&(id, _)| id);
        let added = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(_, token)| token.content.as_str()))
            .ok()?;
        let added_plain = !backend.get_encode_special_tokens()
            && tokens.iter().all(|(_, t)| !t.normalized && !t.lstrip && !t.rstrip && !t.single_word);
        let added_ids = tokens.iter().map(|&(id, _)| id).collect();
        Some(ByteLevelBpe {
            ascii: AsciiSplit::of(&pattern),
            pattern,
            regex,
            words: Remembered::new(WORDS, LONGEST_WORD),
            alphabet: alphabet(),
            normalized,
            added,
            added_ids,
            added_plain,
        })
    }

    /// The pre-tokenizer's pattern.
    pub(crate) fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The ids `backend.encode(text, false)` gives, or `None` for a text left to the pipeline.
    pub(crate) fn encode(
        &self,
        backend: &tokenizers::Tokenizer,
        text: &str,
    ) -> Option<tokenizers::Result<Vec<u32>>> {
        let ModelWrapper::BPE(bpe) = backend.get_model() else { return None };
        if (self.normalized && !text.is_ascii()) || (!self.added_plain && self.added.is_match(text)) {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut from = 0;
        for found in self.added.find_iter(text) {
            if let Err(e) = self.encode_between(bpe, &text[from..found.start()], &mut ids) {
                return Some(Err(e));
            }
            ids.push(self.added_ids[found.pattern().as_usize()]);
            from = found.end();
        }
        Some(self.encode_between(bpe, &text[from..], &mut ids).map(|()| ids))
    }

    /// Appends the ids of `text`, which holds no added token, split, mapped and tokenised.
    fn encode_between(&self, bpe: &BPE, text: &str, ids: &mut Vec<u32>) -> tokenizers::Result<()> {
        let mut mapped = String::new();
        let tokenize = |part: &str| -> tokenizers::Result<Vec<u32>> {
            mapped.clear();
            mapped.extend(part.bytes().map(|b| self.alphabet[usize::from(b)]));
            Ok(bpe.tokenize(&mapped)?.iter().map(|token: &Token| token.id).collect())
        };
        match self.ascii.filter(|_| text.is_ascii()) {
            Some(split) => self.words.encode(split.split(text), tokenize, ids),
            None => self.words.encode(regex_parts(&self.regex, text).into_iter(), tokenize, ids),
        }
    }
}

/// The parts an isolating split on `regex` cuts `text` into: the matches and what lies between.
fn regex_parts<'t>(regex: &SysRegex, text: &'t str) -> Vec<&'t str> {
    let mut parts = Vec::new();
    let mut from = 0;
    for (start, end) in regex.find_iter(text) {
        if from < start {
            parts.push(&text[from..start]);
        }
        parts.push(&text[start..end]);
        from = end;
    }
    if from < text.len() {
        parts.push(&text[from..]);
    }
    parts
}

/// The regex a byte-level pre-tokenizer splits with: GPT-2's `ByteLevel` with its regex, or a
/// `Sequence` of an isolating `Split` on a regex and a `ByteLevel` without one; never a prefix
/// space.
fn split_pattern(pre: &Value) -> Option<String> {
    let byte_level = |p: &Value, regex: bool| {
        p["type"] == "ByteLevel" && p["add_prefix_space"] == false && p["use_regex"] == regex
    };
    let split = |p: &Value| {
        let isolated = p["type"] == "Split" && p["behavior"] == "Isolated" && p["invert"] == false;
        isolated.then(|| p["pattern"]["Regex"].as_str().map(String::from)).flatten()
    };
    match (pre["type"].as_str(), pre["pretokenizers"].as_array().map(Vec::as_slice)) {
        (Some("ByteLevel"), _) => byte_level(pre, true).then(|| GPT2_SPLIT.to_string()),
        (Some("Sequence"), Some([first, second])) if byte_level(second, false) => split(first),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;
    use crate::testing::{ascii_texts, byte_level_pipelines, split_pipelines, texts};
    use tokenizers::normalizers::Lowercase;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::metaspace::Metaspace;
    use tokenizers::{AddedToken, TruncationParams};

    /// Every text `encode` gives the pipeline's ids, and the plain ones go through this encoder.
    fn agree_with_the_pipeline(tokenizer: &Tokenizer, what: &str) {
        let backend = tokenizer.backend();
        let lean = ByteLevelBpe::new(backend).unwrap_or_else(|| panic!("{what}: a byte-level pipeline"));
        let mut taken = 0;
        for text in texts(1500).into_iter().chain(ascii_texts(1500)) {
            let pipeline = backend.encode(text.as_str(), false).unwrap().get_ids().to_vec();
            if let Some(ids) = lean.encode(backend, &text) {
                assert_eq!(ids.unwrap(), pipeline, "{what}: {text:?}");
                taken += 1;
            }
            assert_eq!(tokenizer.encode(&text, false).unwrap(), pipeline, "{what}: {text:?}");
        }
        assert!(taken > 300, "{what}: only {taken} texts taken");
    }

    #[test]
    fn encodes_as_the_pipeline_does() {
        for (tokenizer, what) in byte_level_pipelines() {
            agree_with_the_pipeline(&tokenizer, what);
        }
    }

    #[test]
    fn texts_the_pipeline_treats_otherwise_are_left_to_it() {
        let qwen2 = split_pipelines().remove(0);
        let backend = qwen2.backend();
        let lean = ByteLevelBpe::new(backend).unwrap();
        assert!(lean.normalized, "Qwen2 normalises with NFC");
        for text in ["Zürich", "e\u{301}", "\u{a0}"] {
            assert!(lean.encode(backend, text).is_none(), "{text:?}");
        }
        // Added tokens cut out as they are: special ones and added words.
        // The longest of added words that start alike is cut out, as the pipeline cuts it.
        let qwen2 = qwen2.with_added_words(&["Pa", "Parisian"]).unwrap();
        let backend = qwen2.backend();
        let lean = ByteLevelBpe::new(backend).unwrap();
        for text in ["a <|im_end|>\n", "in 1952", "Paris<|im_start|><|im_end|>", "Parisian Pa Pari"] {
            let pipeline = backend.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(lean.encode(backend, text).unwrap().unwrap(), pipeline, "{text:?}");
        }
        // An added token that strips the spaces before it: a text holding it goes to the pipeline.
        let mut stripping = backend.clone();
        stripping.add_special_tokens([AddedToken::from("<tool>", true).lstrip(true)]).unwrap();
        let lean = ByteLevelBpe::new(&stripping).unwrap();
        assert!(lean.encode(&stripping, "call  <tool>").is_none());
        assert!(lean.encode(&stripping, "plain ASCII, 1953.\n").is_some());
    }

    /// A change to a pipeline.
    type Edit = fn(&mut tokenizers::Tokenizer);

    #[test]
    fn other_pipelines_have_no_byte_level_encoder() {
        let fixture = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap();
        let edits: [(&str, Edit); 4] = [
            ("a prefix space", |t| {
                t.with_pre_tokenizer(Some(ByteLevel::new(true, true, true)));
            }),
            ("a Metaspace pre-tokenizer", |t| {
                t.with_pre_tokenizer(Some(Metaspace::default()));
            }),
            ("a lowercasing normaliser", |t| {
                t.with_normalizer(Some(Lowercase)).unwrap();
            }),
            ("truncation", |t| {
                t.with_truncation(Some(TruncationParams::default())).unwrap();
            }),
        ];
        assert!(ByteLevelBpe::new(fixture.backend()).is_some());
        for (what, edit) in edits {
            let mut backend = fixture.backend().clone();
            edit(&mut backend);
            assert!(ByteLevelBpe::new(&backend).is_none(), "{what}");
        }
    }
}
