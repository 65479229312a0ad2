//! `Tokenizer::encode_cached` on any text gives the ids of encoding the whole text, the first time
//! and from memory: on the fixture Qwen2 tokenizer (GPT-2's byte-level pre-tokenizer) and on one
//! trained with Qwen2's split pattern, whose merges join line breaks to what surrounds them.
#![no_main]

use kart_tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static TOKENIZERS: LazyLock<[Tokenizer; 2]> = LazyLock::new(|| {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/models/tiny-qwen2");
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
    [Tokenizer::load(fixture).expect("the fixture tokenizer"), trained]
});

fuzz_target!(|text: &str| {
    for tokenizer in TOKENIZERS.iter() {
        let whole = tokenizer.encode(text, false).expect("any text encodes");
        for round in ["encoded", "remembered"] {
            assert_eq!(tokenizer.encode_cached(text).expect("any text encodes"), whole, "{round}: {text:?}");
        }
    }
});
