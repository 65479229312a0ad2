//! `normalize_answer` of the SQuAD/Search-R1 evaluation scripts, with Python's string semantics.
//!
//! Upstream runs, in order: `str.lower`, removal of the ASCII characters of `string.punctuation`,
//! `re.sub(r"\b(a|an|the)\b", " ", …)` with Unicode word boundaries, and `" ".join(text.split())`.
//! Python's `\w` is `str.isalnum()` or `_` (letters and numbers, not combining marks), and
//! `str.split()` splits on Unicode white space plus the separators U+001C..U+001F.

use regex::Regex;
use std::sync::LazyLock;

/// A maximal run of Python word characters (`[\p{L}\p{N}_]`): articles are whole runs.
static WORD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"[\p{L}\p{N}_]+").expect("valid regex"));

/// Python's `str.isspace()` for one character.
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` with no arguments: trims [`is_python_space`] characters at both ends.
pub fn python_strip(s: &str) -> &str {
    s.trim_matches(is_python_space)
}

/// Python's `str.split()` with no arguments.
pub fn python_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_python_space).filter(|w| !w.is_empty())
}

/// Whether `c` is in Python's `string.punctuation` (ASCII only).
pub fn is_ascii_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
}

/// Lower-cases, drops ASCII punctuation, replaces the articles a/an/the by a space and collapses
/// white space, exactly as upstream's `normalize_answer`.
pub fn normalize_answer(s: &str) -> String {
    let lowered = s.to_lowercase();
    let no_punct: String = lowered.chars().filter(|&c| !is_ascii_punctuation(c)).collect();
    let no_articles = WORD.replace_all(&no_punct, |m: &regex::Captures<'_>| match &m[0] {
        "a" | "an" | "the" => " ".to_string(),
        w => w.to_string(),
    });
    python_split(&no_articles).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases_strips_punctuation_and_articles() {
        assert_eq!(normalize_answer("The  Eiffel Tower!"), "eiffel tower");
        assert_eq!(normalize_answer("an apple, a pear"), "apple pear");
    }

    #[test]
    fn articles_only_as_whole_words() {
        assert_eq!(normalize_answer("theater anthem a1"), "theater anthem a1");
        // Punctuation is removed before articles, so "the-end" becomes one word "theend".
        assert_eq!(normalize_answer("the-end"), "theend");
        // Underscore is punctuation in Python too, so it joins words before the article pass.
        assert_eq!(normalize_answer("a_b"), "ab");
    }

    #[test]
    fn non_ascii_punctuation_is_kept() {
        assert_eq!(normalize_answer("«Paris»"), "«paris»");
        assert_eq!(normalize_answer("Zürich—Bern"), "zürich—bern");
    }

    #[test]
    fn unicode_word_boundaries() {
        // 'é' is a word character, so "theé" is one word; a combining mark is not, so it ends one.
        assert_eq!(normalize_answer("theé"), "theé");
        assert_eq!(normalize_answer("the\u{301}"), "\u{301}");
        // Dotted capital I lowers to 'i' + U+0307 (full case mapping).
        assert_eq!(normalize_answer("İ"), "i\u{307}");
    }

    #[test]
    fn python_whitespace_includes_information_separators() {
        assert_eq!(normalize_answer("a\u{1c}b\u{85}c\u{2003}d"), "b c d");
        assert_eq!(normalize_answer("x\u{200b}y"), "x\u{200b}y");
    }

    #[test]
    fn python_strip_trims_python_white_space_only() {
        assert_eq!(python_strip("\u{1f}\u{85}\u{3000} a b \t\n"), "a b");
        assert_eq!(python_strip("\u{200b}a\u{200b}"), "\u{200b}a\u{200b}");
        assert_eq!(python_strip(" \u{1c} "), "");
    }

    #[test]
    fn empty_and_blank() {
        assert_eq!(normalize_answer(""), "");
        assert_eq!(normalize_answer("  the  "), "");
    }
}
