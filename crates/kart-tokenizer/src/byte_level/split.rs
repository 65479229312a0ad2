//! Pre-tokens of ASCII text for the patterns of GPT-2, Qwen2 and Llama 3, without a regex engine.
//!
//! Oniguruma searching these patterns was a third of a byte-level encode in a rollout worker. On
//! ASCII text each pattern reduces to a few character classes (`\s` is tab to carriage return and
//! space, `\p{L}` the letters, `\p{N}` the digits), so [`AsciiSplit`] scans it in one pass, taking
//! at each position the first alternative that matches as the backtracking engine does, with the
//! same greedy lengths. Every character matches some alternative, so the pre-tokens tile the text;
//! other texts and patterns stay with the regex.

/// GPT-2's pre-tokenizer pattern: the `ByteLevel` pre-tokenizer's own, with `use_regex`.
pub(crate) const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenizer pattern (a `Split` before a `ByteLevel` without its regex), which kart
/// also trains its own tokenizers with.
pub(crate) const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's: Qwen2's with runs of up to three digits.
pub(crate) const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer pattern scanned by hand on ASCII text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AsciiSplit {
    /// [`GPT2_SPLIT`].
    Gpt2,
    /// [`QWEN2_SPLIT`] (`max_digits` 1) or [`LLAMA3_SPLIT`] (3).
    LineSafe { max_digits: usize },
}

impl AsciiSplit {
    /// The scanner of `pattern`, when it is one of the three.
    pub(crate) fn of(pattern: &str) -> Option<AsciiSplit> {
        match pattern {
            GPT2_SPLIT => Some(AsciiSplit::Gpt2),
            QWEN2_SPLIT => Some(AsciiSplit::LineSafe { max_digits: 1 }),
            LLAMA3_SPLIT => Some(AsciiSplit::LineSafe { max_digits: 3 }),
            _ => None,
        }
    }

    /// The pre-tokens of `text`, which must be ASCII, in order; together they are `text`.
    pub(crate) fn split(self, text: &str) -> impl Iterator<Item = &str> {
        debug_assert!(text.is_ascii());
        let bytes = text.as_bytes();
        let mut start = 0;
        std::iter::from_fn(move || {
            if start == bytes.len() {
                return None;
            }
            let end = match self {
                AsciiSplit::Gpt2 => gpt2_end(bytes, start),
                AsciiSplit::LineSafe { max_digits } => line_safe_end(bytes, start, max_digits),
            };
            let piece = &text[start..end];
            start = end;
            Some(piece)
        })
    }
}

/// `\s` on ASCII: tab, line feed, vertical tab, form feed, carriage return, space.
fn space(b: u8) -> bool {
    matches!(b, b'\t'..=b'\r' | b' ')
}

/// `[^\s\p{L}\p{N}]` on ASCII.
fn other(b: u8) -> bool {
    !space(b) && !b.is_ascii_alphanumeric()
}

/// Where the run of bytes satisfying `class` from `from` ends.
fn run(bytes: &[u8], from: usize, class: impl Fn(u8) -> bool) -> usize {
    bytes[from..].iter().position(|&b| !class(b)).map_or(bytes.len(), |n| from + n)
}

/// The length of the contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at `at`, if any.
fn contraction(bytes: &[u8], at: usize, ignore_case: bool) -> Option<usize> {
    let rest = &bytes[at..];
    let fold = |b: u8| if ignore_case { b.to_ascii_lowercase() } else { b };
    match rest {
        [b'\'', a, b, ..] if matches!((fold(*a), fold(*b)), (b'r' | b'v', b'e') | (b'l', b'l')) => Some(3),
        [b'\'', a, ..] if matches!(fold(*a), b's' | b't' | b'm' | b'd') => Some(2),
        _ => None,
    }
}

/// The end of a whitespace run's match at `start` by `\s+(?!\S)|\s+`: the run but its last
/// character when a non-space follows and the run is longer than one.
fn trailing_space_end(bytes: &[u8], start: usize) -> usize {
    let end = run(bytes, start, space);
    if end < bytes.len() && end - start > 1 { end - 1 } else { end }
}

/// The end of GPT-2's pre-token at `start`.
fn gpt2_end(bytes: &[u8], start: usize) -> usize {
    if let Some(n) = contraction(bytes, start, false) {
        return start + n;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space before a run of one class.
    let first = if bytes[start] == b' ' { start + 1 } else { start };
    if let Some(&b) = bytes.get(first) {
        let class: Option<fn(u8) -> bool> = if b.is_ascii_alphabetic() {
            Some(|b| b.is_ascii_alphabetic())
        } else if b.is_ascii_digit() {
            Some(|b| b.is_ascii_digit())
        } else if other(b) {
            Some(other)
        } else {
            None
        };
        if let Some(class) = class {
            return run(bytes, first, class);
        }
    }
    trailing_space_end(bytes, start)
}

/// The end of Qwen2's (or Llama 3's) pre-token at `start`.
fn line_safe_end(bytes: &[u8], start: usize, max_digits: usize) -> usize {
    if let Some(n) = contraction(bytes, start, true) {
        return start + n;
    }
    let b = bytes[start];
    let next = bytes.get(start + 1).copied();
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if b.is_ascii_alphabetic() {
        return run(bytes, start, |b| b.is_ascii_alphabetic());
    }
    let newline = |b: u8| b == b'\r' || b == b'\n';
    if !newline(b) && !b.is_ascii_digit() && next.is_some_and(|n| n.is_ascii_alphabetic()) {
        return run(bytes, start + 1, |b| b.is_ascii_alphabetic());
    }
    // `\p{N}` or `\p{N}{1,3}`
    if b.is_ascii_digit() {
        return run(bytes, start, |b| b.is_ascii_digit()).min(start + max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let first = if b == b' ' && next.is_some_and(other) { start + 1 } else { start };
    if other(bytes[first]) {
        return run(bytes, run(bytes, first, other), newline);
    }
    // `\s*[\r\n]+`: the whitespace run up to its last line break, else `\s+(?!\S)|\s+`.
    let end = run(bytes, start, space);
    match bytes[start..end].iter().rposition(|&b| newline(b)) {
        Some(last) => start + last + 1,
        None => trailing_space_end(bytes, start),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ascii_texts, random_texts};
    use tokenizers::utils::SysRegex;

    /// ASCII fragments of every class the patterns tell apart, weighted to the seams: quotes
    /// before contractions in both cases, runs of each space, digits, control bytes.
    const CLASSES: [&str; 26] = [
        "'",
        "s",
        "S",
        "re",
        "RE",
        "ve",
        "ll",
        "LL",
        "m",
        "d",
        "t",
        "a",
        "Zq",
        " ",
        "  ",
        "\t",
        "\n",
        "\r",
        "\x0b",
        "\x0c",
        "7",
        "123",
        "45678",
        ".",
        "?!",
        "\x00\x1f\x7f",
    ];

    #[test]
    fn splits_ascii_text_as_the_regex_does() {
        let texts: Vec<String> = random_texts(5000, &CLASSES).into_iter().chain(ascii_texts(2000)).collect();
        for pattern in [GPT2_SPLIT, QWEN2_SPLIT, LLAMA3_SPLIT] {
            let split = AsciiSplit::of(pattern).unwrap();
            let regex = SysRegex::new(pattern).unwrap();
            for text in &texts {
                let theirs: Vec<&str> = regex.find_iter(text).map(|(start, end)| &text[start..end]).collect();
                assert_eq!(theirs.concat(), *text, "the regex tiles {text:?}");
                let ours: Vec<&str> = split.split(text).collect();
                assert_eq!(ours, theirs, "{pattern}: {text:?}");
            }
        }
    }

    #[test]
    fn other_patterns_have_no_scanner() {
        assert_eq!(AsciiSplit::of(LLAMA3_SPLIT), Some(AsciiSplit::LineSafe { max_digits: 3 }));
        assert_eq!(AsciiSplit::of(r"\s+|\S+"), None);
        assert_eq!(AsciiSplit::of(&GPT2_SPLIT.replace("'d|", "")), None);
    }
}
