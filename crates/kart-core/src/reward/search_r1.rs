//! Search-R1's rule-based rewards, with the semantics of upstream `verl/utils/reward_score/qa_em.py`
//! (exact and substring match of the extracted answer) and `qa_em_format.py` (exact match plus
//! credit for a well-formed think/search/information/answer sequence and for retrieving the answer).
//!
//! All functions see the full decoded sequence: the prompt, then the assistant turns and
//! observations. Upstream's prompt itself holds two `<answer>` matches (` and ` and its example
//! ` Beijing `) and one `<information>` block (` and `), so under that prompt a response without an
//! answer of its own is scored as answering "Beijing", and [`extract_solution`]'s "at least two
//! matches" rule never returns `None`.

use crate::reward::normalize::{normalize_answer, python_strip};
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

/// Upstream's `<answer>(.*?)</answer>` (DOTALL).
static ANSWER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<answer>(.*?)</answer>").expect("valid regex"));

/// Upstream's `<information>(.*?)</information>` (DOTALL).
static INFORMATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<information>(.*?)</information>").expect("valid regex"));

/// The tags `is_valid_sequence` splits on.
static TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"</?(?:think|search|information|answer)>").expect("valid regex"));

/// The chat marker after which `is_valid_sequence` checks the assistant's part.
const ASSISTANT_MARKER: &str = "<|im_start|>assistant";

/// The `reward_model.ground_truth` of a Search-R1 data row: `{"target": [golden answers]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// The golden answers; any one of them counts.
    pub target: Vec<String>,
}

/// The keyword arguments of upstream's reward functions, with upstream's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SearchR1RewardWeights {
    /// Credit for a well-formed sequence ([`compute_score_em_format`] only).
    pub structure_format_score: f64,
    /// Reward for a wrong answer in a malformed sequence ([`compute_score_em_format`] only).
    pub final_format_score: f64,
    /// Extra credit when a well-formed sequence retrieved a golden answer
    /// ([`compute_score_em_format`] only).
    pub retrieval_score: f64,
    /// Reward for an extracted but wrong answer ([`compute_score_em`] and [`compute_score_subem`]
    /// only; `qa_em_format` accepts and ignores it).
    pub format_score: f64,
    /// Reward for a correct answer.
    pub score: f64,
}

impl Default for SearchR1RewardWeights {
    fn default() -> Self {
        SearchR1RewardWeights {
            structure_format_score: 0.0,
            final_format_score: 0.0,
            retrieval_score: 0.0,
            format_score: 0.0,
            score: 1.0,
        }
    }
}

/// Whether `prediction` equals a golden answer after [`normalize_answer`].
pub fn em_check<S: AsRef<str>>(prediction: &str, golden_answers: &[S]) -> bool {
    let prediction = normalize_answer(prediction);
    golden_answers.iter().any(|g| normalize_answer(g.as_ref()) == prediction)
}

/// Whether a golden answer is a substring of `prediction` after [`normalize_answer`] (an empty
/// golden answer always is).
pub fn subem_check<S: AsRef<str>>(prediction: &str, golden_answers: &[S]) -> bool {
    let prediction = normalize_answer(prediction);
    golden_answers.iter().any(|g| prediction.contains(&normalize_answer(g.as_ref())))
}

/// The content of the last `<answer>…</answer>`, stripped; `None` unless the sequence holds at least
/// two, since the first is the prompt's example.
pub fn extract_solution(solution_str: &str) -> Option<&str> {
    let mut answers = ANSWER.captures_iter(solution_str);
    answers.next()?;
    let (_, [last]) = answers.last()?.extract();
    Some(python_strip(last))
}

/// `qa_em.compute_score_em`: `score` when the extracted answer matches exactly, `format_score` when
/// it does not, 0 when there is none.
pub fn compute_score_em<S: AsRef<str>>(
    solution_str: &str,
    golden_answers: &[S],
    weights: &SearchR1RewardWeights,
) -> f64 {
    match extract_solution(solution_str) {
        Some(answer) if em_check(answer, golden_answers) => weights.score,
        Some(_) => weights.format_score,
        None => 0.0,
    }
}

/// `qa_em.compute_score_subem`: like [`compute_score_em`] with [`subem_check`].
pub fn compute_score_subem<S: AsRef<str>>(
    solution_str: &str,
    golden_answers: &[S],
    weights: &SearchR1RewardWeights,
) -> f64 {
    match extract_solution(solution_str) {
        Some(answer) if subem_check(answer, golden_answers) => weights.score,
        Some(_) => weights.format_score,
        None => 0.0,
    }
}

/// Where `is_valid_sequence` is in the expected tag sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    InThink,
    AfterThink,
    InSearch,
    AfterSearch,
    InInformation,
    AfterInformation,
    InAnswer,
    End,
}

impl State {
    /// The state after `tag`, or `None` when the tag is not allowed here.
    fn after(self, tag: &str) -> Option<State> {
        use State::*;
        Some(match (self, tag) {
            (Start | AfterInformation, "<think>") => InThink,
            (InThink, "</think>") => AfterThink,
            (AfterThink, "<search>") => InSearch,
            (InSearch, "</search>") => AfterSearch,
            (AfterSearch, "<information>") => InInformation,
            (InInformation, "</information>") => AfterInformation,
            (AfterThink, "<answer>") => InAnswer,
            (InAnswer, "</answer>") => End,
            _ => return None,
        })
    }

    /// Whether text between tags is allowed here: anything inside a tag, white space elsewhere.
    fn allows(self, text: &str) -> bool {
        use State::*;
        matches!(self, InThink | InSearch | InInformation | InAnswer) || python_strip(text).is_empty()
    }
}

/// `qa_em_format.is_valid_sequence`: whether the text after the first `<|im_start|>assistant` is
/// `<think>…</think>`, then any number of `<search>…</search><information>…</information>
/// <think>…</think>`, then `<answer>…</answer>`, with only white space between tags and after the
/// end, and no other of these tags inside a tag (no nesting).
///
/// Upstream also compares opening and closing tag counts first; every sequence this state machine
/// accepts is balanced, so that check never changes the result.
pub fn is_valid_sequence(text: &str) -> bool {
    let Some(at) = text.find(ASSISTANT_MARKER) else {
        return false;
    };
    let content = &text[at + ASSISTANT_MARKER.len()..];
    let mut state = State::Start;
    let mut gap_start = 0;
    for tag in TAG.find_iter(content) {
        if !state.allows(&content[gap_start..tag.start()]) {
            return false;
        }
        let Some(next) = state.after(tag.as_str()) else {
            return false;
        };
        state = next;
        gap_start = tag.end();
    }
    state == State::End && state.allows(&content[gap_start..])
}

/// The contents of every `<information>…</information>`, stripped.
pub fn extract_information_blocks(text: &str) -> Vec<&str> {
    INFORMATION.captures_iter(text).map(|c| python_strip(c.extract::<1>().1[0])).collect()
}

/// Whether a normalised golden answer is a substring of a normalised information block.
pub fn is_retrieval_correct<S: AsRef<str>>(text: &str, golden_answers: &[S]) -> bool {
    extract_information_blocks(text).into_iter().any(|block| {
        let block = normalize_answer(block);
        golden_answers.iter().any(|g| block.contains(&normalize_answer(g.as_ref())))
    })
}

/// `qa_em_format.compute_score_em`: exact match with format and retrieval credit.
///
/// | extracted answer | well-formed sequence ([`is_valid_sequence`])   | malformed                        |
/// |------------------|------------------------------------------------|----------------------------------|
/// | exact match      | `score`                                        | `score - structure_format_score` |
/// | wrong            | `structure_format_score`, plus `retrieval_score` if [`is_retrieval_correct`] | `final_format_score` |
/// | none             | as for a wrong answer                          | 0                                |
pub fn compute_score_em_format<S: AsRef<str>>(
    solution_str: &str,
    golden_answers: &[S],
    weights: &SearchR1RewardWeights,
) -> f64 {
    let valid = is_valid_sequence(solution_str);
    let format_credit = if valid && is_retrieval_correct(solution_str, golden_answers) {
        weights.structure_format_score + weights.retrieval_score
    } else {
        weights.structure_format_score
    };
    match extract_solution(solution_str) {
        Some(answer) if em_check(answer, golden_answers) => {
            if valid {
                weights.score
            } else {
                weights.score - weights.structure_format_score
            }
        }
        _ if valid => format_credit,
        Some(_) => weights.final_format_score,
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::search_r1::make_prefix;

    /// A full decoded sequence: the chat-formatted upstream prompt, then `assistant`.
    fn seq(assistant: &str) -> String {
        let prompt = make_prefix("who is it").unwrap();
        format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{assistant}")
    }

    fn weights() -> SearchR1RewardWeights {
        SearchR1RewardWeights {
            structure_format_score: 0.2,
            final_format_score: 0.1,
            retrieval_score: 0.1,
            format_score: 0.5,
            score: 1.0,
        }
    }

    const GOOD: &str = "<think>t</think>\n<search>q</search>\n\n<information>Doc 1(Title: Paris) capital\n\
        </information>\n\n<think>t</think>\n<answer> Paris </answer>";

    #[test]
    fn extract_solution_needs_two_answers() {
        assert_eq!(extract_solution("<answer>only</answer>"), None);
        assert_eq!(extract_solution("no answer"), None);
        assert_eq!(extract_solution("<answer>a</answer><answer>\u{1f} b\n</answer>"), Some("b"));
        assert_eq!(extract_solution("<answer>a</answer><answer>unclosed"), None);
        // The lazy match ends at the first closing tag, nested openings included.
        assert_eq!(
            extract_solution("<answer>a</answer><answer><answer>b</answer>c</answer>"),
            Some("<answer>b")
        );
        assert_eq!(extract_solution(&seq(GOOD)), Some("Paris"));
    }

    #[test]
    fn the_prompt_alone_answers_beijing() {
        assert_eq!(extract_solution(&seq("<think>t</think>")), Some("Beijing"));
        assert_eq!(compute_score_em(&seq("<think>t</think>"), &["beijing"], &weights()), 1.0);
    }

    #[test]
    fn em_and_subem_normalise_both_sides() {
        assert!(em_check("The  Eiffel-Tower!", &["eiffeltower"]));
        assert!(em_check("\u{3000}paris\u{85}", &["Paris"]));
        assert!(!em_check("Paris, France", &["Paris"]));
        assert!(subem_check("Paris, France", &["paris"]));
        assert!(!em_check("x", &[] as &[&str]));
        assert!(!subem_check("x", &[] as &[&str]));
        assert!(subem_check("anything", &[""]));
        assert!(em_check("the", &[""]));
        // Non-ASCII punctuation survives normalisation.
        assert!(!em_check("«Paris»", &["Paris"]));
    }

    #[test]
    fn qa_em_scores() {
        let w = weights();
        assert_eq!(compute_score_em(&seq(GOOD), &["paris"], &w), 1.0);
        assert_eq!(compute_score_em(&seq(GOOD), &["London"], &w), 0.5);
        assert_eq!(compute_score_em("<answer>Paris</answer>", &["Paris"], &w), 0.0);
        assert_eq!(compute_score_subem(&seq("<answer>Paris, France</answer>"), &["paris"], &w), 1.0);
        assert_eq!(compute_score_subem(&seq("<answer>Lyon</answer>"), &["paris"], &w), 0.5);
        assert_eq!(compute_score_subem("no answer", &["paris"], &w), 0.0);
    }

    #[test]
    fn valid_sequences() {
        assert!(is_valid_sequence(&seq(GOOD)));
        assert!(is_valid_sequence(&seq(" \u{1c}<think>\n</think>\u{3000}<answer>a</answer>\n ")));
        // Tags other than the four are plain text.
        assert!(is_valid_sequence(&seq("<think><b>x</b></think><answer></ answer></answer>")));
    }

    #[test]
    fn invalid_sequences() {
        let invalid = [
            "",
            "<think>t</think>",
            "<answer>a</answer>",
            "text <think>t</think><answer>a</answer>",
            "<think>t</think> between <answer>a</answer>",
            "<think>t</think><answer>a</answer> after",
            "<think>t</think><answer>a</answer><answer>b</answer>",
            "<think>t<search>q</search></think><answer>a</answer>",
            "<think><think>t</think></think><answer>a</answer>",
            "<think>t</think><search>q</search><answer>a</answer>",
            "<think>t</think><search>q</search><information>i</information><answer>a</answer>",
            "<think>t</think><answer>a",
            "<think>t</think></answer>",
        ];
        for assistant in invalid {
            assert!(!is_valid_sequence(&seq(assistant)), "{assistant:?}");
        }
        assert!(!is_valid_sequence("<think>t</think><answer>a</answer>"), "no assistant marker");
    }

    #[test]
    fn information_blocks_include_the_prompt() {
        let text = seq(GOOD);
        assert_eq!(extract_information_blocks(&text), ["and", "Doc 1(Title: Paris) capital"]);
        assert!(is_retrieval_correct(&text, &["CAPITAL"]));
        assert!(!is_retrieval_correct(&text, &["Lyon"]));
        assert!(!is_retrieval_correct(&text, &[] as &[&str]));
        assert!(is_retrieval_correct(&text, &[""]));
        assert!(!is_retrieval_correct("<information>x", &[""]));
    }

    #[test]
    fn em_format_table() {
        let w = weights();
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} != {b}");
        close(compute_score_em_format(&seq(GOOD), &["Paris"], &w), 1.0);
        close(compute_score_em_format(&seq(GOOD), &["capital"], &w), 0.3);
        close(compute_score_em_format(&seq(GOOD), &["Lyon"], &w), 0.2);
        let malformed = seq("<answer>Paris</answer> trailing");
        close(compute_score_em_format(&malformed, &["Paris"], &w), 0.8);
        close(compute_score_em_format(&malformed, &["Lyon"], &w), 0.1);
        // Without the prompt a single answer extracts nothing.
        let bare = "<|im_start|>assistant\n<think>t</think>\n<answer>Paris</answer>";
        close(compute_score_em_format(bare, &["Paris"], &w), 0.2);
        close(compute_score_em_format("<answer>Paris</answer>", &["Paris"], &w), 0.0);
        close(compute_score_em_format(&seq(GOOD), &["Paris"], &SearchR1RewardWeights::default()), 1.0);
    }

    #[test]
    fn weights_take_upstream_defaults_and_reject_unknown_keys() {
        let w: SearchR1RewardWeights = serde_json::from_str(r#"{"format_score": 0.2}"#).unwrap();
        assert_eq!(w, SearchR1RewardWeights { format_score: 0.2, ..Default::default() });
        assert!(serde_json::from_str::<SearchR1RewardWeights>(r#"{"scroe": 1}"#).is_err());
    }
}
