//! How `kart local`'s agent calls its search tool ([`AgentFormat`]): Search-R1's tags inside a
//! user prompt of instructions (the `search-r1` environment), or function calls in the Hermes
//! format that Qwen2.5's chat template teaches (the `tools` environment). The format decides the
//! chat template saved with the tokenizer, the prompts of the datasets, the environment RL runs
//! and the wording of the gold trajectories.

use super::gold::Segment;
use kart_core::agent::search_r1::{PromptError, make_prefix};
use kart_core::chat::{ChatMessage, ToolCall};
use kart_core::config::env::{AnswerFormat, EnvConfig, Score, SearchR1Config, ToolsConfig};
use kart_core::config::functions::{Builtin, FunctionConfig};
use kart_rollout::env::RolloutError;
use kart_rollout::env::tools::Conversation;
use kart_tokenizer::{CHATML, ChatTemplate, QWEN25, Tokenizer};
use kart_tools::functions::builtin::search_schema;
use serde::Serialize;
use serde_json::{Value, json};

/// The system prompt of the tools format: what Search-R1's instructions say, for function calls.
pub const TOOLS_SYSTEM_PROMPT: &str = "Answer the given question. You must conduct reasoning inside \
    <think> and </think> first every time you get new information. If you lack knowledge, call the \
    search function to search the knowledge base. When you know the answer, give it inside <answer> \
    and </answer>, without detailed illustrations.";

/// Most tokens per model turn, and per search result shown.
const MAX_TURN_TOKENS: usize = 64;
const MAX_OBSERVATION_TOKENS: usize = 512;

/// How the agent calls its search tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AgentFormat {
    /// `<search> query </search>` in the text, answered by `<information>` blocks (Search-R1).
    #[default]
    SearchR1,
    /// `search(query)` as a function call in `<tool_call>` blocks, answered by tool messages.
    Tools,
}

impl AgentFormat {
    /// The chat template the tokenizer is saved with.
    pub fn chat_template(self) -> &'static str {
        match self {
            AgentFormat::SearchR1 => CHATML,
            AgentFormat::Tools => QWEN25,
        }
    }

    /// Warm-start updates on the gold trajectories by default. The tools format's trajectories
    /// are longer (564 tokens on average on seed 1) and take half again as many: before the fact
    /// drills between the gold updates, its warm start with 2000 ended at loss 0.042 and
    /// held-out EM 0.300, with 3000 at 0.021 and 0.635 (the Search-R1 format then took 2000).
    pub fn warm_steps(self) -> u64 {
        match self {
            AgentFormat::SearchR1 => 1000,
            AgentFormat::Tools => 1500,
        }
    }

    /// A question's prompt as the datasets hold it: Search-R1's instructions around it, or the
    /// question alone (the tools environment adds its system prompt).
    pub fn prompt(self, question: &str) -> Result<Vec<ChatMessage>, PromptError> {
        Ok(match self {
            AgentFormat::SearchR1 => vec![ChatMessage::new("user", make_prefix(question)?)],
            AgentFormat::Tools => vec![ChatMessage::new("user", question)],
        })
    }

    /// Texts of the format the tokenizer is trained on besides the world's, each repeated so
    /// that BPE merges them: the tools format's system prompt, schema and call syntax.
    pub fn vocabulary(self) -> Vec<String> {
        match self {
            AgentFormat::SearchR1 => Vec::new(),
            AgentFormat::Tools => {
                let call =
                    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"\"}}\n</tool_call>";
                let texts = [TOOLS_SYSTEM_PROMPT.to_owned(), search_schema().to_string(), call.to_owned()];
                texts.iter().flat_map(|t| std::iter::repeat_n(t.clone(), 20)).collect()
            }
        }
    }

    /// The environment RL runs: two searches at most, three passages each.
    pub fn env(self) -> EnvConfig {
        match self {
            AgentFormat::SearchR1 => EnvConfig::SearchR1(SearchR1Config {
                max_turns: 2,
                topk: 3,
                max_response_length: MAX_TURN_TOKENS,
                max_obs_length: MAX_OBSERVATION_TOKENS,
                max_trajectory_tokens: 2048,
                ..SearchR1Config::default()
            }),
            AgentFormat::Tools => EnvConfig::Tools(ToolsConfig {
                functions: vec![FunctionConfig::Builtin(Builtin::Search)],
                search_topk: 3,
                system_prompt: TOOLS_SYSTEM_PROMPT.into(),
                max_turns: 2,
                // A call's JSON wrapper takes about as many tokens as the query in it.
                max_response_length: 2 * MAX_TURN_TOKENS,
                max_tool_response_tokens: MAX_OBSERVATION_TOKENS,
                max_trajectory_tokens: 2048,
                answer: AnswerFormat::Tagged,
                score: Score::Em,
                ..ToolsConfig::default()
            }),
        }
    }

    /// The gold trajectory `segments` (in Search-R1's wording) as this format writes it, each
    /// search answered by `search`, after the prompt of `question`; returns the prompt's text
    /// and the segments.
    pub fn gold(
        self,
        question: &str,
        segments: Vec<Segment>,
        template: &ChatTemplate,
        tokenizer: &Tokenizer,
        mut search: impl FnMut(&str) -> String,
    ) -> Result<(String, Vec<Segment>), FormatError> {
        let messages = self.prompt(question)?;
        if self == AgentFormat::SearchR1 {
            return Ok((template.render(&messages, true, Value::Null)?, segments));
        }
        let mut messages = messages;
        messages.insert(0, ChatMessage::new("system", TOOLS_SYSTEM_PROMPT));
        let schemas = vec![search_schema()];
        let mut conversation = Conversation::start(template, messages, schemas)?;
        let prompt = conversation.prompt().to_owned();
        let mut written = Vec::new();
        for segment in segments {
            let Segment::Model { turn, guess } = segment else { continue };
            let Some((think, query)) = search_turn(&turn) else {
                written.push(Segment::Model { turn: format!("{turn}{END}"), guess });
                continue;
            };
            let arguments = json!({"query": query});
            // Written as the template writes calls (Python's json.dumps separators).
            let text = format!(
                "{think}\n<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"query\": {}}}}}\n</tool_call>{END}",
                Value::String(query.to_owned())
            );
            written.push(Segment::Model { turn: text, guess });
            let ids = tokenizer.encode(&search(query), false)?;
            let result = tokenizer.decode(&ids[..ids.len().min(MAX_OBSERVATION_TOKENS)], false)?;
            let assistant = ChatMessage::assistant(think, vec![ToolCall::function("search", arguments)]);
            let observation = conversation.respond(
                template,
                assistant,
                Some(END),
                vec![ChatMessage::new("tool", result)],
            )?;
            written.push(Segment::Env(observation));
        }
        Ok((prompt, written))
    }
}

/// The end-of-turn token the model writes (kart local's tokenizer's end of sequence).
const END: &str = "<|im_end|>";

/// A search turn's reasoning and query: `<think> … </think>\n<search> query </search>`.
fn search_turn(turn: &str) -> Option<(&str, &str)> {
    let (think, rest) = turn.split_once("\n<search>")?;
    Some((think, rest.strip_suffix("</search>")?.trim()))
}

/// Why a gold trajectory could not be written in a format.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error(transparent)]
    Tokenizer(#[from] kart_tokenizer::TokenizerError),
    #[error(transparent)]
    Rollout(#[from] RolloutError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::gold::GoldConfig;
    use crate::local::warm_start::{Agent, gold_trajectory};
    use crate::local::world::{World, WorldConfig};
    use kart_core::agent::trajectory::Status;
    use kart_core::config::rollout::ContextConfig;
    use kart_core::generation::SamplingParams;
    use kart_retriever::InProcess;
    use kart_retriever::bm25::{self, Bm25Index};
    use kart_rollout::env::Context;
    use kart_rollout::env::tools::ToolsEnv;
    use kart_rollout::env::turns::Agent as _;
    use kart_rollout::fake::{Reply, ScriptedEngine};
    use std::sync::Arc;

    /// The warm start trains on exactly the tokens RL rollouts make: each gold trajectory of
    /// the tools format, its model turns replayed through the tools environment searching the
    /// same index, comes out token for token and mask for mask the same, with reward 1.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gold_tools_trajectories_are_what_the_tools_environment_makes_of_their_turns() {
        let config = WorldConfig {
            persons: 300,
            cities: 20,
            companies: 30,
            test_questions: 20,
            train_questions: 60,
            seed: 3,
            ..WorldConfig::default()
        };
        let world = World::generate(&config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        world.write_corpus(&dir.path().join("corpus.jsonl")).unwrap();
        bm25::build(&dir.path().join("corpus.jsonl"), &dir.path().join("index"), 16 << 20, |_, _, _| ())
            .unwrap();
        let index = Arc::new(Bm25Index::open(&dir.path().join("index")).unwrap());
        let mut texts: Vec<String> =
            world.passages.iter().map(|p| format!("{}\n{}", p.title, p.text)).collect();
        texts.extend(AgentFormat::Tools.vocabulary());
        let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let tokenizer = Tokenizer::train_byte_level_bpe(
            texts.iter().map(String::as_str),
            2000,
            &special,
            END,
            "<|endoftext|>",
        )
        .unwrap();
        let model = dir.path().join("model");
        tokenizer.save(&model, Some(AgentFormat::Tools.chat_template())).unwrap();
        let template = ChatTemplate::load(&model).unwrap().unwrap();
        let agent = Agent { format: AgentFormat::Tools, tokenizer: &tokenizer, template: &template };
        let correct = GoldConfig { corrupt_share: 0.0, year_guess_share: 0.0, first_hop_share: 0.0, seed: 0 };
        let EnvConfig::Tools(env) = AgentFormat::Tools.env() else { unreachable!("the tools format") };
        let two_hop = world.train.iter().find(|q| q.hops.len() == 2).expect("a two-hop question");
        for question in world.train.iter().take(3).chain([two_hop]) {
            let (gold, segments) =
                gold_trajectory(&world, question, &correct, index.as_ref(), &agent, 3).unwrap();
            let turns: Vec<String> = segments
                .iter()
                .filter_map(|s| match s {
                    Segment::Model { turn, .. } => Some(turn.clone()),
                    Segment::Env(_) => None,
                })
                .collect();
            let engine =
                ScriptedEngine::new(tokenizer.clone(), move |_, call| Reply::Text(turns[call].clone()));
            let search = Arc::new(InProcess::new(index.clone() as Arc<dyn kart_retriever::LocalIndex>));
            let ctx = Context::build(
                &ContextConfig::default(),
                &AgentFormat::Tools.env(),
                Arc::new(engine),
                &model,
                Some(search),
            )
            .await
            .unwrap();
            let task = question.to_prompt(AgentFormat::Tools).unwrap();
            let t = ToolsEnv::new(env.clone())
                .run(&ctx, &task, "t".into(), &SamplingParams::default())
                .await
                .unwrap();
            assert_eq!((t.status, t.reward), (Status::Completed, 1.0), "{}", question.question);
            assert_eq!(t.stats.tool_calls["search"].ok as usize, question.hops.len());
            assert_eq!(
                tokenizer.decode(t.token_ids(), false).unwrap(),
                tokenizer.decode(gold.token_ids(), false).unwrap()
            );
            assert_eq!((t.token_ids(), t.loss_mask()), (gold.token_ids(), gold.loss_mask()));
        }
    }
}
