//! Texts and tokenizers the differential tests of this crate share.

use crate::Tokenizer;

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
pub(crate) fn texts(n: usize) -> Vec<String> {
    random_texts(n, &FRAGMENTS)
}

/// Random texts of the ASCII fragments only, which normalising pipelines leave as they are.
pub(crate) fn ascii_texts(n: usize) -> Vec<String> {
    let ascii: Vec<&str> = FRAGMENTS.into_iter().filter(|f| f.is_ascii()).collect();
    random_texts(n, &ascii)
}

/// Random texts of 1 to 24 of `fragments`.
pub(crate) fn random_texts(n: usize, fragments: &[&str]) -> Vec<String> {
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| {
            let len = 1 + next() % 24;
            (0..len).map(|_| fragments[(next() % fragments.len() as u64) as usize]).collect()
        })
        .collect()
}

/// Random runs of ids over a vocabulary of `vocab` and past it: single bytes that are not
/// characters alone, special tokens, added words, unknown ids.
pub(crate) fn id_runs(vocab: u32, n: usize) -> Vec<Vec<u32>> {
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    (0..n).map(|_| (0..next() % 40).map(|_| (next() % u64::from(vocab + 8)) as u32).collect()).collect()
}

/// A fixed xorshift generator, so that failures reproduce.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// The byte-level pipelines the differential tests run on, named: the fixtures' (GPT-2's
/// pre-tokenizer) and [`split_pipelines`].
pub(crate) fn byte_level_pipelines() -> Vec<(Tokenizer, &'static str)> {
    let fixtures = ["tiny-qwen2", "tiny-qwen3"]
        .map(|model| (Tokenizer::load(kart_testing::model(model)).unwrap(), model));
    fixtures
        .into_iter()
        .chain(split_pipelines().into_iter().zip(["Qwen2's split", "Llama 3's split"]))
        .collect()
}

/// Qwen2's pipeline as kart trains it, with added words, and Llama 3's split pattern on it.
pub(crate) fn split_pipelines() -> Vec<Tokenizer> {
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
