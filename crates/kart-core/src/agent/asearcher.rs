//! ASearcher's agent protocol (upstream `ASearcher/train/search_agent.py` and
//! `ASearcher/train/prompts.py` in AReaL), as a pure state machine.
//!
//! The model searches with `<search>query</search>`, reads a web page with `<access>url</access>`
//! and answers with `<answer>…</answer>`; generation stops at the closing tags ([`ACTION_STOP`]).
//! Every tool result becomes one or more *summary jobs* in a FIFO queue: the search results, or
//! the pages of a web page cut into chunks. While jobs are pending, each model turn reads the next
//! job in full, appended to the context after `<think>`, and stops at `</think>`
//! ([`SUMMARY_STOP`]); later turns see only the job's short text (for a web page, its first 100
//! characters), so the context stays small.
//!
//! [`SearchAgent`] holds the memory (the prompt, the model turns and the jobs it has read) and the
//! queue; the caller runs the model and the tools and passes their results in as data. Upstream
//! cuts pages into pieces of 25,000 characters; kart's default is 10,000 ([`AgentConfig`]).

use crate::reward::asearcher::extract_solution;
use crate::reward::normalize::python_strip;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::LazyLock;

/// The two prompt templates share everything but the sentence describing the tools.
macro_rules! prompt_template {
    ($tools:literal) => {
        concat!(
            "A conversation between User and Assistant. The user asks a question, and the Assistant ",
            "answers it. The Assistant analyzes the given question and information in the mind, retains ",
            "important relevant information, calls a search engine to find necessary information, accesses ",
            "web pages with certain urls, and provides the user with the answer. The Assistant conducts ",
            "search by <search> query </search>",
            $tools,
            " between <information> and </information>.  The reasoning processes are enclosed within ",
            "<think> </think>. Finally, the Assistant provides answer inside <answer> and </answer>, i.e. ",
            "<answer> answer here </answer>. If there are multiple queries, ensure all answers are ",
            "enclosed within <answer> </answer>, seperated with comma. ",
            invalid_prompt!(),
            " \n\nUser: \n\n{question}. \n\nThe language of your answer should align with the question. ",
            "\n\nAssistant: \n<think>\n",
        )
    };
}

/// Upstream's `INVALID_PROMPT`, shared by the templates.
macro_rules! invalid_prompt {
    () => {
        concat!(
            "Note that when the Assistant finds the question is invalid, e.g. no answer could match all ",
            "information in the question, the Assistant replies with '<answer> the question is invalid. ",
            "</answer>'."
        )
    };
}

/// Upstream's `SEARCH_ACCESS_PROMPT_TEMPLATE`; `{question}` is replaced by the question.
pub const SEARCH_ACCESS_PROMPT_TEMPLATE: &str = prompt_template!(
    ", access cerain url by <access> url </access>, and the top search results and url page will be returned"
);

/// Upstream's `SEARCH_ONLY_PROMPT_TEMPLATE` (the training workflow's default); it still mentions
/// accessing web pages in its first sentence.
pub const SEARCH_ONLY_PROMPT_TEMPLATE: &str =
    prompt_template!(" and the top search results will be returned");

/// The sentence allowing the answer "the question is invalid", part of both templates.
pub const INVALID_PROMPT: &str = invalid_prompt!();

/// What replaces [`INVALID_PROMPT`] when the question is known to be valid.
pub const VALID_PROMPT: &str = "You should try to find the most likely answer. ";

/// Stop strings of an action turn.
pub const ACTION_STOP: &[&str] = &["</search>", "</access>", "</answer>"];

/// Stop strings of a turn that reads a summary job.
pub const SUMMARY_STOP: &[&str] = &["</think>"];

/// At most this many characters of each search result reach the model.
pub const MAX_DOC_CHARS: usize = 5_000;

/// Only this many leading characters of a web page are ever read.
pub const MAX_PAGE_CHARS: usize = 250_000;

/// Characters of a page chunk kept in the memory after the chunk has been read.
pub const SHORT_TEXT_CHARS: usize = 100;

/// Upstream's `queue.Queue(128)` of summary jobs.
pub const SUMMARY_QUEUE_CAPACITY: usize = 128;

/// Which prompt template a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PromptTemplate {
    /// Search and web page access ([`SEARCH_ACCESS_PROMPT_TEMPLATE`]).
    SearchAccess,
    /// Search only ([`SEARCH_ONLY_PROMPT_TEMPLATE`]).
    SearchOnly,
}

impl PromptTemplate {
    /// The template text, with a `{question}` placeholder.
    pub fn text(self) -> &'static str {
        match self {
            PromptTemplate::SearchAccess => SEARCH_ACCESS_PROMPT_TEMPLATE,
            PromptTemplate::SearchOnly => SEARCH_ONLY_PROMPT_TEMPLATE,
        }
    }
}

/// The first prompt of an episode: the template with the question inserted and, when
/// `valid_instruction` is set, [`INVALID_PROMPT`] replaced by [`VALID_PROMPT`] (anywhere in the
/// text, as upstream's `str.replace` after `format`).
pub fn build_prompt(template: PromptTemplate, question: &str, valid_instruction: bool) -> String {
    let prompt = template.text().replace("{question}", question);
    if valid_instruction { prompt.replace(INVALID_PROMPT, VALID_PROMPT) } else { prompt }
}

/// The action tags the model can emit, in upstream's order of extraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// `<search>query</search>`.
    Search,
    /// `<access>url</access>`.
    Access,
    /// `<answer>answer</answer>`.
    Answer,
}

impl Tag {
    /// All tags, in upstream's order of extraction.
    pub const ALL: [Tag; 3] = [Tag::Search, Tag::Access, Tag::Answer];

    /// The opening tag, e.g. `<search>`.
    pub fn open(self) -> &'static str {
        match self {
            Tag::Search => "<search>",
            Tag::Access => "<access>",
            Tag::Answer => "<answer>",
        }
    }

    /// The closing tag, e.g. `</search>`.
    pub fn close(self) -> &'static str {
        match self {
            Tag::Search => "</search>",
            Tag::Access => "</access>",
            Tag::Answer => "</answer>",
        }
    }

    /// `<tag>(.*?)</tag>` (DOTALL).
    fn pattern(self) -> &'static Regex {
        static PATTERNS: LazyLock<[Regex; 3]> = LazyLock::new(|| {
            Tag::ALL.map(|tag| {
                let pattern = format!("(?s){}(.*?){}", regex::escape(tag.open()), regex::escape(tag.close()));
                Regex::new(&pattern).expect("valid regex")
            })
        });
        &PATTERNS[self as usize]
    }
}

/// An action found in a model turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Which action.
    pub tag: Tag,
    /// The text between the tags, as matched (not stripped).
    pub content: String,
}

impl ToolCall {
    /// The action as upstream passes it on: `<tag>content</tag>`. The reward is computed on this text.
    pub fn action(&self) -> String {
        format!("{}{}{}", self.tag.open(), self.content, self.tag.close())
    }

    /// The query or URL upstream's tool box reads from [`Self::action`]: the text after the last
    /// opening tag, stripped (`action.split(open)[-1].split(close)[0].strip()`).
    pub fn argument(&self) -> &str {
        python_strip(self.content.rsplit(self.tag.open()).next().unwrap_or(&self.content))
    }
}

/// The actions of a model turn: for each tag in [`Tag::ALL`] order, its last complete occurrence.
/// Upstream's workflow runs only the first.
pub fn extract_tool_calls(completion: &str) -> Vec<ToolCall> {
    Tag::ALL
        .into_iter()
        .filter_map(|tag| {
            let last = tag.pattern().captures_iter(completion).last()?;
            Some(ToolCall { tag, content: last.get(1)?.as_str().to_owned() })
        })
        .collect()
}

/// The first `n` characters of `s` (all of it when shorter).
fn char_prefix(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

/// The summary-job text of search results: the first `topk` documents with their URLs, each cut to
/// [`MAX_DOC_CHARS`] characters, as `[Doc k](url):\n…` blocks separated by blank lines inside
/// `<information>\n…\n</information>`. Documents without a URL are dropped (upstream's `zip`).
pub fn process_search_result<S: AsRef<str>>(documents: &[S], urls: &[S], topk: usize) -> String {
    let documents = &documents[..topk.min(documents.len())];
    if documents.is_empty() {
        return "<information>\nNo search results are found.\n</information>".to_owned();
    }
    let blocks: Vec<String> = documents
        .iter()
        .zip(urls.iter().take(topk))
        .enumerate()
        .map(|(k, (doc, url))| {
            format!("[Doc {}]({}):\n{}", k + 1, url.as_ref(), char_prefix(doc.as_ref(), MAX_DOC_CHARS))
        })
        .collect();
    format!("<information>\n{}\n</information>", blocks.join("\n\n"))
}

/// Cuts `page` into consecutive pieces of `chunk_chars` characters (the last one may be shorter),
/// at most `max_chunks` of them; any rest is dropped. Characters, not bytes: a chunk never splits a
/// character.
pub fn split_page_to_chunks(page: &str, chunk_chars: NonZeroUsize, max_chunks: usize) -> Vec<&str> {
    let mut rest = page;
    let mut chunks = Vec::new();
    while !rest.is_empty() && chunks.len() < max_chunks {
        let chunk = char_prefix(rest, chunk_chars.get());
        chunks.push(chunk);
        rest = &rest[chunk.len()..];
    }
    chunks
}

/// What a tool returned for a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolResponse {
    /// Search results: documents (title and snippet) and their URLs, best first.
    Search {
        /// The result texts.
        documents: Vec<String>,
        /// The URL of each result.
        urls: Vec<String>,
    },
    /// A web page's text; `None` when the page could not be read.
    Access {
        /// The page text.
        page: Option<String>,
    },
}

/// What a memory record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The first prompt.
    Prompt,
    /// A model turn.
    LlmGen,
    /// Search results the model has read.
    SearchResults,
    /// A web page chunk the model has read.
    Webpage,
}

/// One entry of the agent's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// What the record holds.
    pub kind: RecordKind,
    /// The full text.
    pub text: String,
    /// For search results and web pages, what later prompts show instead of `text`; empty otherwise.
    pub short_text: String,
}

/// A tool result waiting to be read by the model.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SummaryJob {
    kind: RecordKind,
    text: String,
    short_text: String,
}

/// The next model request: the full prompt text and where generation stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmQuery {
    /// The prompt, continued by the model.
    pub prompt: String,
    /// Stop strings: [`ACTION_STOP`] or, when reading a summary job, [`SUMMARY_STOP`].
    pub stop: &'static [&'static str],
}

/// The agent's knobs, with upstream's defaults except the page chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Search results kept per query (upstream `topk`, 5).
    pub topk: usize,
    /// Characters per web page chunk (upstream 25,000; kart 10,000).
    pub page_chunk_chars: NonZeroUsize,
    /// Chunks kept per web page (upstream 10).
    pub max_page_chunks: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            topk: 5,
            page_chunk_chars: NonZeroUsize::new(10_000).expect("non-zero"),
            max_page_chunks: 10,
        }
    }
}

/// Errors of the agent state machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// A tool response brought more jobs than the queue holds; the jobs before the first that did
    /// not fit were queued (upstream raises `queue.Full` the same way).
    #[error("the summary job queue is full ({capacity} jobs pending)")]
    QueueFull {
        /// The queue's capacity, [`SUMMARY_QUEUE_CAPACITY`].
        capacity: usize,
    },
}

/// One ASearcher trajectory: the memory and the queue of summary jobs.
///
/// The loop is: [`prepare_llm_query`](Self::prepare_llm_query), generate,
/// [`consume_llm_response`](Self::consume_llm_response), run the first tool call if any and pass
/// its result to [`consume_tool_response`](Self::consume_tool_response), until
/// [`is_finished`](Self::is_finished) or a turn limit on [`num_turns`](Self::num_turns).
#[derive(Debug, Clone)]
pub struct SearchAgent {
    config: AgentConfig,
    records: Vec<Record>,
    jobs: VecDeque<SummaryJob>,
}

impl SearchAgent {
    /// A fresh agent whose memory holds `prompt` (see [`build_prompt`]).
    pub fn new(prompt: impl Into<String>, config: AgentConfig) -> Self {
        let prompt = Record { kind: RecordKind::Prompt, text: prompt.into(), short_text: String::new() };
        SearchAgent { config, records: vec![prompt], jobs: VecDeque::new() }
    }

    /// The memory, oldest first; the `LlmGen` records are the model turns, in order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Summary jobs not yet read.
    pub fn pending_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// The context the memory renders to: the prompt, each model turn verbatim, and each job read
    /// as `\n\n{short_text}\n<think>\n`.
    pub fn memory_prompt(&self) -> String {
        let mut prompt = String::new();
        for record in &self.records {
            match record.kind {
                RecordKind::Prompt => prompt.clone_from(&record.text),
                RecordKind::LlmGen => prompt.push_str(&record.text),
                RecordKind::SearchResults | RecordKind::Webpage => {
                    prompt.push_str("\n\n");
                    prompt.push_str(&record.short_text);
                    prompt.push_str("\n<think>\n");
                }
            }
        }
        prompt
    }

    /// The next model request. With a job pending, it is taken from the queue, recorded in the
    /// memory, shown in full after the memory's context and the turn stops at `</think>`;
    /// otherwise the turn is an action turn.
    pub fn prepare_llm_query(&mut self) -> LlmQuery {
        let mut prompt = self.memory_prompt();
        let Some(job) = self.jobs.pop_front() else {
            return LlmQuery { prompt, stop: ACTION_STOP };
        };
        prompt.push_str("\n\n");
        prompt.push_str(&job.text);
        prompt.push_str("\n<think>\n");
        self.records.push(Record { kind: job.kind, text: job.text, short_text: job.short_text });
        LlmQuery { prompt, stop: SUMMARY_STOP }
    }

    /// Records a model turn and returns its actions ([`extract_tool_calls`]).
    pub fn consume_llm_response(&mut self, completion: &str) -> Vec<ToolCall> {
        self.records.push(Record {
            kind: RecordKind::LlmGen,
            text: completion.to_owned(),
            short_text: String::new(),
        });
        extract_tool_calls(completion)
    }

    /// Queues the summary jobs of a tool result: one for search results
    /// ([`process_search_result`]); one per page chunk for a web page, text
    /// `<information>\n>>>> Page {n} >>>>\n\n{chunk}\n</information>` and short text the same with
    /// the first [`SHORT_TEXT_CHARS`] characters of the page from that chunk on; one "No More
    /// Information" job for a missing or blank page.
    pub fn consume_tool_response(&mut self, response: &ToolResponse) -> Result<(), AgentError> {
        match response {
            ToolResponse::Search { documents, urls } => {
                let text = process_search_result(documents, urls, self.config.topk);
                self.add_jobs([SummaryJob {
                    kind: RecordKind::SearchResults,
                    short_text: text.clone(),
                    text,
                }])
            }
            ToolResponse::Access { page } => match page.as_deref() {
                Some(page) if !python_strip(page).is_empty() => self.add_jobs(self.page_jobs(page)),
                _ => {
                    let text = "<information>\nNo More Information is Found for this URL.\n</information>";
                    self.add_jobs([SummaryJob {
                        kind: RecordKind::Webpage,
                        text: text.to_owned(),
                        short_text: text.to_owned(),
                    }])
                }
            },
        }
    }

    /// The jobs of a non-blank web page, one per chunk.
    fn page_jobs(&self, page: &str) -> Vec<SummaryJob> {
        let page = char_prefix(page, MAX_PAGE_CHARS);
        let mut rest = page;
        let chunks = split_page_to_chunks(page, self.config.page_chunk_chars, self.config.max_page_chunks);
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| {
                let header = format!("<information>\n>>>> Page {} >>>>\n\n", i + 1);
                let short = char_prefix(rest, SHORT_TEXT_CHARS);
                rest = &rest[chunk.len()..];
                SummaryJob {
                    kind: RecordKind::Webpage,
                    text: format!("{header}{chunk}\n</information>"),
                    short_text: format!("{header}{short}\n</information>"),
                }
            })
            .collect()
    }

    /// Queues jobs in order until the queue is full.
    fn add_jobs(&mut self, jobs: impl IntoIterator<Item = SummaryJob>) -> Result<(), AgentError> {
        for job in jobs {
            if self.jobs.len() >= SUMMARY_QUEUE_CAPACITY {
                return Err(AgentError::QueueFull { capacity: SUMMARY_QUEUE_CAPACITY });
            }
            self.jobs.push_back(job);
        }
        Ok(())
    }

    /// The number of model turns so far (action and summary turns alike).
    pub fn num_turns(&self) -> usize {
        self.records.iter().filter(|r| r.kind == RecordKind::LlmGen).count()
    }

    /// Whether a model turn holds a complete `<answer>…</answer>`.
    pub fn is_finished(&self) -> bool {
        self.records.iter().any(|r| r.kind == RecordKind::LlmGen && Tag::Answer.pattern().is_match(&r.text))
    }

    /// The final answer: the last `<answer>` of the memory's context, stripped. The prompt's own
    /// example (`answer here`, or `the question is invalid.`) counts when the model gave none.
    pub fn answer(&self) -> Option<String> {
        extract_solution(&self.memory_prompt()).map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> SearchAgent {
        SearchAgent::new("P", AgentConfig::default())
    }

    fn chunk_chars(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn prompts_insert_the_question_and_swap_the_validity_sentence() {
        assert!(SEARCH_ACCESS_PROMPT_TEMPLATE.contains(INVALID_PROMPT));
        assert!(SEARCH_ONLY_PROMPT_TEMPLATE.contains(INVALID_PROMPT));
        let p = build_prompt(PromptTemplate::SearchAccess, "who wrote hamlet?", false);
        assert!(p.contains("<access> url </access>"));
        assert!(p.ends_with(
            "'<answer> the question is invalid. </answer>'. \n\nUser: \n\nwho wrote hamlet?. \n\n\
             The language of your answer should align with the question. \n\nAssistant: \n<think>\n"
        ));
        let p = build_prompt(PromptTemplate::SearchOnly, "q", true);
        assert!(!p.contains("<access>") && !p.contains(INVALID_PROMPT));
        assert!(p.contains("comma. You should try to find the most likely answer.  \n\nUser: \n\nq. "));
    }

    #[test]
    fn tool_calls_take_the_last_occurrence_of_each_tag_in_tag_order() {
        assert!(extract_tool_calls("just thinking").is_empty());
        let calls = extract_tool_calls("<answer>A</answer> <search>one</search> text <search> two </search>");
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].tag, calls[0].content.as_str()), (Tag::Search, " two "));
        assert_eq!((calls[1].tag, calls[1].content.as_str()), (Tag::Answer, "A"));
        assert_eq!(calls[0].action(), "<search> two </search>");
        assert_eq!(calls[0].argument(), "two");
        // Unbalanced tags: an unclosed opening tag yields nothing; a multi-line content is kept.
        assert!(extract_tool_calls("<search>q").is_empty());
        let calls = extract_tool_calls("<access>\nhttps://a.b\n</access>");
        assert_eq!(calls[0].argument(), "https://a.b");
    }

    #[test]
    fn nested_opening_tags_follow_upstream_splitting() {
        let calls = extract_tool_calls("<search>a <search> b</search>");
        assert_eq!(calls[0].content, "a <search> b");
        assert_eq!(calls[0].argument(), "b");
    }

    #[test]
    fn search_results_are_numbered_truncated_and_limited_to_topk() {
        let docs = ["d1".to_owned(), "é".repeat(MAX_DOC_CHARS + 1), "d3".to_owned()];
        let urls = ["u1".to_owned(), "u2".to_owned(), "u3".to_owned()];
        let text = process_search_result(&docs, &urls, 2);
        let expected =
            format!("<information>\n[Doc 1](u1):\nd1\n\n[Doc 2](u2):\n{}\n</information>", "é".repeat(5000));
        assert_eq!(text, expected);
        assert_eq!(
            process_search_result(&docs, &urls, 0),
            "<information>\nNo search results are found.\n</information>"
        );
        // Documents without a URL are dropped by the zip.
        assert_eq!(
            process_search_result(&docs, &urls[..1], 5),
            "<information>\n[Doc 1](u1):\nd1\n</information>"
        );
    }

    #[test]
    fn pages_split_on_characters() {
        let page = "a".repeat(10_000);
        assert_eq!(split_page_to_chunks(&page, chunk_chars(10_000), 10), vec![page.as_str()]);
        let page = "a".repeat(10_001);
        let chunks = split_page_to_chunks(&page, chunk_chars(10_000), 10);
        assert_eq!(chunks.iter().map(|c| c.len()).collect::<Vec<_>>(), vec![10_000, 1]);
        // Multi-byte characters count once each and are never cut.
        let page = "中".repeat(10_001);
        let chunks = split_page_to_chunks(&page, chunk_chars(10_000), 10);
        assert_eq!(chunks.iter().map(|c| c.chars().count()).collect::<Vec<_>>(), vec![10_000, 1]);
        assert_eq!(chunks[1], "中");
        // At most max_chunks.
        assert_eq!(split_page_to_chunks("abcdef", chunk_chars(2), 2), vec!["ab", "cd"]);
        assert!(split_page_to_chunks("", chunk_chars(2), 2).is_empty());
    }

    #[test]
    fn page_chunks_are_read_in_order_and_shortened_in_memory() {
        let config = AgentConfig { page_chunk_chars: chunk_chars(150), ..AgentConfig::default() };
        let mut agent = SearchAgent::new("P", config);
        let first = agent.prepare_llm_query();
        assert_eq!(first, LlmQuery { prompt: "P".into(), stop: ACTION_STOP });
        agent.consume_llm_response("<access>u</access>");
        let page: String = ('a'..='z').cycle().take(300).collect();
        agent.consume_tool_response(&ToolResponse::Access { page: Some(page.clone()) }).unwrap();
        assert_eq!(agent.pending_jobs(), 2);

        let q1 = agent.prepare_llm_query();
        let page1 =
            format!("\n\n<information>\n>>>> Page 1 >>>>\n\n{}\n</information>\n<think>\n", &page[..150]);
        assert_eq!(q1, LlmQuery { prompt: format!("P<access>u</access>{page1}"), stop: SUMMARY_STOP });
        agent.consume_llm_response("summary one</think>");

        let q2 = agent.prepare_llm_query();
        let short1 =
            format!("\n\n<information>\n>>>> Page 1 >>>>\n\n{}\n</information>\n<think>\n", &page[..100]);
        let page2 =
            format!("\n\n<information>\n>>>> Page 2 >>>>\n\n{}\n</information>\n<think>\n", &page[150..]);
        let expected = format!("P<access>u</access>{short1}summary one</think>{page2}");
        assert_eq!(q2, LlmQuery { prompt: expected, stop: SUMMARY_STOP });
        agent.consume_llm_response("summary two</think>");

        assert_eq!(agent.prepare_llm_query().stop, ACTION_STOP);
        assert_eq!(agent.num_turns(), 3);
        assert!(!agent.is_finished());
    }

    #[test]
    fn short_text_reads_past_a_small_chunk() {
        let config = AgentConfig { page_chunk_chars: chunk_chars(3), ..AgentConfig::default() };
        let mut agent = SearchAgent::new("P", config);
        agent.consume_tool_response(&ToolResponse::Access { page: Some("abcdefg".into()) }).unwrap();
        agent.prepare_llm_query();
        assert_eq!(agent.records()[1].text, "<information>\n>>>> Page 1 >>>>\n\nabc\n</information>");
        assert_eq!(
            agent.records()[1].short_text,
            "<information>\n>>>> Page 1 >>>>\n\nabcdefg\n</information>"
        );
    }

    #[test]
    fn blank_or_missing_pages_yield_one_notice() {
        let notice = "<information>\nNo More Information is Found for this URL.\n</information>";
        for page in [None, Some(" \u{3000}\n".to_owned())] {
            let mut agent = agent();
            agent.consume_tool_response(&ToolResponse::Access { page }).unwrap();
            let query = agent.prepare_llm_query();
            assert_eq!(query.prompt, format!("P\n\n{notice}\n<think>\n"));
            assert_eq!(agent.records()[1].kind, RecordKind::Webpage);
        }
    }

    #[test]
    fn search_results_stay_in_full_in_memory() {
        let mut agent = agent();
        let response = ToolResponse::Search { documents: vec!["doc".into()], urls: vec!["url".into()] };
        agent.consume_tool_response(&response).unwrap();
        agent.prepare_llm_query();
        agent.consume_llm_response("ok</think>");
        let info = "<information>\n[Doc 1](url):\ndoc\n</information>";
        assert_eq!(agent.memory_prompt(), format!("P\n\n{info}\n<think>\nok</think>"));
    }

    #[test]
    fn jobs_are_fifo_across_tool_responses() {
        let mut agent = agent();
        agent.consume_tool_response(&ToolResponse::Access { page: Some("x".repeat(20_001)) }).unwrap();
        agent.consume_tool_response(&ToolResponse::Search { documents: vec![], urls: vec![] }).unwrap();
        let kinds: Vec<RecordKind> = (0..4)
            .map(|_| {
                agent.prepare_llm_query();
                agent.records().last().unwrap().kind
            })
            .collect();
        use RecordKind::{SearchResults, Webpage};
        assert_eq!(kinds, vec![Webpage, Webpage, Webpage, SearchResults]);
        assert!(agent.records()[3].text.contains(">>>> Page 3 >>>>\n\nx\n"));
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut agent = agent();
        let page = ToolResponse::Access { page: Some("y".repeat(100_000)) };
        for _ in 0..12 {
            agent.consume_tool_response(&page).unwrap();
        }
        assert_eq!(agent.consume_tool_response(&page), Err(AgentError::QueueFull { capacity: 128 }));
        assert_eq!(agent.pending_jobs(), 128);
    }

    #[test]
    fn an_answer_finishes_the_trajectory() {
        let mut agent =
            SearchAgent::new(build_prompt(PromptTemplate::SearchOnly, "q", false), AgentConfig::default());
        assert_eq!(agent.answer().as_deref(), Some("the question is invalid."));
        agent.consume_llm_response("<think>x</think> <answer>");
        assert!(!agent.is_finished());
        let calls = agent.consume_llm_response(" Paris </answer>");
        assert!(calls.is_empty(), "the answer is split over two turns");
        assert!(!agent.is_finished());
        agent.consume_llm_response("<answer> Paris </answer>");
        assert!(agent.is_finished());
        assert_eq!(agent.answer().as_deref(), Some("Paris"));
    }
}
