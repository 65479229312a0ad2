//! The decoder: each token's bytes computed once, as GPT-2's byte-level decoder maps them.

use std::collections::HashMap;

use tokenizers::DecoderWrapper;

use super::alphabet;

/// Decodes as a pipeline whose decoder is `ByteLevel` does: each id's token (an added token's
/// content or the model's), the special ones left out when asked, each token's characters mapped
/// back to bytes (a token with a character outside the byte alphabet taken as its own UTF-8), the
/// bytes read as UTF-8 with U+FFFD for what is not.
pub(crate) struct ByteLevelDecoder {
    /// Every token's bytes, one after another.
    bytes: Vec<u8>,
    /// Each id's token: where its bytes are in `bytes`; `None` for an id with no token.
    tokens: Vec<Option<Token>>,
}

#[derive(Clone, Copy)]
struct Token {
    start: u32,
    end: u32,
    special: bool,
}

impl ByteLevelDecoder {
    /// The decoder of `backend`, when its decoder is GPT-2's byte-level one.
    pub(crate) fn new(backend: &tokenizers::Tokenizer) -> Option<ByteLevelDecoder> {
        if !matches!(backend.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let chars: HashMap<char, u8> = alphabet().into_iter().zip(0..=255).collect();
        let last = backend.get_vocab(true).into_values().max()?;
        let mut bytes = Vec::new();
        let mut tokens = Vec::with_capacity(last as usize + 1);
        for id in 0..=last {
            tokens.push(backend.id_to_token(id).map(|token| {
                let start = bytes.len();
                match token.chars().map(|c| chars.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                    Some(mapped) => bytes.extend_from_slice(&mapped),
                    None => bytes.extend_from_slice(token.as_bytes()),
                }
                let special = backend.get_added_vocabulary().is_special_token(&token);
                Token { start: start as u32, end: bytes.len() as u32, special }
            }));
        }
        Some(ByteLevelDecoder { bytes, tokens })
    }

    /// The text of `ids`, as `backend.decode(ids, skip_special_tokens)` gives it.
    pub(crate) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if let Some(Some(token)) = self.tokens.get(id as usize)
                && !(skip_special_tokens && token.special)
            {
                bytes.extend_from_slice(&self.bytes[token.start as usize..token.end as usize]);
            }
        }
        String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;
    use crate::testing::{byte_level_pipelines, id_runs, split_pipelines};

    fn agree_with_the_pipeline(tokenizer: &Tokenizer, what: &str) {
        let backend = tokenizer.backend();
        let decoder =
            ByteLevelDecoder::new(backend).unwrap_or_else(|| panic!("{what}: a byte-level decoder"));
        for ids in id_runs(backend.get_vocab_size(true) as u32, 3000) {
            for skip in [false, true] {
                let pipeline = backend.decode(&ids, skip).unwrap();
                assert_eq!(decoder.decode(&ids, skip), pipeline, "{what}, skip {skip}: {ids:?}");
                assert_eq!(tokenizer.decode(&ids, skip).unwrap(), pipeline, "{what}, skip {skip}: {ids:?}");
            }
        }
    }

    #[test]
    fn decodes_as_the_pipeline_does() {
        for (tokenizer, what) in byte_level_pipelines() {
            agree_with_the_pipeline(&tokenizer, what);
        }
        // An added token whose characters are not all in the byte alphabet decodes as its text.
        let tokenizer = split_pipelines().remove(0).with_added_words(&["two words", "naïve"]).unwrap();
        agree_with_the_pipeline(&tokenizer, "added words with a space and a diaeresis");
    }

    #[test]
    fn other_decoders_are_left_to_the_pipeline() {
        let mut backend = Tokenizer::load(kart_testing::model("tiny-qwen2")).unwrap().backend().clone();
        backend.with_decoder(Some(tokenizers::decoders::bpe::BPEDecoder::default()));
        assert!(ByteLevelDecoder::new(&backend).is_none());
    }
}
