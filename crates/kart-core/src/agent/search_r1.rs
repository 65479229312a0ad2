//! The Search-R1 protocol, byte-compatible with upstream `search_r1/llm_agent/generation.py` and
//! `scripts/data_process/nq_search.py`.
//!
//! The model reasons in `<think>…</think>`, searches with `<search>query</search>` and answers with
//! `<answer>…</answer>`. Each turn is cut after its first action tag ([`postprocess`]), parsed
//! ([`parse_action`]) and answered by the environment ([`execute`]): retrieved passages in
//! `<information>` for a search, nothing for an answer, a fixed reminder otherwise. [`Episode`]
//! applies upstream's turn rules: an answer ends the episode, and after `max_turns` rounds one final
//! generation runs in which a search is no longer executed.

use crate::reward::normalize::python_strip;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

/// Stop strings for generation, in [`postprocess`]'s order of preference: a turn ends with its
/// first action, and the engine must keep the stop string in its output. Upstream instead generates
/// to the length limit and cuts with [`postprocess`], which prefers `</search>` even when
/// `</answer>` comes first; the two differ only for such turns.
pub const STOP_STRINGS: [&str; 2] = ["</search>", "</answer>"];

/// The observation for a turn with no valid action (upstream's text, verbatim).
pub const INVALID_ACTION_OBSERVATION: &str = "\nMy previous action is invalid. If I want to search, I should put \
the query between <search> and </search>. If I want to give the final answer, I should put the answer between \
<answer> and </answer>. Let me try again.\n";

/// The `make_prefix` template (`template_type='base'`) up to the question.
const PROMPT_PREFIX: &str = "Answer the given question. You must conduct reasoning inside <think> and </think> \
first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a \
search engine by <search> query </search> and it will return the top searched results between <information> and \
</information>. You can search as many times as your want. If you find no further external knowledge needed, you \
can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, \
<answer> Beijing </answer>. Question: ";

/// Upstream's `<(search|answer)>(.*?)</\1>` (DOTALL), without the backreference.
static ACTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"<search>(?s:(.*?))</search>|<answer>(?s:(.*?))</answer>").expect("valid regex")
});

/// Why a prompt could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// Upstream indexes the question's last character and fails on an empty one.
    #[error("question {0:?} is empty after stripping white space")]
    EmptyQuestion(String),
}

/// The user prompt for `question`: stripped, `?` appended unless it already ends with one, inserted
/// into upstream's `make_prefix` template (which ends with a newline).
pub fn make_prefix(question: &str) -> Result<String, PromptError> {
    Ok(format!("{PROMPT_PREFIX}{}\n", normalize_question(question)?))
}

/// The question as `nq_search.py` rewrites it before the prompt: stripped (Python's `str.strip`),
/// with `?` appended unless it already ends with one.
pub fn normalize_question(question: &str) -> Result<String, PromptError> {
    let stripped = python_strip(question);
    if stripped.is_empty() {
        return Err(PromptError::EmptyQuestion(question.to_string()));
    }
    let mark = if stripped.ends_with('?') { "" } else { "?" };
    Ok(format!("{stripped}{mark}"))
}

/// Cuts a raw model turn after its first `</search>`, or else after its first `</answer>`; a turn
/// with neither is returned unchanged.
pub fn postprocess(response: &str) -> &str {
    STOP_STRINGS
        .into_iter()
        .find_map(|tag| response.find(tag).map(|at| &response[..at + tag.len()]))
        .unwrap_or(response)
}

/// An action the model took in one turn, with its content stripped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `<search>query</search>`.
    Search(String),
    /// `<answer>answer</answer>`.
    Answer(String),
}

impl Action {
    /// Upstream's action name: `search` or `answer`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Search(_) => "search",
            Action::Answer(_) => "answer",
        }
    }

    /// The query or the answer.
    pub fn content(&self) -> &str {
        match self {
            Action::Search(c) | Action::Answer(c) => c,
        }
    }
}

/// The first complete `<search>…</search>` or `<answer>…</answer>` of a (postprocessed) turn, its
/// content stripped with Python's `str.strip`; `None` when there is neither.
pub fn parse_action(text: &str) -> Option<Action> {
    let caps = ACTION.captures(text)?;
    // Exactly one alternative matched: group 1 for a search, group 2 for an answer.
    Some(match caps.get(1) {
        Some(query) => Action::Search(python_strip(query.as_str()).to_string()),
        None => Action::Answer(python_strip(&caps[2]).to_string()),
    })
}

/// A retrieved document as the Search-R1 retriever serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// The corpus id.
    pub id: String,
    /// The title on the first line, then the text.
    pub contents: String,
    /// The title alone, when the corpus has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The text alone, when the corpus has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The corpus row's other fields (`url`, …), returned as upstream servers return the whole
    /// row (ASearcher's client reads `url`).
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// One hit of a retrieval: `{"document": {…}, "score": s}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievalResult {
    /// The document.
    pub document: Document,
    /// The retriever's score (higher is better).
    pub score: f64,
}

/// Upstream's `_passages2string`: `Doc {i}(Title: {first line}) {other lines}\n` per hit, numbered
/// from 1, where lines are split on `\n` only.
pub fn passages_to_string(results: &[RetrievalResult]) -> String {
    results
        .iter()
        .enumerate()
        .map(|(i, hit)| {
            let contents = &hit.document.contents;
            let (title, text) = contents.split_once('\n').unwrap_or((contents, ""));
            format!("Doc {}(Title: {title}) {text}\n", i + 1)
        })
        .collect()
}

/// The environment's reply to one turn, as upstream's `execute_predictions` computes it for an
/// active trajectory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The text appended to the context after the turn.
    pub observation: String,
    /// Whether the turn answered.
    pub done: bool,
    /// Whether the turn held a search or an answer.
    pub valid_action: bool,
    /// Whether the turn searched.
    pub is_search: bool,
}

/// Replies to a turn's action; `search_results` is the [`passages_to_string`] text of the search
/// (ignored for other actions; empty when the search is not executed).
pub fn execute(action: Option<&Action>, search_results: &str) -> Step {
    match action {
        Some(Action::Answer(_)) => {
            Step { observation: String::new(), done: true, valid_action: true, is_search: false }
        }
        Some(Action::Search(_)) => Step {
            observation: format!("\n\n<information>{}</information>\n\n", python_strip(search_results)),
            done: false,
            valid_action: true,
            is_search: true,
        },
        None => Step {
            observation: INVALID_ACTION_OBSERVATION.to_string(),
            done: false,
            valid_action: false,
            is_search: false,
        },
    }
}

/// Upstream's per-trajectory statistics of `run_llm_loop`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpisodeStats {
    /// Model generations (upstream `turns_stats`).
    pub turns: u32,
    /// Turns that held a search or an answer, the final round's included (`valid_action_stats`).
    pub valid_actions: u32,
    /// Turns that held a search, including a final-round search that was not executed
    /// (`valid_search_stats`).
    pub searches: u32,
    /// Whether the episode ended with an answer (upstream's final `active_mask` is its negation).
    pub answered: bool,
}

/// The turn rules of one Search-R1 episode.
///
/// Drive it with one generation at a time: while not [`is_over`](Self::is_over), generate, parse
/// the postprocessed turn, retrieve only if [`executes_search`](Self::executes_search), then
/// [`record`](Self::record) the turn and append the observation it returns.
#[derive(Debug, Clone)]
pub struct Episode {
    max_turns: u32,
    over: bool,
    stats: EpisodeStats,
}

impl Episode {
    /// A new episode allowing `max_turns` rounds with search, plus one final round without.
    pub fn new(max_turns: u32) -> Self {
        Episode { max_turns, over: false, stats: EpisodeStats::default() }
    }

    /// Whether no more generations are wanted.
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// Whether a search in the coming turn is executed: false in the final round after `max_turns`
    /// rounds, where upstream runs `execute_predictions(..., do_search=False)`.
    pub fn executes_search(&self) -> bool {
        !self.over && self.stats.turns < self.max_turns
    }

    /// Records a generated turn given its parsed action and the [`passages_to_string`] text of its
    /// search (ignored unless the search is executed). Returns the observation to append to the
    /// context, or `None` when the episode is over: after an answer, after the final round (whose
    /// observation upstream discards), or when called again after that.
    pub fn record(&mut self, action: Option<&Action>, search_results: &str) -> Option<String> {
        if self.over {
            return None;
        }
        let final_round = !self.executes_search();
        let step = execute(action, if final_round { "" } else { search_results });
        self.stats.turns += 1;
        self.stats.valid_actions += u32::from(step.valid_action);
        self.stats.searches += u32::from(step.is_search);
        self.stats.answered = step.done;
        self.over = step.done || final_round;
        (!self.over).then_some(step.observation)
    }

    /// The statistics so far.
    pub fn stats(&self) -> EpisodeStats {
        self.stats
    }
}

/// The Search-R1 document for a passage: `contents` is `"{title}"\n{text}`; `title` and `text` are
/// filled in from it so clients reading either form work.
pub fn document(id: String, contents: String) -> Document {
    let (first, rest) = contents.split_once('\n').unwrap_or((&contents, ""));
    let title = first.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(first).to_string();
    let text = rest.to_string();
    Document { id, contents, title: Some(title), text: Some(text), fields: serde_json::Map::new() }
}

/// Search-R1's `contents` for a passage given as a title and a text.
pub fn contents(title: &str, text: &str) -> String {
    format!("\"{title}\"\n{text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(contents: &str) -> RetrievalResult {
        RetrievalResult {
            document: Document {
                id: "0".into(),
                contents: contents.into(),
                title: None,
                text: None,
                fields: serde_json::Map::new(),
            },
            score: 1.0,
        }
    }

    #[test]
    fn prompt_strips_and_appends_one_question_mark() {
        let q = |s| make_prefix(s).unwrap().strip_prefix(PROMPT_PREFIX).unwrap().to_string();
        assert_eq!(q("  who wrote hamlet \n"), "who wrote hamlet?\n");
        assert_eq!(q("what?? "), "what??\n");
        assert_eq!(q("\u{3000}名古屋はどこ\u{1f}"), "名古屋はどこ?\n");
        assert_eq!(q("why？"), "why？?\n");
        assert_eq!(make_prefix(" \u{85} "), Err(PromptError::EmptyQuestion(" \u{85} ".into())));
    }

    #[test]
    fn postprocess_prefers_search_over_an_earlier_answer() {
        assert_eq!(
            postprocess("<answer>a</answer> <search>q</search> x"),
            "<answer>a</answer> <search>q</search>"
        );
        assert_eq!(postprocess("<answer>a</answer></answer>"), "<answer>a</answer>");
        assert_eq!(postprocess("<think>no action"), "<think>no action");
        assert_eq!(postprocess(""), "");
    }

    #[test]
    fn parse_action_takes_the_first_complete_tag_pair() {
        assert_eq!(
            parse_action("<answer> Paris\n</answer><search>q</search>"),
            Some(Action::Answer("Paris".into()))
        );
        assert_eq!(
            parse_action("<search>a<answer>b</answer></search>"),
            Some(Action::Search("a<answer>b</answer>".into()))
        );
        // An unclosed search does not hide a later complete answer.
        assert_eq!(parse_action("<search>q <answer>x</answer>"), Some(Action::Answer("x".into())));
        assert_eq!(parse_action("<search>q</answer>"), None);
        assert_eq!(parse_action("<Search>q</Search>"), None);
        assert_eq!(parse_action("no tags"), None);
    }

    #[test]
    fn parse_action_spans_lines_and_strips_python_white_space() {
        let action = parse_action("<search>\u{1c} line one\nline two\u{2003}</search>").unwrap();
        assert_eq!((action.name(), action.content()), ("search", "line one\nline two"));
        assert_eq!(parse_action("<answer></answer>"), Some(Action::Answer(String::new())));
    }

    #[test]
    fn passages_split_title_on_the_first_newline_only() {
        let hits = [hit("Title\nline one\r\nline two\n"), hit(""), hit("Only title")];
        assert_eq!(
            passages_to_string(&hits),
            "Doc 1(Title: Title) line one\r\nline two\n\nDoc 2(Title: ) \nDoc 3(Title: Only title) \n"
        );
        assert_eq!(passages_to_string(&[]), "");
    }

    #[test]
    fn retrieval_results_round_trip_the_wire_format() {
        let json = r#"{"document": {"id": "7", "contents": "T\nx", "title": "T"}, "score": 3}"#;
        let hit: RetrievalResult = serde_json::from_str(json).unwrap();
        assert_eq!(
            (hit.document.title.as_deref(), hit.document.text.as_deref(), hit.score),
            (Some("T"), None, 3.0)
        );
        let back = serde_json::to_value(&hit).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"document": {"id": "7", "contents": "T\nx", "title": "T"}, "score": 3.0})
        );
    }

    #[test]
    fn execute_replies_per_action() {
        let search = execute(Some(&Action::Search("q".into())), "  Doc 1(Title: T) x\n");
        assert_eq!(search.observation, "\n\n<information>Doc 1(Title: T) x</information>\n\n");
        assert!(search.valid_action && search.is_search && !search.done);
        let answer = execute(Some(&Action::Answer("a".into())), "ignored");
        assert_eq!(
            answer,
            Step { observation: String::new(), done: true, valid_action: true, is_search: false }
        );
        let invalid = execute(None, "ignored");
        assert_eq!(invalid.observation, INVALID_ACTION_OBSERVATION);
        assert!(!invalid.valid_action && !invalid.is_search && !invalid.done);
    }

    #[test]
    fn episode_ends_on_answer() {
        let mut episode = Episode::new(3);
        assert!(episode.executes_search());
        let obs = episode.record(parse_action("<search>q</search>").as_ref(), "Doc 1(Title: T) x\n");
        assert_eq!(obs.as_deref(), Some("\n\n<information>Doc 1(Title: T) x</information>\n\n"));
        assert_eq!(
            episode.record(parse_action("<think>hmm").as_ref(), ""),
            Some(INVALID_ACTION_OBSERVATION.into())
        );
        assert_eq!(episode.record(parse_action("<answer>a</answer>").as_ref(), ""), None);
        assert!(episode.is_over() && !episode.executes_search());
        assert_eq!(episode.stats(), EpisodeStats { turns: 3, valid_actions: 2, searches: 1, answered: true });
        assert_eq!(episode.record(parse_action("<answer>b</answer>").as_ref(), ""), None);
        assert_eq!(episode.stats().turns, 3);
    }

    #[test]
    fn final_round_neither_searches_nor_appends() {
        let mut episode = Episode::new(1);
        let search = Action::Search("q".into());
        assert!(episode.record(Some(&search), "Doc 1(Title: T) x\n").is_some());
        assert!(!episode.executes_search() && !episode.is_over());
        // The final search still counts as a valid search, as upstream's statistics do.
        assert_eq!(episode.record(Some(&search), "Doc 1(Title: T) x\n"), None);
        assert!(episode.is_over());
        assert_eq!(
            episode.stats(),
            EpisodeStats { turns: 2, valid_actions: 2, searches: 2, answered: false }
        );
    }

    #[test]
    fn zero_max_turns_allows_only_the_final_round() {
        let mut episode = Episode::new(0);
        assert!(!episode.executes_search() && !episode.is_over());
        assert_eq!(episode.record(Some(&Action::Answer("a".into())), ""), None);
        assert_eq!(episode.stats(), EpisodeStats { turns: 1, valid_actions: 1, searches: 0, answered: true });
    }

    #[test]
    fn document_splits_title_and_text() {
        let d = document("7".into(), "\"Paris\"\nCapital of France.\nSecond line.".into());
        assert_eq!(d.title.as_deref(), Some("Paris"));
        assert_eq!(d.text.as_deref(), Some("Capital of France.\nSecond line."));
        let d = document("8".into(), "no title line".into());
        assert_eq!((d.title.as_deref(), d.text.as_deref()), (Some("no title line"), Some("")));
    }

    #[test]
    fn contents_round_trips() {
        let d = document("1".into(), contents("A \"quoted\" title", "text"));
        assert_eq!(d.title.as_deref(), Some("A \"quoted\" title"));
        assert_eq!(d.contents, "\"A \"quoted\" title\"\ntext");
    }
}
