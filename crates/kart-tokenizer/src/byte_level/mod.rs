//! Byte-level BPE without the pipeline's bookkeeping.
//!
//! `tokenizers` carries every text through `NormalizedString`s that track each byte's alignment
//! to the input, for offsets a rollout never reads, and decodes through a `String` per token; in a
//! rollout worker that was most of the tokenizer's time. For the byte-level BPE family (GPT-2's
//! pre-tokenizer, or a `Split` on a regex before a plain `ByteLevel`, as Qwen2's and Llama 3's
//! `tokenizer.json` have), [`ByteLevelBpe`] gives the ids of `encode(text, false)` from the same
//! parts: the pre-tokenizer's regex, compiled by the same engine, splits the text (on ASCII text
//! the patterns of GPT-2, Qwen2 and Llama 3 are scanned by hand, [`split`]); each part's bytes are
//! mapped to GPT-2's byte alphabet; the pipeline's own BPE model (its merges, its cache) tokenises
//! each part not seen recently (the ids of short ones are remembered). Texts the pipeline would
//! treat otherwise are left to it: a text holding an added token's content, and a text that is
//! not ASCII under a normaliser (NFC leaves ASCII as it is). [`ByteLevelDecoder`] decodes as
//! GPT-2's byte-level decoder does, from each token's bytes computed once.

mod decoder;
mod encoder;
mod split;

pub(crate) use decoder::ByteLevelDecoder;
pub(crate) use encoder::ByteLevelBpe;
pub(crate) use split::{GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT};

/// GPT-2's map of bytes to printable characters (`bytes_to_unicode` of its `encoder.py`): the
/// printable Latin-1 bytes stand for themselves, the others, in order, for 256, 257, ...
pub(crate) fn alphabet() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut alphabet = ['\0'; 256];
    let mut next = 256;
    for b in 0..=255u8 {
        alphabet[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("256 to 323 are characters")
        };
    }
    alphabet
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    #[test]
    fn bytes_map_to_the_characters_the_pipeline_maps_them_to() {
        let ours = alphabet();
        assert_eq!(ours.iter().copied().collect::<std::collections::HashSet<_>>().len(), 256);
        assert!(ours.iter().all(|c| ByteLevel::alphabet().contains(c)));
        // Every byte a string can hold: ASCII, every lead and continuation byte of two-byte
        // characters, and the lead bytes of three- and four-byte ones.
        let text: String = (0u32..0x800)
            .chain((0xE0..=0xEF).map(|lead| ((lead - 0xE0) << 12) | 0x800))
            .chain((0xF0..=0xF4).map(|lead| ((lead - 0xF0) << 18) | 0x10000))
            .filter_map(char::from_u32)
            .collect();
        let mut pre = PreTokenizedString::from(text.as_str());
        ByteLevel::new(false, false, false).pre_tokenize(&mut pre).unwrap();
        let theirs: String = pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(part, ..)| part)
            .collect();
        let mapped: String = text.bytes().map(|b| ours[usize::from(b)]).collect();
        assert_eq!(mapped, theirs);
    }
}
