//! Tool-integrated reasoning (TIR): the protocol of AReaL's `examples/tir` (`tir_workflow.py`,
//! `tool_manager.py`, `tools/python_tool.py`, `tools/calculator_tool.py`, `prompts.py`), as a pure
//! state machine over streamed text.
//!
//! The model writes a Python block (```` ```python … ``` ```` or `<python>…</python>`) or
//! `<calculator>…</calculator>` in the middle of its reasoning. Generation first stops at any
//! tool's start marker; once one ends a piece of text, generation continues until an end marker,
//! and the text since the start marker is routed to a tool. The tool's result is appended as
//! `` \n```output\n{result}\n```\n `` (an observation, loss mask 0) and the cycle starts over.
//! Running the code is not done here: [`TirEpisode`] says which call to make and turns its
//! outcome into the observation text.

use crate::reward::normalize::{is_python_space, python_strip};
use regex::Regex;
use std::sync::LazyLock;

/// Upstream's `ANSWER` pattern is `r"\boxed{.*?}"`, where Python reads `\b` as a word boundary, so a
/// literal `\boxed{…}` never matches there; kart matches the intended literal (on one line), or a
/// complete `<answer>…</answer>`.
static ANSWER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\\boxed\{.*?\}|(?s:<answer>.*?</answer>)").expect("valid regex"));

/// Upstream's `extract_python_code`, first format: ```` ```python\n(.*?)\n``` ```` (DOTALL, IGNORECASE).
static PYTHON_FENCE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?is)```python\n(.*?)\n```").expect("valid regex"));

/// Upstream's `extract_python_code`, second format: `<python>(.*?)</python>` (DOTALL, IGNORECASE).
static PYTHON_TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?is)<python>(.*?)</python>").expect("valid regex"));

/// Upstream's calculator `parse_parameters`: `<calculator>(.*?)</calculator>` (DOTALL, IGNORECASE).
static CALCULATOR_TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?is)<calculator>(.*?)</calculator>").expect("valid regex"));

/// Upstream's `SYSTEM_PROMPT`, with a `{tool_descriptions}` placeholder.
const SYSTEM_PROMPT_TEMPLATE: &str = "\nYou are a helpful assistant that can use tools to help the user.\n\
You can use the following tools:\n{tool_descriptions}\nWhen you invoke a tool in your response, the tool's \
output will be immediately obtained and placed within the output``` ``` tags. Then, you continue answering \
based on the tool's output. Depending on the parameters you provide for the invocation, the tool's \
invocation may fail. You can invoke the tool multiple times in your response.\nYou should use the tools to \
help the user to solve the problem whenever possible.\nPlease reason step by step, and put your final answer \
within \\boxed{}.\n";

/// Upstream's `TORL_PROMPT` (the base-model prompt of the training runs), with a `{prompt}` placeholder.
const TORL_PROMPT_TEMPLATE: &str = "A conversation between User and Assistant. The user asks a question, and \
the Assistant solves it.\nUser:Please integrate natural language reasoning with programs to solve the \
problem blow, and put your final answer within \\boxed{}..\n{prompt}\nAssistant:";

/// Upstream's `PythonExecutor.truncate` limit for the output and the report.
const MAX_RESULT_CHARS: usize = 256;

/// A tool the model can call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// Python code, run by an executor; the observation is its standard output.
    Python,
    /// An arithmetic expression of digits, `+ - * / ( ) .` and white space.
    Calculator,
}

impl Tool {
    /// Text that opens a call, and the stop strings while no call is open.
    pub fn start_markers(self) -> &'static [&'static str] {
        match self {
            Tool::Python => &["```python", "<python>"],
            Tool::Calculator => &["<calculator>"],
        }
    }

    /// Text that closes a call, and the stop strings while a call is open.
    pub fn end_markers(self) -> &'static [&'static str] {
        match self {
            Tool::Python => &["```", "</python>"],
            Tool::Calculator => &["</calculator>"],
        }
    }

    /// The tool's entry in the system prompt: name, description, parameter description, example.
    fn description(self) -> [&'static str; 4] {
        match self {
            Tool::Python => [
                "python_executor",
                "Execute Python code. Supports variable calculation, data processing, algorithm \
                 implementation, etc.",
                "Please provide the Python code to execute. Supports variable calculation, data processing, \
                 algorithm implementation, etc.",
                "```python\na=1\nb=1\nprint(f'The a+b result is {a+b}')\n```\n or \n\
                 <python>\na=1\nb=1\nprint(f'The a+b result is {a+b}')\n</python>",
            ],
            Tool::Calculator => [
                "python calculator",
                "Perform basic mathematical calculations, supporting addition, subtraction, multiplication, \
                 division, and parentheses.",
                "Please provide a mathematical expression. Supports addition, subtraction, multiplication, \
                 division, and parentheses.",
                "<calculator>1 + 2 * 3</calculator>",
            ],
        }
    }

    /// Whether `text` holds one of this tool's start markers followed later by one of its end markers
    /// (upstream's `ToolRouter` patterns `{start}(.*?){end}`, DOTALL, IGNORECASE).
    fn matches(self, text: &str) -> bool {
        static ROUTES: LazyLock<[Regex; 2]> = LazyLock::new(|| {
            [Tool::Python, Tool::Calculator].map(|tool| {
                let alternatives =
                    |markers: &[&str]| markers.iter().map(|m| regex::escape(m)).collect::<Vec<_>>().join("|");
                let pattern = format!(
                    "(?is)(?:{}).*?(?:{})",
                    alternatives(tool.start_markers()),
                    alternatives(tool.end_markers())
                );
                Regex::new(&pattern).expect("valid regex")
            })
        });
        ROUTES[self as usize].is_match(text)
    }

    /// The call in `text` (which starts at a start marker), or upstream's error message when its
    /// parameters are missing or invalid.
    fn parse_call(self, text: &str) -> Result<ToolCall, &'static str> {
        match self {
            Tool::Python => {
                let code = extract_python_code(text);
                if code.is_empty() {
                    Err("No code provided")
                } else {
                    Ok(ToolCall::Python { code: code.to_owned() })
                }
            }
            Tool::Calculator => {
                let expression = CALCULATOR_TAG
                    .captures(text)
                    .and_then(|c| c.get(1))
                    .map_or("", |m| python_strip(m.as_str()));
                if expression.is_empty() {
                    Err("No expression provided")
                } else if !expression
                    .chars()
                    .all(|c| c.is_ascii_digit() || "+-*/().".contains(c) || is_python_space(c))
                {
                    Err("Invalid expression")
                } else {
                    Ok(ToolCall::Calculator { expression: expression.to_owned() })
                }
            }
        }
    }
}

/// The tool list of the system prompt (upstream's `get_tool_descriptions_prompt`).
pub fn tool_descriptions(tools: &[Tool]) -> String {
    let mut parts = vec!["Tools List:\n".to_owned()];
    for tool in tools {
        let [name, description, parameters, example] = tool.description();
        parts.push(format!("Tool Name: {name}"));
        parts.push(format!("Description: {description}"));
        parts.push(format!("Parameter Description: {parameters}"));
        parts.push(format!("Usage Example: {example}"));
        parts.push("---".to_owned());
    }
    parts.join("\n")
}

/// The system message for chat models, describing `tools`.
pub fn system_prompt(tools: &[Tool]) -> String {
    SYSTEM_PROMPT_TEMPLATE.replace("{tool_descriptions}", &tool_descriptions(tools))
}

/// The prompt for base models: the ToRL instruction around the user's question.
pub fn torl_prompt(question: &str) -> String {
    TORL_PROMPT_TEMPLATE.replace("{prompt}", question)
}

/// Whether a piece of generated text gives the final answer, which ends the episode.
pub fn is_answer(text: &str) -> bool {
    ANSWER.is_match(text)
}

/// The code of the last ```` ```python\n…\n``` ```` block of `text`, else of the last
/// `<python>…</python>`, stripped; empty when there is neither.
pub fn extract_python_code(text: &str) -> &str {
    [&*PYTHON_FENCE, &*PYTHON_TAG]
        .into_iter()
        .find_map(|pattern| pattern.captures_iter(text).last()?.get(1))
        .map_or("", |m| python_strip(m.as_str()))
}

/// A tool call to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    /// Run Python code and capture its standard output.
    Python {
        /// The code, stripped, never empty.
        code: String,
    },
    /// Evaluate an arithmetic expression.
    Calculator {
        /// The expression, stripped, never empty, only digits, `+ - * / ( ) .` and white space.
        expression: String,
    },
}

/// What running a [`ToolCall`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The Python executor ran the code.
    Python {
        /// Standard output.
        stdout: String,
        /// `Done`, `Timeout Error`, or the last line of the traceback.
        report: String,
    },
    /// The calculator's value, as Python's `str` of the result (e.g. `7`, `3.5`).
    Calculator {
        /// The value.
        value: String,
    },
    /// The tool raised: the exception's message (e.g. `division by zero`).
    Failed {
        /// The message.
        message: String,
    },
}

impl ToolOutcome {
    /// The text shown to the model and whether the call counts as a success. Python output and
    /// report are stripped and cut to 256 characters (the executor's post-processing); a report
    /// other than `Done` is shown as `Error: {report}`. A call succeeds when the tool did not raise
    /// and its result does not contain `Error`.
    pub fn result(&self) -> (String, bool) {
        match self {
            ToolOutcome::Python { stdout, report } => {
                let (stdout, report) = (truncate(python_strip(stdout)), truncate(python_strip(report)));
                let success = !stdout.contains("Error") && !report.contains("Error");
                let shown = if report == "Done" { stdout } else { format!("Error: {report}") };
                (shown, success)
            }
            ToolOutcome::Calculator { value } => (value.clone(), !value.contains("Error")),
            ToolOutcome::Failed { message } => {
                (format!("Error: Tool execution failed - Error: {message}"), false)
            }
        }
    }
}

/// Upstream's `truncate`: a text longer than 256 characters keeps its first and last 128, joined
/// by `...`.
fn truncate(s: &str) -> String {
    let len = s.chars().count();
    if len <= MAX_RESULT_CHARS {
        return s.to_owned();
    }
    let half = MAX_RESULT_CHARS / 2;
    let head: String = s.chars().take(half).collect();
    let tail: String = s.chars().skip(len - half).collect();
    format!("{head}...{tail}")
}

/// The observation appended after a tool call: `` \n```output\n{result}\n```\n ``.
pub fn format_observation(result: &str) -> String {
    format!("\n```output\n{result}\n```\n")
}

/// How a generation request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The last token is the end-of-sequence or padding token.
    Eos,
    /// A stop string was generated (it is part of the text).
    Stop,
    /// The token budget ran out.
    Length,
}

/// What the caller does after [`TirEpisode::consume_generation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Generate again, with [`TirEpisode::stop_strings`].
    Generate,
    /// The episode is over; score [`TirEpisode::completion`].
    Done,
    /// Run the call and pass its outcome to [`TirEpisode::record_tool_result`].
    Execute(ToolCall),
    /// The call was rejected without running; append this observation and generate again.
    Observe(String),
}

/// The TIR knobs, with upstream's `TIRConfig` defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TirConfig {
    /// Enabled tools; their order decides routing when several match.
    pub tools: Vec<Tool>,
    /// Tool calls allowed: generation goes on while at most this many calls were made.
    pub max_turns: usize,
}

impl Default for TirConfig {
    fn default() -> Self {
        TirConfig { tools: vec![Tool::Python], max_turns: 2 }
    }
}

/// One TIR episode's state: the completion so far (generated text and observations), whether a
/// tool call is open, and the call counters.
#[derive(Debug, Clone)]
pub struct TirEpisode {
    tools: Vec<Tool>,
    max_turns: usize,
    completion: String,
    /// Byte offset in `completion` of the open call's start marker; `None` while waiting for one.
    tool_start: Option<usize>,
    tool_calls: usize,
    tool_successes: usize,
}

impl TirEpisode {
    /// A fresh episode with nothing generated yet.
    pub fn new(config: &TirConfig) -> Self {
        TirEpisode {
            tools: config.tools.clone(),
            max_turns: config.max_turns,
            completion: String::new(),
            tool_start: None,
            tool_calls: 0,
            tool_successes: 0,
        }
    }

    /// Whether no tool call is open, so generation stops at start markers.
    pub fn waiting_for_tool_start(&self) -> bool {
        self.tool_start.is_none()
    }

    /// The stop strings of the next request: every enabled tool's start markers while waiting for a
    /// call, else every end marker.
    pub fn stop_strings(&self) -> Vec<&'static str> {
        let markers = if self.waiting_for_tool_start() { Tool::start_markers } else { Tool::end_markers };
        self.tools.iter().flat_map(|&tool| markers(tool)).copied().collect()
    }

    /// Everything after the prompt: generated text and observations, in order.
    pub fn completion(&self) -> &str {
        &self.completion
    }

    /// Tool calls made (executed or rejected); upstream's `tool_call_count` and `turn`.
    pub fn tool_calls(&self) -> usize {
        self.tool_calls
    }

    /// Tool calls that succeeded; upstream's `tool_success_count`.
    pub fn tool_successes(&self) -> usize {
        self.tool_successes
    }

    /// Whether another generation is allowed by the turn limit (upstream `turn <= max_turns`);
    /// the caller also stops at its token limit.
    pub fn within_turn_limit(&self) -> bool {
        self.tool_calls <= self.max_turns
    }

    /// Appends one generated piece of text and decides what comes next. The episode ends at an
    /// end-of-sequence token or when the piece [`is_answer`]. A piece stopped at a start marker
    /// opens a call; a piece stopped while a call is open closes it if the text since the start
    /// marker routes to a tool (the first enabled tool whose start and end markers it holds),
    /// otherwise generation continues to the next end marker.
    pub fn consume_generation(&mut self, text: &str, finish: FinishReason) -> Step {
        self.completion.push_str(text);
        if finish == FinishReason::Eos || is_answer(text) {
            return Step::Done;
        }
        if finish != FinishReason::Stop {
            return Step::Generate;
        }
        let Some(start) = self.tool_start else {
            let marker =
                self.tools.iter().flat_map(|&tool| tool.start_markers()).find(|m| text.ends_with(**m));
            if let Some(marker) = marker {
                self.tool_start = Some(self.completion.len() - marker.len());
            }
            return Step::Generate;
        };
        let call_text = &self.completion[start..];
        let Some(tool) = self.tools.iter().copied().find(|tool| tool.matches(call_text)) else {
            return Step::Generate;
        };
        let parsed = tool.parse_call(call_text);
        self.tool_start = None;
        self.tool_calls += 1;
        match parsed {
            Ok(call) => Step::Execute(call),
            Err(message) => {
                Step::Observe(self.record_tool_result(&ToolOutcome::Failed { message: message.to_owned() }))
            }
        }
    }

    /// Turns the outcome of the call from [`Step::Execute`] into its observation, appends it to the
    /// completion, counts a success, and returns the observation for the caller to append.
    pub fn record_tool_result(&mut self, outcome: &ToolOutcome) -> String {
        let (result, success) = outcome.result();
        self.tool_successes += usize::from(success);
        let observation = format_observation(&result);
        self.completion.push_str(&observation);
        observation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode(tools: &[Tool]) -> TirEpisode {
        TirEpisode::new(&TirConfig { tools: tools.to_vec(), max_turns: 2 })
    }

    fn python(stdout: &str, report: &str) -> ToolOutcome {
        ToolOutcome::Python { stdout: stdout.into(), report: report.into() }
    }

    #[test]
    fn stop_strings_follow_the_state() {
        let mut e = episode(&[Tool::Python, Tool::Calculator]);
        assert!(e.waiting_for_tool_start());
        assert_eq!(e.stop_strings(), vec!["```python", "<python>", "<calculator>"]);
        assert_eq!(e.consume_generation("Let me compute.\n```python", FinishReason::Stop), Step::Generate);
        assert!(!e.waiting_for_tool_start());
        assert_eq!(e.stop_strings(), vec!["```", "</python>", "</calculator>"]);
    }

    #[test]
    fn a_code_block_split_across_pieces() {
        let mut e = episode(&[Tool::Python]);
        assert_eq!(e.consume_generation("We count.\n```python", FinishReason::Stop), Step::Generate);
        assert_eq!(e.consume_generation("\ncount = 120", FinishReason::Length), Step::Generate);
        let step = e.consume_generation("\nprint(count)\n```", FinishReason::Stop);
        assert_eq!(step, Step::Execute(ToolCall::Python { code: "count = 120\nprint(count)".into() }));
        assert!(e.waiting_for_tool_start());
        let observation = e.record_tool_result(&python("120\n", "Done"));
        assert_eq!(observation, "\n```output\n120\n```\n");
        assert_eq!(
            e.completion(),
            "We count.\n```python\ncount = 120\nprint(count)\n```\n```output\n120\n```\n"
        );
        assert_eq!((e.tool_calls(), e.tool_successes()), (1, 1));
        assert_eq!(e.consume_generation("So the answer is \\boxed{120}.", FinishReason::Stop), Step::Done);
    }

    #[test]
    fn a_start_marker_must_end_the_piece() {
        let mut e = episode(&[Tool::Python]);
        assert_eq!(e.consume_generation("```python is a fence", FinishReason::Stop), Step::Generate);
        assert!(e.waiting_for_tool_start());
        assert_eq!(e.consume_generation("```python", FinishReason::Length), Step::Generate);
        assert!(e.waiting_for_tool_start(), "only a stop string opens a call");
    }

    #[test]
    fn calculator_calls_and_rejections() {
        let mut e = episode(&[Tool::Calculator]);
        e.consume_generation("Compute <calculator>", FinishReason::Stop);
        let step = e.consume_generation(" 1 + 2 * 3 </calculator>", FinishReason::Stop);
        assert_eq!(step, Step::Execute(ToolCall::Calculator { expression: "1 + 2 * 3".into() }));
        assert_eq!(
            e.record_tool_result(&ToolOutcome::Calculator { value: "7".into() }),
            "\n```output\n7\n```\n"
        );

        e.consume_generation(" then <calculator>", FinishReason::Stop);
        let step = e.consume_generation("2^3</calculator>", FinishReason::Stop);
        assert_eq!(
            step,
            Step::Observe(
                "\n```output\nError: Tool execution failed - Error: Invalid expression\n```\n".into()
            )
        );
        e.consume_generation(" and <calculator>", FinishReason::Stop);
        let step = e.consume_generation(" </calculator>", FinishReason::Stop);
        assert_eq!(
            step,
            Step::Observe(
                "\n```output\nError: Tool execution failed - Error: No expression provided\n```\n".into()
            )
        );
        assert_eq!((e.tool_calls(), e.tool_successes()), (3, 1));
        assert!(!e.within_turn_limit());
    }

    #[test]
    fn an_unrouted_piece_keeps_the_call_open() {
        let mut e = episode(&[Tool::Python, Tool::Calculator]);
        e.consume_generation("<calculator>", FinishReason::Stop);
        // Stopped at the Python end marker: no tool's markers enclose the text yet.
        assert_eq!(e.consume_generation("1 + 1 ```", FinishReason::Stop), Step::Generate);
        assert!(!e.waiting_for_tool_start());
        // Now the calculator's markers enclose it; the fence inside is not arithmetic.
        let step = e.consume_generation(" + 1</calculator>", FinishReason::Stop);
        let rejected = "\n```output\nError: Tool execution failed - Error: Invalid expression\n```\n";
        assert_eq!(step, Step::Observe(rejected.into()));
        assert_eq!(e.tool_calls(), 1);
    }

    #[test]
    fn python_code_formats_and_last_occurrences() {
        assert_eq!(extract_python_code("```python\na = 1\n```\n```python\nb = 2\n```"), "b = 2");
        assert_eq!(extract_python_code("<python>\nprint(2)\n</python>"), "print(2)");
        assert_eq!(extract_python_code("```PYTHON\nx\n```"), "x");
        assert_eq!(extract_python_code("```python print(1)```"), "");
        // Case-insensitive, lazy: the first closing tag in any case ends the block.
        let mut e = episode(&[Tool::Python]);
        e.consume_generation("<python>", FinishReason::Stop);
        let step = e.consume_generation("a = 1</PYTHON> b</python>", FinishReason::Stop);
        assert_eq!(step, Step::Execute(ToolCall::Python { code: "a = 1".into() }));
    }

    #[test]
    fn an_inline_fence_has_no_code() {
        let mut e = episode(&[Tool::Python]);
        e.consume_generation("```python", FinishReason::Stop);
        let step = e.consume_generation(" print(1)```", FinishReason::Stop);
        assert_eq!(
            step,
            Step::Observe(
                "\n```output\nError: Tool execution failed - Error: No code provided\n```\n".into()
            )
        );
        assert_eq!((e.tool_calls(), e.tool_successes()), (1, 0));
    }

    #[test]
    fn python_errors_and_long_output() {
        let mut e = episode(&[Tool::Python]);
        let shown = e.record_tool_result(&python("", "NameError: name 'x' is not defined"));
        assert_eq!(shown, "\n```output\nError: NameError: name 'x' is not defined\n```\n");
        assert_eq!(
            e.record_tool_result(&python("", "Timeout Error")),
            "\n```output\nError: Timeout Error\n```\n"
        );
        // Output mentioning an error does not count as a success either.
        e.record_tool_result(&python("ValueError handled", "Done"));
        assert_eq!(e.tool_successes(), 0);
        let failed = e.record_tool_result(&ToolOutcome::Failed { message: "division by zero".into() });
        assert_eq!(failed, "\n```output\nError: Tool execution failed - Error: division by zero\n```\n");

        let long: String = "é".repeat(200) + &"z".repeat(200);
        let shown = e.record_tool_result(&python(&format!("  {long}\n"), "Done"));
        assert_eq!(shown, format!("\n```output\n{}...{}\n```\n", "é".repeat(128), "z".repeat(128)));
        assert_eq!(truncate(&"a".repeat(256)), "a".repeat(256));
        assert_eq!(e.tool_successes(), 1);
    }

    #[test]
    fn answers_and_end_of_sequence_end_the_episode() {
        assert!(is_answer("thus \\boxed{42}"));
        assert!(is_answer("<answer>\n42\n</answer>"));
        assert!(!is_answer("\\boxed{4\n2}"));
        assert!(!is_answer("boxed{42} <answer>42"));
        let mut e = episode(&[Tool::Python]);
        assert_eq!(e.consume_generation("no answer", FinishReason::Eos), Step::Done);
        // An answer wins over an open call.
        let mut e = episode(&[Tool::Python]);
        assert_eq!(e.consume_generation("\\boxed{1}\n```python", FinishReason::Stop), Step::Done);
    }

    #[test]
    fn prompts_describe_the_enabled_tools() {
        let descriptions = tool_descriptions(&[Tool::Python, Tool::Calculator]);
        assert!(
            descriptions
                .starts_with("Tools List:\n\nTool Name: python_executor\nDescription: Execute Python code.")
        );
        assert!(descriptions.ends_with("Usage Example: <calculator>1 + 2 * 3</calculator>\n---"));
        assert!(descriptions.contains("print(f'The a+b result is {a+b}')\n```\n or \n<python>\na=1\n"));
        let system = system_prompt(&[Tool::Calculator]);
        assert!(system.starts_with("\nYou are a helpful assistant that can use tools to help the user.\n"));
        assert!(system.contains("following tools:\nTools List:\n\nTool Name: python calculator\n"));
        assert!(system.ends_with(
            "whenever possible.\nPlease reason step by step, and put your final answer within \\boxed{}.\n"
        ));
        assert_eq!(
            torl_prompt("What is 15 + 27?"),
            "A conversation between User and Assistant. The user asks a question, and the Assistant \
             solves it.\nUser:Please integrate natural language reasoning with programs to solve the problem \
             blow, and put your final answer within \\boxed{}..\nWhat is 15 + 27?\nAssistant:"
        );
    }
}
