//! ASearcher's rule-based rewards, with the semantics of upstream `ASearcher/utils/rewards.py`.
//!
//! Differences from Search-R1 that these functions reproduce:
//! - [`extract_solution`] takes the last `<answer>…</answer>` and one match suffices, so under a
//!   prompt with an example answer (` Beijing `) a response without an answer of its own is scored
//!   as answering the example.
//! - Predictions and golden answers go through [`bool_mapping`] first (`True` -> `yes`,
//!   `False` -> `no`, exact strings only).
//! - [`f1_score`] normalises with its own [`normalize_text`] (punctuation becomes a space, articles
//!   stay) and compares token *sets*; when the golden answer contains CJK ideographs it compares sets
//!   of characters plus runs of digits instead.
//!
//! Every `compute_*` function scores a response against several golden answers and keeps the best
//! score. Upstream raises `ValueError` on an empty list of golden answers (`max([])`); kart scores it
//! 0, since no answer can match.

use crate::reward::normalize::{normalize_answer, python_split, python_strip};
use regex::Regex;
use std::collections::HashSet;
use std::sync::LazyLock;

/// Upstream's `<answer>(.*?)</answer>` (DOTALL).
static ANSWER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<answer>(.*?)</answer>").expect("valid regex"));

/// A maximal run of characters for which Python's `str.isdigit()` holds: decimal digits (`Nd`) and
/// the characters of numeric type Digit (superscripts, circled digits, …; Python 3.11 tables).
static DIGIT_RUN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"[\p{Nd}\x{B2}\x{B3}\x{B9}\x{1369}-\x{1371}\x{19DA}\x{2070}\x{2074}-\x{2079}",
        r"\x{2080}-\x{2089}\x{2460}-\x{2468}\x{2474}-\x{247C}\x{2488}-\x{2490}\x{24EA}",
        r"\x{24F5}-\x{24FD}\x{24FF}\x{2776}-\x{277E}\x{2780}-\x{2788}\x{278A}-\x{2792}",
        r"\x{10A40}-\x{10A43}\x{10E60}-\x{10E68}\x{11052}-\x{1105A}\x{1F100}-\x{1F10A}]+",
    ))
    .expect("valid regex")
});

/// The characters `parse_chinese_str` drops before taking a text's characters as tokens.
const CJK_DROPPED: &str = "0123456789，。 ,.-";

/// The stripped content of the last `<answer>…</answer>` in `solution`, or `None` without one.
pub fn extract_solution(solution: &str) -> Option<&str> {
    ANSWER.captures_iter(solution).last().and_then(|c| c.get(1)).map(|m| python_strip(m.as_str()))
}

/// Maps the exact strings `True` and `False` to `yes` and `no`; anything else is returned as is.
pub fn bool_mapping(s: &str) -> &str {
    match s {
        "True" => "yes",
        "False" => "no",
        other => other,
    }
}

/// Whether `text` holds a character of the CJK Unified Ideographs, Extension A or Compatibility
/// Ideographs blocks. Upstream's check for Extensions B-F tests `len(char) > 1`, which never holds
/// in Python 3, so those characters do not count.
pub fn contains_chinese(text: &str) -> bool {
    text.chars()
        .any(|c| matches!(c, '\u{4e00}'..='\u{9fff}' | '\u{3400}'..='\u{4dbf}' | '\u{f900}'..='\u{faff}'))
}

/// Upstream's `normalize_text` (the F1 normalisation): every ASCII punctuation character becomes a
/// space, runs of white space collapse to one space, the ends are stripped, then the text is
/// lower-cased. Articles are kept.
pub fn normalize_text(text: &str) -> String {
    let spaced: String = text.chars().map(|c| if c.is_ascii_punctuation() { ' ' } else { c }).collect();
    python_split(&spaced).collect::<Vec<_>>().join(" ").to_lowercase()
}

/// Upstream's `parse_chinese_str`: the characters of `s` other than ASCII digits, `，`, `。`, space,
/// `,`, `.` and `-`, plus every maximal run of (Unicode) digits.
fn cjk_tokens(s: &str) -> HashSet<&str> {
    let chars =
        s.char_indices().filter(|&(_, c)| !CJK_DROPPED.contains(c)).map(|(i, c)| &s[i..i + c.len_utf8()]);
    chars.chain(DIGIT_RUN.find_iter(s).map(|m| m.as_str())).collect()
}

/// Token-set F1 of `answer` against one golden answer `gt`, after [`bool_mapping`] and
/// [`normalize_text`]; 0 when either side has no tokens. Tokens are white-space separated words, or
/// [`cjk_tokens`] when the normalised golden answer [`contains_chinese`].
pub fn f1_score(answer: &str, gt: &str) -> f64 {
    let answer = normalize_text(bool_mapping(answer));
    let gt = normalize_text(bool_mapping(gt));
    let (pred_tokens, gt_tokens): (HashSet<&str>, HashSet<&str>) = if contains_chinese(&gt) {
        (cjk_tokens(&answer), cjk_tokens(&gt))
    } else {
        (python_split(&answer).collect(), python_split(&gt).collect())
    };
    if gt_tokens.is_empty() || pred_tokens.is_empty() {
        return 0.0;
    }
    let common = pred_tokens.intersection(&gt_tokens).count() as f64;
    let precision = common / pred_tokens.len() as f64;
    let recall = common / gt_tokens.len() as f64;
    if precision + recall > 0.0 { 2.0 * (precision * recall) / (precision + recall) } else { 0.0 }
}

/// Upstream's `em_check` for one golden answer: equality after [`bool_mapping`] and
/// [`normalize_answer`].
pub fn em_check(prediction: &str, golden_answer: &str) -> bool {
    normalize_answer(bool_mapping(prediction)) == normalize_answer(bool_mapping(golden_answer))
}

/// Whether every word of the normalised golden answer is a word of the normalised prediction, in
/// any order (upstream's inner test of `cover_exact_match_score_1`). Words come from
/// `split(" ")`, so an empty golden answer is covered only by an empty prediction.
pub fn covers(prediction: &str, golden_answer: &str) -> bool {
    let prediction = normalize_answer(bool_mapping(prediction));
    let words: HashSet<&str> = prediction.split(' ').collect();
    normalize_answer(bool_mapping(golden_answer)).split(' ').all(|w| words.contains(w))
}

/// The best of `score(answer, golden)` over the golden answers, for the answer extracted from
/// `solution`; 0 without an answer or without golden answers.
fn best_score<S: AsRef<str>>(solution: &str, golden_answers: &[S], score: impl Fn(&str, &str) -> f64) -> f64 {
    extract_solution(solution)
        .map_or(0.0, |answer| golden_answers.iter().map(|g| score(answer, g.as_ref())).fold(0.0, f64::max))
}

/// `compute_score_em`: 1 when the extracted answer exactly matches a golden answer (see
/// [`em_check`]), else 0.
pub fn compute_score_em<S: AsRef<str>>(solution: &str, golden_answers: &[S]) -> f64 {
    best_score(solution, golden_answers, |a, g| if em_check(a, g) { 1.0 } else { 0.0 })
}

/// `compute_score_f1`: the best [`f1_score`] of the extracted answer over the golden answers.
pub fn compute_score_f1<S: AsRef<str>>(solution: &str, golden_answers: &[S]) -> f64 {
    best_score(solution, golden_answers, f1_score)
}

/// `cover_exact_match_score_1`: 1 when the extracted answer [`covers`] a golden answer, else 0.
pub fn cover_exact_match_score_1<S: AsRef<str>>(solution: &str, golden_answers: &[S]) -> f64 {
    best_score(solution, golden_answers, |a, g| if covers(a, g) { 1.0 } else { 0.0 })
}

/// Upstream's `correct_format_fn` for one model turn: balanced `search`/`access`/`answer` tags, at
/// most one of those actions, no `Assistant`/`assistant`, at most one `</think>`. The training
/// workflow multiplies the score by 0 unless every turn passes.
pub fn correct_format(turn: &str) -> bool {
    let count = |pattern: &str| turn.matches(pattern).count();
    count("<search>") == count("</search>")
        && count("<access>") == count("</access>")
        && count("<answer>") == count("</answer>")
        && count("<search>") + count("<access>") + count("<answer>") <= 1
        && count("Assistant") == 0
        && count("assistant") == 0
        && count("</think>") <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_the_last_answer_and_one_suffices() {
        assert_eq!(extract_solution("no answer here"), None);
        assert_eq!(extract_solution("x <answer> Paris </answer> y"), Some("Paris"));
        assert_eq!(extract_solution("<answer>a</answer> then <answer>\n b \n</answer>"), Some("b"));
        // Lazy match from the first opening tag: an inner opening tag stays in the answer.
        assert_eq!(extract_solution("<answer><answer>x</answer>"), Some("<answer>x"));
        // Unbalanced: an opening tag without a closing one is no answer.
        assert_eq!(extract_solution("<answer>x</answer><answer>y"), Some("x"));
        assert_eq!(extract_solution("<answer>y"), None);
        // Python's strip removes Unicode white space and the separators U+001C..U+001F.
        assert_eq!(extract_solution("<answer>\u{3000}\u{1f}z\u{a0}</answer>"), Some("z"));
    }

    #[test]
    fn booleans_map_to_yes_and_no() {
        assert_eq!(compute_score_em("<answer>yes</answer>", &["True"]), 1.0);
        assert_eq!(compute_score_em("<answer>True</answer>", &["yes"]), 1.0);
        // Only the exact strings map.
        assert_eq!(compute_score_em("<answer>true</answer>", &["False"]), 0.0);
        assert_eq!(compute_score_f1("<answer>False</answer>", &["no"]), 1.0);
    }

    #[test]
    fn em_is_the_best_over_golden_answers() {
        let s = "<answer>The Eiffel Tower!</answer>";
        assert_eq!(compute_score_em(s, &["Louvre", "eiffel tower"]), 1.0);
        assert_eq!(compute_score_em(s, &["Louvre"]), 0.0);
        assert_eq!(compute_score_em("no answer", &["x"]), 0.0);
        assert_eq!(compute_score_em(s, &[] as &[&str]), 0.0);
    }

    #[test]
    fn f1_keeps_articles_and_splits_on_punctuation() {
        // normalize_text keeps "the" and turns the hyphen into a space.
        assert_eq!(normalize_text("  The Jean-Luc,  Picard "), "the jean luc picard");
        let f1 = f1_score("the jean luc", "jean luc picard");
        assert!((f1 - 2.0 / 3.0).abs() < 1e-12, "{f1}");
        // Sets, not bags: repeated words count once.
        assert_eq!(f1_score("a a a", "a"), 1.0);
        assert_eq!(f1_score("x", "y"), 0.0);
    }

    #[test]
    fn f1_of_empty_sides_is_zero() {
        assert_eq!(f1_score("", "paris"), 0.0);
        assert_eq!(f1_score("paris", ""), 0.0);
        assert_eq!(f1_score("paris", "?!"), 0.0);
        assert_eq!(compute_score_f1("<answer></answer>", &[""]), 0.0);
    }

    #[test]
    fn f1_uses_character_sets_for_cjk_golden_answers() {
        // 北京 vs 北京市: precision 1, recall 2/3.
        let f1 = f1_score("北京", "北京市");
        assert!((f1 - 0.8).abs() < 1e-12, "{f1}");
        // Digit runs are tokens of their own; ASCII digits are not character tokens.
        assert_eq!(cjk_tokens("2008年"), HashSet::from(["年", "2008"]));
        // Full-width digits are digits for Python and are not dropped as characters.
        assert_eq!(cjk_tokens("１２年"), HashSet::from(["１", "２", "年", "１２"]));
        assert_eq!(f1_score("2008年", "2008年"), 1.0);
        assert_eq!(f1_score("2009年", "2008年"), 0.5);
        // CJK in the prediction only: the golden answer decides, so words are compared.
        assert_eq!(f1_score("北京 city", "city"), 2.0 / 3.0);
    }

    #[test]
    fn cjk_detection_ignores_extension_b() {
        assert!(contains_chinese("ab中"));
        assert!(contains_chinese("\u{3400}"));
        assert!(contains_chinese("\u{f900}"));
        assert!(!contains_chinese("\u{20000}"));
        assert!(!contains_chinese("かな"));
    }

    #[test]
    fn cover_em_ignores_order_but_needs_every_word() {
        let s = "<answer>Tower, the Eiffel</answer>";
        assert_eq!(cover_exact_match_score_1(s, &["Eiffel Tower"]), 1.0);
        assert_eq!(cover_exact_match_score_1(s, &["Eiffel Tower Paris"]), 0.0);
        assert_eq!(cover_exact_match_score_1(s, &["x", "tower"]), 1.0);
        // An empty golden answer normalises to one empty word, found only in an empty prediction.
        assert_eq!(cover_exact_match_score_1(s, &[""]), 0.0);
        assert_eq!(cover_exact_match_score_1("<answer>the</answer>", &[""]), 1.0);
    }

    #[test]
    fn unicode_whitespace_and_punctuation() {
        // U+2003 is white space for Python; « » are not ASCII punctuation and stay.
        assert_eq!(normalize_text("«Paris»\u{2003}France"), "«paris» france");
        assert_eq!(compute_score_em("<answer>Paris\u{85}France</answer>", &["paris france"]), 1.0);
        assert_eq!(compute_score_f1("<answer>«Paris»</answer>", &["Paris"]), 0.0);
    }

    #[test]
    fn format_check_per_turn() {
        assert!(correct_format("<think>x</think>\n<search>q</search>"));
        assert!(correct_format("plain text"));
        assert!(!correct_format("<search>q</search><answer>a</answer>"));
        assert!(!correct_format("<search>q"));
        assert!(!correct_format("<think>a</think></think>"));
        assert!(!correct_format("Assistant: <answer>a</answer>"));
    }
}
