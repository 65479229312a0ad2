//! Invented, pronounceable names built from syllable tables.
//!
//! A word is syllables of an onset and a vowel (the first possibly closed by a consonant) ending
//! in one of [`FINALS`]. The finals avoid the endings English stemmers strip (`-s`, `-e`, `-y`,
//! `-ed`, `-er`, `-al`, `-ing`, …), so BM25 keeps every name as one term of its own. Every word
//! the [`Namer`] hands out is distinct from all earlier ones, whatever they name.

use super::rng::Rng;
use std::collections::HashSet;

const ONSETS: [&str; 22] = [
    "b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "v",
    "z", "sh",
];
const VOWELS: [&str; 5] = ["a", "e", "i", "o", "u"];
const CODAS: [&str; 8] = ["", "", "l", "n", "r", "s", "m", "k"];
const FINALS: [&str; 30] = [
    "a", "o", "an", "en", "in", "on", "ar", "or", "ur", "ik", "ak", "ek", "ok", "ath", "eth", "ov", "av",
    "ax", "ex", "am", "om", "el", "il", "ol", "ad", "od", "und", "ask", "esk", "orn",
];

/// Hands out distinct capitalised words.
pub(crate) struct Namer {
    rng: Rng,
    used: HashSet<String>,
}

impl Namer {
    pub(crate) fn new(rng: Rng) -> Self {
        Namer { rng, used: HashSet::new() }
    }

    /// A new word of `syllables` syllables (at least 2); one more syllable is used when the space
    /// of that length is crowded.
    pub(crate) fn word(&mut self, syllables: usize) -> String {
        let mut syllables = syllables.max(2);
        let mut attempts = 0;
        loop {
            let word = self.draw(syllables);
            if self.used.insert(word.clone()) {
                return word;
            }
            attempts += 1;
            if attempts % 64 == 0 {
                syllables += 1;
            }
        }
    }

    fn draw(&mut self, syllables: usize) -> String {
        let rng = &mut self.rng;
        let mut word = String::new();
        for i in 0..syllables - 1 {
            word.push_str(rng.pick(&ONSETS));
            word.push_str(rng.pick(&VOWELS));
            if i == 0 {
                word.push_str(rng.pick(&CODAS));
            }
        }
        word.push_str(rng.pick(&ONSETS));
        word.push_str(rng.pick(&FINALS));
        let mut chars = word.chars();
        chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
    }

    /// `n` new words of `syllables` syllables.
    pub(crate) fn words(&mut self, n: usize, syllables: usize) -> Vec<String> {
        (0..n).map(|_| self.word(syllables)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_capitalised_and_stemmer_safe() {
        let mut namer = Namer::new(Rng::stream(5, "names"));
        let words = namer.words(5000, 2);
        let distinct: HashSet<&String> = words.iter().collect();
        assert_eq!(distinct.len(), words.len());
        for w in &words {
            assert!(w.chars().next().unwrap().is_ascii_uppercase(), "{w}");
            assert!(w.chars().all(|c| c.is_ascii_alphabetic()), "{w}");
            let lower = w.to_lowercase();
            for ending in ["s", "e", "y", "i", "ed", "er", "al", "ing", "ll", "t"] {
                assert!(!lower.ends_with(ending), "{w} ends with {ending}");
            }
        }
        let again = Namer::new(Rng::stream(5, "names")).words(100, 2);
        assert_eq!(again, words[..100]);
    }
}
