//! The `tools` environment: a chat model calls functions in the format its chat template teaches
//! (Hermes `<tool_call>` blocks for Qwen, JSON for Llama 3.1), until it answers without a call.
//!
//! The prompt is the task's messages rendered by the model's own template with the offered
//! function schemas (`tools=`, as transformers renders them). After a turn with calls, each call
//! runs on its back end ([`Functions`](kart_tools::functions::Functions)) and its result, or the
//! reason it failed, becomes a `tool` message; what the environment appends (masked) is exactly
//! the text the template puts between the model's turn and the next generation prompt, so the
//! token stream is the one the template would render for the conversation. A call that cannot be
//! read, names no offered function or does not fit its schema gets an `Error: …` response and
//! counts as failed.

use super::turns::{Agent, Generated, Next, Protocol, Start, Turn};
use super::{Context, RolloutError};
use futures::future::join_all;
use kart_core::agent::function_calls::{self, Malformed, parse};
use kart_core::agent::trajectory::Trajectory;
use kart_core::chat::{ChatMessage, ToolCall};
pub use kart_core::config::env::{AnswerFormat, Score, ToolsConfig};
use kart_core::generation::FinishReason;
use kart_core::reward::{asearcher, math, search_r1};
use kart_core::wire::Task;
use kart_tokenizer::ChatTemplate;
use serde_json::{Value, json};

/// The tools environment.
#[derive(Debug, Clone)]
pub struct ToolsEnv {
    config: ToolsConfig,
}

impl ToolsEnv {
    pub fn new(config: ToolsConfig) -> Self {
        ToolsEnv { config }
    }
}

/// A conversation with function calls as the chat template renders it, grown turn by turn: the
/// messages so far, the schemas offered, and the rendering of both with the generation prompt
/// (the text of the token stream so far, the model's turns as the template would write them).
#[derive(Debug, Clone)]
pub struct Conversation {
    offered: Vec<Value>,
    messages: Vec<ChatMessage>,
    rendered: String,
}

impl Conversation {
    /// The conversation of `messages` offering `offered`, rendered up to the first generation.
    pub fn start(
        template: &ChatTemplate,
        messages: Vec<ChatMessage>,
        offered: Vec<Value>,
    ) -> Result<Self, RolloutError> {
        let mut conversation = Conversation { offered, messages, rendered: String::new() };
        conversation.rendered = conversation.render(template, true)?;
        Ok(conversation)
    }

    /// The prompt: the rendering so far.
    pub fn prompt(&self) -> &str {
        &self.rendered
    }

    /// The function schemas offered.
    pub fn offered(&self) -> &[Value] {
        &self.offered
    }

    fn render(&self, template: &ChatTemplate, generation_prompt: bool) -> Result<String, RolloutError> {
        Ok(template.render(&self.messages, generation_prompt, json!({"tools": self.offered}))?)
    }

    /// Adds the model's turn `assistant` (which ended with `end_token`, when it did) and the
    /// tool messages `responses`, and returns the text that follows the model's turn up to the
    /// next generation prompt: the template's own end of the assistant turn after the model's
    /// end-of-turn token, then the tool messages and the generation prompt as it renders them.
    pub fn respond(
        &mut self,
        template: &ChatTemplate,
        assistant: ChatMessage,
        end_token: Option<&str>,
        responses: Vec<ChatMessage>,
    ) -> Result<String, RolloutError> {
        self.messages.push(assistant);
        let with_turn = self.render(template, false)?;
        self.messages.extend(responses);
        let full = self.render(template, true)?;
        let unstable =
            |what: &str| RolloutError::Template(format!("rendering {what} changes the text before it"));
        let turn =
            with_turn.strip_prefix(self.rendered.as_str()).ok_or_else(|| unstable("an assistant turn"))?;
        let after = full.strip_prefix(with_turn.as_str()).ok_or_else(|| unstable("tool messages"))?;
        let tail = match end_token.and_then(|end| turn.rfind(end).map(|at| at + end.len())) {
            Some(at) => &turn[at..],
            None => "",
        };
        let text = format!("{tail}{after}");
        self.rendered = full;
        Ok(text)
    }
}

/// One episode: its conversation, and where it stands.
pub struct ToolsEpisode<'a> {
    config: &'a ToolsConfig,
    conversation: Conversation,
    /// Turns whose calls ran.
    call_rounds: usize,
    /// The final message, once the model answered without a call.
    answer: Option<String>,
    over: bool,
}

impl ToolsEpisode<'_> {
    /// The response of one call: the function's result, or `Error: …` (a failed call).
    async fn respond_to(
        &self,
        ctx: &Context,
        call: &Result<ToolCall, Malformed>,
    ) -> (String, Result<String, String>) {
        let call = match call {
            Ok(call) => call,
            Err(bad) => return (bad.name.clone().unwrap_or_else(|| "invalid".into()), Err(bad.message())),
        };
        let name = call.function.name.clone();
        if let Err(bad) = function_calls::check(call, self.conversation.offered()) {
            // A name that is not offered is counted apart, so metrics stay bounded by the config.
            let counted = if bad.reason.starts_with("no function named") { "unknown".into() } else { name };
            return (counted, Err(bad.message()));
        }
        let Some(function) = ctx.functions.get(&name) else {
            return (name.clone(), Err(format!("Error: `{name}` has no back end on this worker")));
        };
        let result = function.call(&call.function.arguments).await.map_err(|e| format!("Error: {e}"));
        (name, result)
    }

    /// Cuts a tool response to the configured number of tokens.
    fn cut(&self, ctx: &Context, text: String) -> Result<String, RolloutError> {
        let ids = ctx.tokenizer.encode_cached(&text)?;
        if ids.len() <= self.config.max_tool_response_tokens {
            return Ok(text);
        }
        Ok(ctx.tokenizer.decode(&ids[..self.config.max_tool_response_tokens], false)?)
    }
}

/// The chat template of `ctx`, which this environment cannot do without.
fn template(ctx: &Context) -> Result<&ChatTemplate, RolloutError> {
    ctx.chat_template.as_ref().ok_or_else(|| {
        RolloutError::Template("the model folder has no chat template (chat_template.jinja)".into())
    })
}

impl Protocol for ToolsEpisode<'_> {
    fn next_turn(&mut self) -> Option<Turn> {
        (!self.over).then(|| Turn {
            context: None,
            max_new_tokens: Some(self.config.max_response_length),
            stop: Vec::new(),
        })
    }

    async fn respond(&mut self, ctx: &Context, turn: Generated<'_>) -> Result<Next, RolloutError> {
        let Generated { generation, cut_by_cap, trajectory, .. } = turn;
        self.over = true;
        if cut_by_cap || generation.finish_reason == FinishReason::Length {
            return Ok(Next::Truncated);
        }
        // The turn without its end-of-turn token, which the template writes itself.
        let ended = ctx.ends_sequence(&generation.token_ids) && !generation.token_ids.is_empty();
        let body_ids = &generation.token_ids[..generation.token_ids.len() - usize::from(ended)];
        let body = ctx.tokenizer.decode(body_ids, false)?;
        let end_token = match ended {
            true => Some(ctx.tokenizer.decode(&generation.token_ids[body_ids.len()..], false)?),
            false => None,
        };
        let parsed = parse(self.config.format, &body);
        if parsed.calls.is_empty() {
            // A valid final turn holds an answer where the config looks for one.
            trajectory.stats.valid_actions +=
                u32::from(extract(self.config.answer, &parsed.content).is_some());
            self.answer = Some(parsed.content);
            return Ok(Next::Done);
        }
        if self.call_rounds == self.config.max_turns {
            // Out of rounds: the episode ends without an answer.
            return Ok(Next::Done);
        }
        self.call_rounds += 1;
        let outcomes = join_all(parsed.calls.iter().map(|call| self.respond_to(ctx, call))).await;
        let mut responses = Vec::with_capacity(outcomes.len());
        for (name, result) in outcomes {
            trajectory.stats.record_tool_call(&name, result.is_ok());
            let text = result.unwrap_or_else(|error| error);
            responses.push(ChatMessage::new("tool", self.cut(ctx, text)?));
        }
        // A valid call turn is one whose calls could all be read.
        trajectory.stats.valid_actions += u32::from(parsed.calls.iter().all(Result::is_ok));
        let calls = parsed.calls.into_iter().filter_map(Result::ok).collect();
        let assistant = ChatMessage::assistant(parsed.content, calls);
        let text = self.conversation.respond(template(ctx)?, assistant, end_token.as_deref(), responses)?;
        self.over = false;
        Ok(Next::Observe { text, max_tokens: None })
    }

    fn reward(&self, _ctx: &Context, task: &Task, _trajectory: &Trajectory) -> Result<f64, RolloutError> {
        let Some(answer) = self.answer.as_deref().and_then(|text| extract(self.config.answer, text)) else {
            return Ok(0.0);
        };
        let gold = &task.ground_truth;
        let hit = |b: bool| if b { 1.0 } else { 0.0 };
        Ok(match self.config.score {
            Score::Em => hit(search_r1::em_check(&answer, gold)),
            Score::SubEm => hit(search_r1::subem_check(&answer, gold)),
            Score::F1 => gold.iter().map(|g| asearcher::f1_score(&answer, g)).fold(0.0, f64::max),
            Score::Math => hit(gold.first().is_some_and(|g| math::is_equivalent(&answer, g))),
        })
    }
}

/// The answer a final message holds, per `format`.
fn extract(format: AnswerFormat, text: &str) -> Option<String> {
    match format {
        AnswerFormat::Tagged => asearcher::extract_solution(text).map(str::to_owned),
        AnswerFormat::Boxed => math::extract_answer(text),
        AnswerFormat::Content => Some(text.trim().to_owned()),
    }
}

impl Agent for ToolsEnv {
    type Protocol<'a> = ToolsEpisode<'a>;
    const NAME: &'static str = "tools";

    fn start<'a>(&'a self, ctx: &Context, task: &Task) -> Result<Start<ToolsEpisode<'a>>, RolloutError> {
        let mut messages = task.messages_or(|q| Ok(q.to_owned()))?;
        if !self.config.system_prompt.is_empty() && messages.first().is_none_or(|m| m.role != "system") {
            messages.insert(0, ChatMessage::new("system", self.config.system_prompt.clone()));
        }
        let offered = task.tools.clone().unwrap_or_else(|| ctx.functions.schemas());
        let conversation = Conversation::start(template(ctx)?, messages, offered)?;
        let prompt_ids = ctx.tokenizer.encode(conversation.prompt(), false)?;
        let episode =
            ToolsEpisode { config: &self.config, conversation, call_rounds: 0, answer: None, over: false };
        Ok(Start { prompt_ids, protocol: episode, max_tokens: self.config.max_trajectory_tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Reply, ScriptedEngine};
    use kart_core::agent::function_calls::CallFormat;
    use kart_core::agent::trajectory::Status;
    use kart_core::config::env::EnvConfig;
    use kart_core::config::functions::{Builtin, FunctionConfig};
    use kart_core::config::rollout::ContextConfig;
    use kart_core::generation::SamplingParams;
    use kart_tokenizer::Tokenizer;
    use std::path::Path;
    use std::sync::Arc;

    /// A tool-calling model folder (the fixtures' template on tiny-qwen2's tokenizer).
    fn model_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        kart_testing::tool_calling_model(dir.path());
        dir
    }

    async fn context(dir: &Path, config: &ToolsConfig, replies: Vec<&'static str>) -> Context {
        let engine = ScriptedEngine::new(Tokenizer::load(dir).unwrap(), move |_, call| {
            Reply::Text(replies.get(call).copied().unwrap_or("<|im_end|>").to_owned())
        });
        let env = EnvConfig::Tools(config.clone());
        Context::build(&ContextConfig::default(), &env, Arc::new(engine), dir, None).await.unwrap()
    }

    fn calculator_only() -> ToolsConfig {
        ToolsConfig {
            functions: vec![FunctionConfig::Builtin(Builtin::Calculator)],
            ..ToolsConfig::default()
        }
    }

    fn task(tools: Option<Vec<Value>>) -> Task {
        Task {
            id: "q".into(),
            messages: None,
            prompt: Some("What is 6 times 7?".into()),
            ground_truth: vec!["42".into()],
            data_source: "math".into(),
            tools,
        }
    }

    async fn run(config: &ToolsConfig, ctx: &Context, task: &Task) -> Trajectory {
        ToolsEnv::new(config.clone()).run(ctx, task, "t".into(), &SamplingParams::default()).await.unwrap()
    }

    /// The text of the tokens with loss mask `mask`, in runs.
    fn runs(ctx: &Context, t: &Trajectory, mask: u8) -> Vec<String> {
        let mut runs: Vec<Vec<u32>> = Vec::new();
        let mut previous = None;
        for (i, (&id, &m)) in t.token_ids().iter().zip(t.loss_mask()).enumerate().skip(t.prompt_len()) {
            if m == mask {
                if previous != Some(i - 1) {
                    runs.push(Vec::new());
                }
                runs.last_mut().unwrap().push(id);
                previous = Some(i);
            }
        }
        runs.iter().map(|ids| ctx.tokenizer.decode(ids, false).unwrap()).collect()
    }

    #[tokio::test]
    async fn a_call_then_an_answer_is_the_conversation_the_template_renders() {
        let dir = model_dir();
        let config = calculator_only();
        let call = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6 * 7\"}}\n</tool_call><|im_end|>";
        let ctx = context(dir.path(), &config, vec![call, "<answer>42</answer><|im_end|>"]).await;
        let t = run(&config, &ctx, &task(None)).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 1.0));
        assert_eq!((t.stats.tool_calls["calculator"].ok, t.stats.tool_calls["calculator"].failed), (1, 0));
        assert_eq!((t.stats.valid_actions, t.stats.turns), (2, 2), "a readable call, then an answer");
        let conversation = [
            ChatMessage::new("user", "What is 6 times 7?"),
            ChatMessage::assistant(
                "",
                vec![ToolCall::function("calculator", json!({"expression": "6 * 7"}))],
            ),
            ChatMessage::new("tool", "42"),
            ChatMessage::new("assistant", "<answer>42</answer>"),
        ];
        let template = ChatTemplate::load(dir.path()).unwrap().unwrap();
        let tools = json!({"tools": ctx.functions.schemas()});
        let rendered = template.render(&conversation, false, tools).unwrap();
        let text = ctx.tokenizer.decode(t.token_ids(), false).unwrap();
        assert_eq!(
            text,
            rendered.strip_suffix('\n').unwrap(),
            "the token stream is the template's rendering"
        );
        assert_eq!(
            runs(&ctx, &t, 1),
            [call, "<answer>42</answer><|im_end|>"],
            "the model's tokens, as sampled"
        );
        let observation =
            "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(runs(&ctx, &t, 0), [observation], "the tool response is masked");
    }

    #[tokio::test]
    async fn bad_calls_are_answered_with_their_error_and_count_as_failed() {
        let dir = model_dir();
        let config = calculator_only();
        let calls = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": }}\n</tool_call>\n\
            <tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"6 * 7\"}}\n</tool_call>\n\
            <tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expr\": \"6 * 7\"}}\n</tool_call>\n\
            <tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6 / 0\"}}\n</tool_call><|im_end|>";
        let ctx = context(dir.path(), &config, vec![calls, "<answer>41</answer><|im_end|>"]).await;
        let t = run(&config, &ctx, &task(None)).await;
        assert_eq!((t.status, t.reward), (Status::Completed, 0.0));
        assert_eq!((t.stats.valid_actions, t.stats.turns), (1, 2), "one call could not be read");
        let failed = |name: &str| t.stats.tool_calls.get(name).map(|c| (c.ok, c.failed));
        assert_eq!(
            (failed("invalid"), failed("unknown"), failed("calculator")),
            (Some((0, 1)), Some((0, 1)), Some((0, 2)))
        );
        let observation = &runs(&ctx, &t, 0)[0];
        let responses: Vec<&str> = observation
            .split("<tool_response>\n")
            .skip(1)
            .map(|r| r.split("\n</tool_response>").next().unwrap())
            .collect();
        assert!(responses[0].starts_with("Error: the tool call is not valid JSON"), "{responses:?}");
        assert_eq!(responses[1], "Error: no function named `search`; the functions are: calculator");
        assert_eq!(responses[2], "Error: `calculator` needs the argument `expression`");
        assert!(
            responses[3].starts_with("Error: ") && responses[3].contains("division by zero"),
            "{responses:?}"
        );
    }

    #[tokio::test]
    async fn a_turn_stops_at_max_response_length_and_truncates_the_episode() {
        let dir = model_dir();
        let long = "<answer>42</answer> and a long afterthought that goes on and on<|im_end|>";
        for (limit, status) in [(6, Status::Truncated), (200, Status::Completed)] {
            let config = ToolsConfig { max_response_length: limit, ..calculator_only() };
            let ctx = context(dir.path(), &config, vec![long]).await;
            let t = run(&config, &ctx, &task(None)).await;
            assert_eq!(t.status, status, "max_response_length {limit}");
            if status == Status::Truncated {
                assert_eq!(t.stats.response_tokens, 6);
            }
        }
    }

    #[tokio::test]
    async fn a_task_offers_its_own_schemas_and_rounds_are_bounded() {
        let dir = model_dir();
        let config = ToolsConfig { max_turns: 1, ..calculator_only() };
        let call = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6 * 7\"}}\n</tool_call><|im_end|>";
        let ctx = context(dir.path(), &config, vec![call, call, "<answer>42</answer><|im_end|>"]).await;
        let schema = json!({"type": "function", "function": {"name": "calculator", "description": "Multiplies for you.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}});
        let t = run(&config, &ctx, &task(Some(vec![schema]))).await;
        let prompt = ctx.tokenizer.decode(&t.token_ids()[..t.prompt_len()], false).unwrap();
        assert!(
            prompt.contains("Multiplies for you.") && !prompt.contains("Evaluate an arithmetic"),
            "{prompt}"
        );
        assert_eq!(t.stats.tool_calls["calculator"].ok, 1, "the second round was not run");
        assert_eq!(
            (t.status, t.reward, t.stats.turns),
            (Status::Completed, 0.0, 2),
            "out of rounds: no answer"
        );
    }

    #[tokio::test]
    async fn llama3_json_calls_run_too() {
        let dir = model_dir();
        let config = ToolsConfig { format: CallFormat::Llama3Json, ..calculator_only() };
        let call = "{\"name\": \"calculator\", \"parameters\": {\"expression\": \"6 * 7\"}}<|im_end|>";
        let ctx = context(dir.path(), &config, vec![call, "<answer>42</answer><|im_end|>"]).await;
        let t = run(&config, &ctx, &task(None)).await;
        assert_eq!((t.reward, t.stats.tool_calls["calculator"].ok), (1.0, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reward_services_join_the_rule_and_a_failing_one_aborts() {
        use kart_core::config::functions::CallLimits;
        use kart_core::config::reward::{HttpReward, RewardConfig, RewardService};
        let app = axum::Router::new().route(
            "/score",
            axum::routing::post(|| async {
                axum::Json(json!({"scores": [{"score": 0.5, "metrics": {"x": 2.0}}]}))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let dir = model_dir();
        let config = calculator_only();
        let service = |path: &str| HttpReward {
            name: "rm".into(),
            url: format!("{url}{path}"),
            weight: 2.0,
            batch_size: 1,
            batch_wait_ms: 0,
            limits: CallLimits { retry: Default::default(), ..CallLimits::default() },
        };
        for (path, expect) in [("/score", Some(0.5 * 1.0 + 2.0 * 0.5)), ("/missing", None)] {
            let reward =
                RewardConfig { rule_weight: 0.5, services: vec![RewardService::Http(service(path))] };
            let engine = ScriptedEngine::new(Tokenizer::load(dir.path()).unwrap(), |_, _| {
                Reply::Text("<answer>42</answer><|im_end|>".into())
            });
            let context = ContextConfig { reward, ..ContextConfig::default() };
            let env = EnvConfig::Tools(config.clone());
            let ctx = Context::build(&context, &env, Arc::new(engine), dir.path(), None).await.unwrap();
            let t = run(&config, &ctx, &task(None)).await;
            match expect {
                Some(reward) => {
                    assert_eq!((t.status, t.reward), (Status::Completed, reward));
                    let parts = &t.stats.reward_scores;
                    assert_eq!((parts["rule"], parts["rm"], parts["rm/x"]), (1.0, 0.5, 2.0));
                }
                None => assert_eq!(t.status, Status::Aborted, "a 404 from the service is not a zero"),
            }
        }
    }

    #[tokio::test]
    async fn functions_without_a_back_end_or_with_one_name_twice_are_refused() {
        let dir = model_dir();
        let path = dir.path().to_path_buf();
        let build = |functions: Vec<FunctionConfig>| {
            let engine =
                ScriptedEngine::new(Tokenizer::load(&path).unwrap(), |_, _| Reply::Text(String::new()));
            let env = EnvConfig::Tools(ToolsConfig { functions, ..ToolsConfig::default() });
            let path = path.clone();
            async move { Context::build(&ContextConfig::default(), &env, Arc::new(engine), &path, None).await }
        };
        let err = build(vec![
            FunctionConfig::Builtin(Builtin::Calculator),
            FunctionConfig::Builtin(Builtin::Search),
        ])
        .await
        .err()
        .unwrap()
        .to_string();
        assert!(err.starts_with("functions[1] = search: needs a back end"), "{err}");
        let twice = vec![FunctionConfig::Builtin(Builtin::Calculator); 2];
        let err = build(twice).await.err().unwrap().to_string();
        assert_eq!(err, "two functions are named `calculator`; names must be unique");
    }

    /// A search tool answering `topk` passages per query.
    struct Passages;

    impl kart_core::tool::Search for Passages {
        fn search<'a>(&'a self, queries: &'a [String], topk: usize) -> kart_core::tool::Searched<'a> {
            let hit = |i: usize| kart_core::agent::search_r1::RetrievalResult {
                document: kart_core::agent::search_r1::document(
                    i.to_string(),
                    "\"France\"\nParis is the capital of France, a country in Europe.".into(),
                ),
                score: 1.0,
            };
            Box::pin(std::future::ready(Ok(queries.iter().map(|_| (0..topk).map(hit).collect()).collect())))
        }
    }

    #[tokio::test]
    async fn search_topk_and_the_tool_response_limit_shape_what_the_model_reads() {
        let dir = model_dir();
        let call = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"France\"}}\n</tool_call><|im_end|>";
        let search_only = |topk: usize, limit: usize| ToolsConfig {
            functions: vec![FunctionConfig::Builtin(Builtin::Search)],
            search_topk: topk,
            max_tool_response_tokens: limit,
            ..ToolsConfig::default()
        };
        let path = dir.path().to_path_buf();
        let response = |config: ToolsConfig| {
            let path = path.clone();
            async move {
                let engine = ScriptedEngine::new(Tokenizer::load(&path).unwrap(), move |_, call_index| {
                    Reply::Text(
                        if call_index == 0 { call } else { "<answer>Paris</answer><|im_end|>" }.into(),
                    )
                });
                let env = EnvConfig::Tools(config.clone());
                let search: Arc<dyn kart_core::tool::Search> = Arc::new(Passages);
                let ctx =
                    Context::build(&ContextConfig::default(), &env, Arc::new(engine), &path, Some(search))
                        .await
                        .unwrap();
                let t = run(&config, &ctx, &task(None)).await;
                runs(&ctx, &t, 0)[0].clone()
            }
        };
        let two = response(search_only(2, 1000)).await;
        assert!(two.contains("Doc 2(Title:") && !two.contains("Doc 3("), "{two}");
        let three = response(search_only(3, 1000)).await;
        assert!(three.contains("Doc 3(Title:"), "{three}");
        let cut = response(search_only(3, 4)).await;
        let shown =
            cut.split("<tool_response>\n").nth(1).unwrap().split("\n</tool_response>").next().unwrap();
        assert!(shown.starts_with("Doc") && !shown.contains("Paris"), "cut to 4 tokens: {shown:?}");
    }

    #[test]
    fn answers_are_found_per_format() {
        assert_eq!(
            extract(AnswerFormat::Tagged, "<answer>a</answer> then <answer> b </answer>"),
            Some("b".into())
        );
        assert_eq!(extract(AnswerFormat::Tagged, "b"), None);
        assert_eq!(extract(AnswerFormat::Boxed, "so \\boxed{42}."), Some("42".into()));
        assert_eq!(extract(AnswerFormat::Content, " Paris "), Some("Paris".into()));
    }
}
