//! `Tokenizer::encode` and `Tokenizer::encode_cached` on any text give the ids of the `tokenizers`
//! pipeline, the first time and from memory, and `Tokenizer::decode` gives the pipeline's text of
//! those ids (special tokens kept and skipped): on the fixture Qwen2 tokenizer (GPT-2's byte-level
//! pre-tokenizer) and on one trained with Qwen2's split pattern and NFC, whose merges join line
//! breaks to what surrounds them.
#![no_main]

use kart_tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// kart's tokenizer of a folder and the `tokenizers` pipeline of its `tokenizer.json`.
fn both(dir: &Path) -> (Tokenizer, tokenizers::Tokenizer) {
    let pipeline = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("the pipeline");
    (Tokenizer::load(dir).expect("the tokenizer"), pipeline)
}

static TOKENIZERS: LazyLock<[(Tokenizer, tokenizers::Tokenizer); 2]> = LazyLock::new(|| {
    let fixture = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/models/tiny-qwen2"));
    let corpus = [
        "the quick brown fox\nDoc 1 is 1952.\n\n",
        "a search agent reads the page.\n\nDoc 2 \n  Paris\n\n\n",
        "Zürich 北京 'll \r\n\t\n<|im_end|>\n",
    ];
    let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let trained = Tokenizer::train_byte_level_bpe(
        corpus.iter().cycle().take(300).copied(),
        320,
        &special,
        "<|im_end|>",
        "<|endoftext|>",
    )
    .expect("a trained tokenizer");
    let dir = std::env::temp_dir().join(format!("kart-fuzz-tokenizer-pieces-{}", std::process::id()));
    trained.save(&dir, None).expect("saving the trained tokenizer");
    [both(&fixture), both(&dir)]
});

fuzz_target!(|text: &str| {
    for (tokenizer, pipeline) in TOKENIZERS.iter() {
        let whole = pipeline.encode(text, false).expect("any text encodes").get_ids().to_vec();
        assert_eq!(tokenizer.encode(text, false).expect("any text encodes"), whole, "{text:?}");
        for round in ["encoded", "remembered"] {
            assert_eq!(tokenizer.encode_cached(text).expect("any text encodes"), whole, "{round}: {text:?}");
        }
        for skip in [false, true] {
            let decoded = pipeline.decode(&whole, skip).expect("ids decode");
            assert_eq!(tokenizer.decode(&whole, skip).expect("ids decode"), decoded, "skip {skip}: {text:?}");
        }
    }
});
