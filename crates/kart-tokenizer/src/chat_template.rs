//! A model's Jinja chat template, rendered the way transformers' `apply_chat_template` renders it.
//!
//! The template comes from the folder's `chat_template.jinja` or, failing that, the
//! `chat_template` of `tokenizer_config.json` (a string, or a list of `{name, template}` of which
//! the `default` one is used). It runs in a minijinja environment set up like transformers'
//! sandboxed Jinja environment:
//! - `trim_blocks` and `lstrip_blocks`, no trailing newline kept, no autoescaping;
//! - `break` and `continue` in loops;
//! - `raise_exception(message)` and `strftime_now(format)` (local time);
//! - `tojson` with Python's `json.dumps` semantics and transformers' defaults (`ensure_ascii`
//!   false; `indent`, `separators` and `sort_keys` as in Python);
//! - Python's string, dict and list methods (`.strip()`, `.startswith()`, `.items()`, ...);
//! - the `{% generation %}` block transformers uses to mark the assistant's tokens, which
//!   renders its body.
//!
//! The template sees `messages`, `add_generation_prompt`, `tools` and `documents` (none unless
//! given), the named special tokens of `tokenizer_config.json` that are set (`bos_token`,
//! `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`) and any extra
//! variables, such as Qwen3's `enable_thinking`.
//!
//! ```no_run
//! # use kart_core::chat::ChatMessage;
//! # use kart_tokenizer::ChatTemplate;
//! let template = ChatTemplate::load("models/Qwen3-0.6B")?.expect("an instruct model");
//! let prompt = template.render(
//!     &[ChatMessage::new("user", "Who wrote Faust?")],
//!     true,
//!     serde_json::json!({"enable_thinking": false}),
//! )?;
//! # Ok::<(), kart_tokenizer::TokenizerError>(())
//! ```

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use regex::{Captures, Regex};
use serde::Deserialize;

use crate::error::TokenizerError;
use crate::file::FileError;
use crate::tokenizer::TokenizerConfig;
use kart_core::chat::ChatMessage;

/// The ChatML template of Qwen's instruct models without tools or thinking (that of the
/// fixtures), for tokenizers kart trains.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + \
    message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}\
    {{ '<|im_start|>assistant\n' }}{% endif %}";

/// The chat template of Qwen/Qwen2.5-*-Instruct on the Hub: ChatML with function calling in the
/// Hermes style (schemas in the system turn, calls in `<tool_call>` blocks, results as
/// `<tool_response>` blocks in a user turn), for tokenizers kart trains for tool calling.
pub const QWEN25: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

/// A compiled chat template with the special tokens it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The file the template was read from, for error messages.
    path: PathBuf,
    special_tokens: Vec<(&'static str, String)>,
}

/// The name of the one template in [`ChatTemplate::env`].
const TEMPLATE: &str = "chat_template";

/// Variables [`ChatTemplate::render`] sets from its own arguments.
const RESERVED: [&str; 2] = ["messages", "add_generation_prompt"];

/// The `chat_template` entry of `tokenizer_config.json`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum ConfigTemplate {
    Single(String),
    Named(Vec<NamedTemplate>),
}

/// One of several templates a `tokenizer_config.json` may name (`default`, `tool_use`, ...).
#[derive(Debug, Deserialize)]
pub(crate) struct NamedTemplate {
    name: String,
    template: String,
}

impl ChatTemplate {
    /// Loads the chat template of the Hugging Face model folder `dir`; `None` when it has none
    /// (a base model).
    pub fn load(dir: impl AsRef<Path>) -> Result<Option<Self>, TokenizerError> {
        let dir = dir.as_ref();
        let config = TokenizerConfig::read(dir)?;
        let special_tokens = config.special_tokens().map(|(name, token)| (name, token.to_string())).collect();
        let jinja = dir.join("chat_template.jinja");
        let (path, source) = match std::fs::read_to_string(&jinja) {
            Ok(source) => (jinja, source),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let path = dir.join("tokenizer_config.json");
                let source = match config.chat_template {
                    None => return Ok(None),
                    Some(ConfigTemplate::Single(source)) => source,
                    Some(ConfigTemplate::Named(templates)) => {
                        match templates.into_iter().find(|t| t.name == "default") {
                            Some(default) => default.template,
                            None => {
                                let reason = "`chat_template` names no `default` template".to_string();
                                return Err(TokenizerError::Template { path, reason });
                            }
                        }
                    }
                };
                (path, source)
            }
            Err(source) => return Err(FileError::Io { path: jinja, source }.into()),
        };
        Self::compile(path, &source, special_tokens).map(Some)
    }

    /// Compiles the template file `path` on its own, with no special tokens set (what
    /// transformers renders with `apply_chat_template(..., chat_template=source)`).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref().to_path_buf();
        let source =
            std::fs::read_to_string(&path).map_err(|source| FileError::Io { path: path.clone(), source })?;
        Self::compile(path, &source, Vec::new())
    }

    /// Compiles `source`, read from `path`, in transformers' environment.
    fn compile(
        path: PathBuf,
        source: &str,
        special_tokens: Vec<(&'static str, String)>,
    ) -> Result<Self, TokenizerError> {
        let error = |e: Error| TokenizerError::Template { path: path.clone(), reason: e.to_string() };
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(error)?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE, rewrite_generation_blocks(source).into_owned()).map_err(error)?;
        Ok(ChatTemplate { env, path, special_tokens })
    }

    /// Renders `messages`, ending with the assistant's header when `add_generation_prompt`.
    ///
    /// `extra` (a JSON object, or null) holds further template variables: `tools` (a list of
    /// JSON schemas), `documents`, or model-specific switches such as `enable_thinking`. They
    /// override the special tokens of the same name.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: serde_json::Value,
    ) -> Result<String, TokenizerError> {
        let extra = match extra {
            serde_json::Value::Null => serde_json::Map::new(),
            serde_json::Value::Object(extra) => extra,
            other => return Err(self.error(format!("extra variables must be a JSON object, not {other}"))),
        };
        if let Some(key) = RESERVED.into_iter().find(|key| extra.contains_key(*key)) {
            return Err(self.error(format!("`{key}` cannot be an extra variable")));
        }
        let special_tokens =
            self.special_tokens.iter().map(|(name, token)| (name.to_string(), Value::from(token.as_str())));
        let absent = ["tools", "documents"].map(|name| (name.to_string(), Value::from(())));
        let extra = extra.into_iter().map(|(name, value)| (name, Value::from(Serde(value))));
        let arguments = [
            ("messages".to_string(), Value::from(Serde(messages))),
            ("add_generation_prompt".to_string(), Value::from(add_generation_prompt)),
        ];
        // Later entries override earlier ones, as in `render(..., **{**special_tokens, **kwargs})`.
        let context = Value::from_pairs(special_tokens.chain(absent).chain(extra).chain(arguments));
        self.env
            .get_template(TEMPLATE)
            .and_then(|template| template.render(context))
            .map_err(|e| self.error(e.to_string()))
    }

    fn error(&self, reason: String) -> TokenizerError {
        TokenizerError::Template { path: self.path.clone(), reason }
    }
}

/// Turns transformers' `{% generation %}`/`{% endgeneration %}` block, which only marks the
/// assistant's tokens, into an always-true `if` with the same whitespace control.
fn rewrite_generation_blocks(source: &str) -> Cow<'_, str> {
    static TAG: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}").expect("a valid regex"));
    TAG.replace_all(source, |tag: &Captures| {
        let statement = if tag.get(2).is_some() { "endif" } else { "if true" };
        format!("{{%{} {statement} {}%}}", &tag[1], &tag[3])
    })
}

/// `raise_exception(message)`: fails the rendering with `message`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time formatted like Python's `datetime.now().strftime`.
fn strftime_now(format: &str) -> Result<String, Error> {
    jiff::fmt::strtime::format(format, &jiff::Zoned::now())
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now({format:?}): {e}")))
}

/// transformers' `tojson` filter: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, unlike Jinja's own, which escapes HTML characters.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(indent) => Some(match indent.as_str() {
            Some(indent) => indent.to_string(),
            None => " ".repeat(usize::try_from(i64::try_from(indent)?).unwrap_or(0)),
        }),
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(separators) => separator_pair(&separators)?,
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;

    let style = JsonStyle { ensure_ascii, indent, item_separator, key_separator, sort_keys };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(out)
}

/// The `(item_separator, key_separator)` argument of `tojson`.
fn separator_pair(separators: &Value) -> Result<(String, String), Error> {
    let invalid = || Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings");
    let parts: Vec<String> = separators
        .try_iter()?
        .map(|part| part.as_str().map(str::to_string).ok_or_else(invalid))
        .collect::<Result<_, _>>()?;
    match <[String; 2]>::try_from(parts) {
        Ok([item, key]) => Ok((item, key)),
        Err(_) => Err(invalid()),
    }
}

/// How Python's `json.dumps` lays out a value.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

impl JsonStyle {
    /// Writes `value`, nested `depth` containers deep.
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
            ValueKind::Number => out.push_str(&python_float(f64::try_from(value.clone())?)),
            ValueKind::String => self.write_string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, ('[', ']'), &items, depth, |out, item| {
                    self.write(out, item, depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut entries = value
                    .try_iter()?
                    .map(|key| Ok((self.key(&key)?, value.get_item(&key)?)))
                    .collect::<Result<Vec<_>, Error>>()?;
                if self.sort_keys {
                    entries.sort_by(|(a, _), (b, _)| a.cmp(b));
                }
                self.write_container(out, ('{', '}'), &entries, depth, |out, (key, value)| {
                    self.write_string(out, key);
                    out.push_str(&self.key_separator);
                    self.write(out, value, depth + 1)
                })?;
            }
            kind => {
                let message = format!("tojson: a value of type {kind} is not JSON serializable");
                return Err(Error::new(ErrorKind::InvalidOperation, message));
            }
        }
        Ok(())
    }

    /// Writes `[a, b]` or `{...}` around `items`, one per line when indenting.
    fn write_container<T>(
        &self,
        out: &mut String,
        (open, close): (char, char),
        items: &[T],
        depth: usize,
        mut write_item: impl FnMut(&mut String, &T) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if !items.is_empty() {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&self.item_separator);
                }
                self.newline(out, depth + 1);
                write_item(out, item)?;
            }
            self.newline(out, depth);
        }
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    /// A map key as Python's `json.dumps` writes it: strings as they are, scalars as JSON text.
    fn key(&self, key: &Value) -> Result<String, Error> {
        match key.kind() {
            ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
            ValueKind::None | ValueKind::Bool | ValueKind::Number => {
                let mut out = String::new();
                self.write(&mut out, key, 0)?;
                Ok(out)
            }
            kind => {
                let message = format!("tojson: keys must be strings or scalars, not {kind}");
                Err(Error::new(ErrorKind::InvalidOperation, message))
            }
        }
    }

    /// A JSON string with Python's escapes: `\uXXXX` for control characters and, with
    /// `ensure_ascii`, everything outside printable ASCII.
    fn write_string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if c < ' ' || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr` of a float: the shortest digits that round-trip, in positional notation for
/// exponents from -4 to 15 and scientific (`1e-05`, `1e+16`) otherwise.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let positional = f.to_string();
        if positional.contains('.') { positional } else { format!("{positional}.0") }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A template compiled with Qwen's special tokens.
    fn qwen(source: &str) -> ChatTemplate {
        let special_tokens =
            vec![("eos_token", "<|im_end|>".to_string()), ("pad_token", "<|endoftext|>".to_string())];
        ChatTemplate::compile(PathBuf::from("chat_template.jinja"), source, special_tokens).unwrap()
    }

    fn messages(roles_and_contents: &[(&str, &str)]) -> Vec<ChatMessage> {
        roles_and_contents.iter().map(|&(role, content)| ChatMessage::new(role, content)).collect()
    }

    /// A system prompt, a question and an answer with reasoning.
    fn conversation() -> Vec<ChatMessage> {
        messages(&[
            ("system", "You are a search agent."),
            ("user", "Who wrote Faust? Answer in «quotes»."),
            ("assistant", "<think>\nGoethe, surely.\n</think>\n\n<answer>Goethe</answer>"),
        ])
    }

    fn search_tool() -> serde_json::Value {
        json!([{"type": "function", "function": {
            "name": "search",
            "description": "Search Wikipédia & the web <fast>",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"},
                "topk": {"type": "integer", "default": 3},
                "weight": {"type": "number", "default": 0.5}
            }, "required": ["query"]}
        }}])
    }

    // Expected renderings below come from jinja2 3.1 in transformers' environment
    // (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with its `tojson`,
    // `raise_exception`, `strftime_now`, loop controls and generation tracking).

    /// The chat template of Qwen/Qwen3-* on the Hub.
    const QWEN3_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

    const QWEN25_CONVERSATION: &str = "<|im_start|>system\nYou are a search agent.<|im_end|>\n<|im_start|>user\nWho wrote Faust? Answer in «quotes».<|im_end|>\n<|im_start|>assistant\n<think>\nGoethe, surely.\n</think>\n\n<answer>Goethe</answer><|im_end|>\n";
    const QWEN25_GENERATION_PROMPT: &str = "<|im_start|>system\nYou are a search agent.<|im_end|>\n<|im_start|>user\nWho wrote Faust? Answer in «quotes».<|im_end|>\n<|im_start|>assistant\n";
    const QWEN25_TOOLS: &str = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search Wikipédia & the web <fast>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}, \"topk\": {\"type\": \"integer\", \"default\": 3}, \"weight\": {\"type\": \"number\", \"default\": 0.5}}, \"required\": [\"query\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWho wrote Faust? Answer in «quotes».<|im_end|>\n<|im_start|>assistant\n";
    const QWEN3_CONVERSATION: &str = "<|im_start|>system\nYou are a search agent.<|im_end|>\n<|im_start|>user\nWho wrote Faust? Answer in «quotes».<|im_end|>\n<|im_start|>assistant\n<think>\nGoethe, surely.\n</think>\n\n<answer>Goethe</answer><|im_end|>\n";
    const QWEN3_NO_THINKING: &str = "<|im_start|>system\nYou are a search agent.<|im_end|>\n<|im_start|>user\nWho wrote Faust? Answer in «quotes».<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const QWEN3_MULTI_TURN: &str = "<|im_start|>user\nfirst question<|im_end|>\n<|im_start|>assistant\nold answer<|im_end|>\n<|im_start|>user\nsecond question<|im_end|>\n<|im_start|>assistant\n";
    const TOJSON_TEMPLATE: &str = "{{ x | tojson }}\n{{ x | tojson(indent=2) }}\n{{ x | tojson(ensure_ascii=True, sort_keys=True) }}\n{{ x | tojson(separators=(',', ':')) }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson }}{{ x.nested | tojson(indent='\\t') }}";
    const TOJSON_EXPECTED: &str = "{\"name\": \"Zürich 😀\", \"ctrl\": \"a\\u0001\\tb\\\"\\\\\", \"del\": \"\u{7f}\", \"n\": [1, -2, 2.0, 0.5, 1e-05, 1e+16, 123456.789, -0.0], \"nested\": {\"b\": true, \"a\": null}, \"empty\": []}\n{\n  \"name\": \"Zürich 😀\",\n  \"ctrl\": \"a\\u0001\\tb\\\"\\\\\",\n  \"del\": \"\u{7f}\",\n  \"n\": [\n    1,\n    -2,\n    2.0,\n    0.5,\n    1e-05,\n    1e+16,\n    123456.789,\n    -0.0\n  ],\n  \"nested\": {\n    \"b\": true,\n    \"a\": null\n  },\n  \"empty\": []\n}\n{\"ctrl\": \"a\\u0001\\tb\\\"\\\\\", \"del\": \"\\u007f\", \"empty\": [], \"n\": [1, -2, 2.0, 0.5, 1e-05, 1e+16, 123456.789, -0.0], \"name\": \"Z\\u00fcrich \\ud83d\\ude00\", \"nested\": {\"a\": null, \"b\": true}}\n{\"name\":\"Zürich 😀\",\"ctrl\":\"a\\u0001\\tb\\\"\\\\\",\"del\":\"\u{7f}\",\"n\":[1,-2,2.0,0.5,1e-05,1e+16,123456.789,-0.0],\"nested\":{\"b\":true,\"a\":null},\"empty\":[]}\n[]{}{\n\t\"b\": true,\n\t\"a\": null\n}";
    const PYCOMPAT_TEMPLATE: &str = "{%- for m in messages %}\n{%- if loop.index0 == 2 %}{% break %}{% endif %}\n{%- if m.role == 'system' %}{% continue %}{% endif %}\n{{ m.role.upper() }}: {{ m.content.strip().split(' ')[-1] }} {{ m.content.startswith('Who') }} {{ m.content.replace('Faust', 'Werther') }} {{ m.content.endswith('?') }}\n{%- endfor %}\n{{ x.nested.a }} {{ x.nested.b }} {{ x.nested.get('c', 'default') }} {{ x.nested.items() | list | length }} {{ '{}-{}'.format(1, 'a') }}";
    const PYCOMPAT_EXPECTED: &str = "USER: Faust? False   Who wrote Werther?   FalseNone True default 2 1-a";
    const GENERATION_TEMPLATE: &str = "{%- for m in messages %}\n{{- m.role }}:{% generation %}\n    {{ m.content }}\n{% endgeneration %}\n{%- endfor %}";
    const GENERATION_EXPECTED: &str = "user:      Who wrote Faust?  \nsystem:    sys\nassistant:    Goethe\n";

    #[test]
    fn fixture_templates_match_transformers() {
        for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
            let expected: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(kart_testing::model(name).join("expected.json")).unwrap(),
            )
            .unwrap();
            let template = ChatTemplate::load(kart_testing::model(name)).unwrap().unwrap();
            let prompt = template.render(&messages(&[("user", "hi")]), true, json!(null)).unwrap();
            assert_eq!(prompt, expected["chat_template_example"].as_str().unwrap(), "{name}");
        }
    }

    #[test]
    fn qwen25_hub_template() {
        let template = qwen(QWEN25);
        let conversation = conversation();
        assert_eq!(template.render(&conversation, false, json!(null)).unwrap(), QWEN25_CONVERSATION);
        assert_eq!(template.render(&conversation[..2], true, json!({})).unwrap(), QWEN25_GENERATION_PROMPT);
        let with_tools = template.render(&conversation[1..2], true, json!({"tools": search_tool()}));
        assert_eq!(with_tools.unwrap(), QWEN25_TOOLS);
    }

    #[test]
    fn qwen3_hub_template() {
        let template = qwen(QWEN3_TEMPLATE);
        let conversation = conversation();
        assert_eq!(template.render(&conversation, false, json!(null)).unwrap(), QWEN3_CONVERSATION);
        let no_thinking = template.render(&conversation[..2], true, json!({"enable_thinking": false}));
        assert_eq!(no_thinking.unwrap(), QWEN3_NO_THINKING);
        let multi_turn = messages(&[
            ("user", "first question"),
            ("assistant", "<think>\nold reasoning\n</think>\n\nold answer"),
            ("user", "second question"),
        ]);
        assert_eq!(template.render(&multi_turn, true, json!(null)).unwrap(), QWEN3_MULTI_TURN);
    }

    #[test]
    fn tojson_follows_python_json_dumps() {
        let x = json!({
            "name": "Zürich 😀",
            "ctrl": "a\u{1}\tb\"\\",
            "del": "\u{7f}",
            "n": [1, -2, 2.0, 0.5, 1e-05, 1e16, 123456.789, -0.0],
            "nested": {"b": true, "a": null},
            "empty": []
        });
        let rendered = qwen(TOJSON_TEMPLATE).render(&[], false, json!({"x": x})).unwrap();
        assert_eq!(rendered, TOJSON_EXPECTED);
    }

    #[test]
    fn python_methods_and_loop_controls() {
        let messages =
            messages(&[("user", "  Who wrote Faust?  "), ("system", "sys"), ("assistant", "Goethe")]);
        let x = json!({"nested": {"b": true, "a": null}});
        let rendered = qwen(PYCOMPAT_TEMPLATE).render(&messages, false, json!({"x": x})).unwrap();
        assert_eq!(rendered, PYCOMPAT_EXPECTED);
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let messages =
            messages(&[("user", "  Who wrote Faust?  "), ("system", "sys"), ("assistant", "Goethe")]);
        let rendered = qwen(GENERATION_TEMPLATE).render(&messages, false, json!(null)).unwrap();
        assert_eq!(rendered, GENERATION_EXPECTED);
    }

    #[test]
    fn raise_exception_fails_the_rendering() {
        let template = qwen(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations start with the user!') }}{% endif %}ok",
        );
        assert_eq!(template.render(&messages(&[("user", "hi")]), false, json!(null)).unwrap(), "ok");
        let err = template.render(&messages(&[("assistant", "hi")]), false, json!(null)).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("chat_template.jinja") && message.contains("Conversations start with the user!"),
            "{message}"
        );
    }

    #[test]
    fn strftime_now_formats_the_local_time() {
        let year = jiff::Zoned::now().year().to_string();
        let rendered = qwen("{{ strftime_now('%Y') }}").render(&[], false, json!(null)).unwrap();
        assert_eq!(rendered, year);
    }

    #[test]
    fn special_tokens_and_extra_variables() {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({
            "bos_token": null,
            "eos_token": {"content": "<|im_end|>", "lstrip": false},
            "pad_token": "<|endoftext|>",
            "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|{{ tools }}|{{ enable_thinking }}"
        });
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let template = ChatTemplate::load(dir.path()).unwrap().unwrap();
        let rendered = template.render(&[], false, json!({"enable_thinking": true})).unwrap();
        assert_eq!(rendered, "|<|im_end|>|<|endoftext|>|False|None|True");
        let err = template.render(&[], false, json!({"messages": []})).unwrap_err();
        assert!(err.to_string().contains("`messages`"), "{err}");
        assert!(template.render(&[], false, json!([1])).is_err());
    }

    #[test]
    fn template_sources() {
        // The `default` of several named templates.
        let dir = tempfile::tempdir().unwrap();
        let config = json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "default"}
        ]});
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let template = ChatTemplate::load(dir.path()).unwrap().unwrap();
        assert_eq!(template.render(&[], false, json!(null)).unwrap(), "default");

        // chat_template.jinja takes precedence over tokenizer_config.json.
        std::fs::write(dir.path().join("chat_template.jinja"), "jinja\n").unwrap();
        let template = ChatTemplate::load(dir.path()).unwrap().unwrap();
        assert_eq!(template.render(&[], false, json!(null)).unwrap(), "jinja");

        // A base model has no template.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "</s>"}"#).unwrap();
        assert!(ChatTemplate::load(dir.path()).unwrap().is_none());
        assert!(ChatTemplate::load(tempfile::tempdir().unwrap().path()).unwrap().is_none());
    }

    #[test]
    fn a_syntax_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), "{% for m in messages %}{{ m.content }}")
            .unwrap();
        let err = ChatTemplate::load(dir.path()).unwrap_err();
        assert!(matches!(err, TokenizerError::Template { .. }), "{err}");
        assert!(err.to_string().contains("chat_template.jinja"), "{err}");
    }
}
