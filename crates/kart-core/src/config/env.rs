//! Settings of the environments: plain serde data, read by the rollout worker and rendered by the
//! operator (the environments themselves are `kart-rollout`'s).

use crate::agent::asearcher::{AgentConfig, PromptTemplate};
use crate::agent::function_calls::CallFormat;
use crate::agent::tir::{TirConfig, Tool};
use crate::config::ConfigError;
use crate::config::functions::{Builtin, FunctionConfig};
use crate::config::workflow::WorkflowConfig;
use crate::reward::search_r1::SearchR1RewardWeights;
use serde::{Deserialize, Serialize};

/// Which environment to run, with its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum EnvConfig {
    SearchR1(SearchR1Config),
    Asearcher(AsearcherConfig),
    Tir(TirEnvConfig),
    Tools(ToolsConfig),
    /// Several roles on one policy ([`crate::config::workflow`]).
    Workflow(WorkflowConfig),
}

impl EnvConfig {
    /// Whether episodes may run model-written Python (TIR with the `python` tool), so a worker
    /// needs the sandbox.
    pub fn runs_python(&self) -> bool {
        match self {
            EnvConfig::Tir(tir) => tir.tools.contains(&Tool::Python),
            EnvConfig::Tools(tools) => tools.functions.contains(&FunctionConfig::Builtin(Builtin::Python)),
            EnvConfig::Workflow(w) => w.roles.iter().any(|r| r.env.runs_python()),
            _ => false,
        }
    }

    /// Whether episodes search a corpus, so an in-process pool needs an index or a retriever.
    pub fn searches(&self) -> bool {
        match self {
            EnvConfig::SearchR1(_) | EnvConfig::Asearcher(_) => true,
            EnvConfig::Tir(_) => false,
            EnvConfig::Tools(tools) => tools.functions.iter().any(|f| {
                matches!(
                    f,
                    FunctionConfig::Builtin(Builtin::Search) | FunctionConfig::Builtin(Builtin::Access)
                )
            }),
            EnvConfig::Workflow(w) => w.roles.iter().any(|r| r.env.searches()),
        }
    }

    /// Trajectories one episode gives: one, or a workflow's role counts summed.
    pub fn trajectories_per_episode(&self) -> usize {
        match self {
            EnvConfig::Workflow(w) => w.roles.iter().map(|r| r.count).sum(),
            _ => 1,
        }
    }

    /// The functions each agent offers, in role order for a workflow (empty for environments
    /// without configured functions).
    pub fn agent_functions(&self) -> Vec<&[FunctionConfig]> {
        match self {
            EnvConfig::Tools(tools) => vec![&tools.functions],
            EnvConfig::Workflow(w) => w.roles.iter().flat_map(|r| r.env.agent_functions()).collect(),
            _ => vec![&[]],
        }
    }

    /// Most tokens in a trajectory, prompt included (reaching it truncates the episode); a
    /// workflow's longest role's.
    pub fn max_trajectory_tokens(&self) -> usize {
        match self {
            EnvConfig::SearchR1(c) => c.max_trajectory_tokens,
            EnvConfig::Asearcher(c) => c.max_trajectory_tokens,
            EnvConfig::Tir(c) => c.max_length,
            EnvConfig::Tools(c) => c.max_trajectory_tokens,
            EnvConfig::Workflow(w) => {
                w.roles.iter().map(|r| r.env.max_trajectory_tokens()).max().unwrap_or(0)
            }
        }
    }

    /// Checks the settings, naming the bad field and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            EnvConfig::Tools(c) => c.validate(),
            EnvConfig::Workflow(w) => w.validate(),
            _ => Ok(()),
        }
    }
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig::SearchR1(SearchR1Config::default())
    }
}

/// Which upstream reward function scores the trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RewardFn {
    /// `qa_em.compute_score_em` (Search-R1's training default).
    #[default]
    Em,
    /// `qa_em.compute_score_subem`.
    SubEm,
    /// `qa_em_format.compute_score_em` with format and retrieval credit.
    EmFormat,
}

/// Settings of the Search-R1 environment; defaults are those of Search-R1's `train_ppo.sh`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SearchR1Config {
    /// Rounds with search before the final round without.
    pub max_turns: u32,
    /// Passages per search.
    pub topk: usize,
    /// Longest observation in tokens (longer ones keep their first tokens).
    pub max_obs_length: usize,
    /// Most tokens generated per turn.
    pub max_response_length: usize,
    /// Most tokens in the whole trajectory, prompt included; reaching it ends the episode as
    /// `truncated`.
    pub max_trajectory_tokens: usize,
    /// Stop generation at `</search>` / `</answer>` (false: upstream's generate-then-cut).
    pub stop_at_action: bool,
    /// The reward function.
    pub reward_fn: RewardFn,
    /// Weights of the reward function (upstream's keyword arguments).
    pub reward: SearchR1RewardWeights,
}

impl Default for SearchR1Config {
    fn default() -> Self {
        SearchR1Config {
            max_turns: 2,
            topk: 3,
            max_obs_length: 500,
            max_response_length: 500,
            max_trajectory_tokens: 4096,
            stop_at_action: true,
            reward_fn: RewardFn::Em,
            reward: SearchR1RewardWeights::default(),
        }
    }
}

/// How the answer is scored against the golden answers (upstream `reward_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AsearcherReward {
    /// Token-set F1 ([`compute_score_f1`](crate::reward::asearcher::compute_score_f1)).
    #[default]
    F1,
    /// Exact match ([`compute_score_em`](crate::reward::asearcher::compute_score_em)).
    Em,
}

/// Settings of the ASearcher environment; defaults are those of upstream's `ASearcherWorkflow`
/// and its configs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AsearcherConfig {
    /// Model turns per episode, action and summarisation turns alike.
    pub max_turns: usize,
    /// Most tokens generated per turn (upstream `gconfig.max_new_tokens`).
    pub max_response_length: usize,
    /// Most tokens in the whole trajectory, prompt included (upstream `max_tokens`); reaching it
    /// ends the episode as `truncated`.
    pub max_trajectory_tokens: usize,
    /// The template a task's `prompt` (the question) is put in; tasks with `messages` go through
    /// the chat template instead.
    pub template: PromptTemplate,
    /// Tell the model the question is valid (upstream `valid_inst_ratio` 1.0): the template's
    /// invalid-question sentence is replaced, and an answer calling the question invalid scores
    /// -0.5. Applies to templated prompts only.
    pub valid_instruction: bool,
    /// How the answer is scored.
    pub reward: AsearcherReward,
    /// Score 0 unless every model turn passes upstream's format check.
    pub require_format: bool,
    /// Search results per query and page chunking.
    pub agent: AgentConfig,
}

impl Default for AsearcherConfig {
    fn default() -> Self {
        AsearcherConfig {
            max_turns: 128,
            max_response_length: 1024,
            max_trajectory_tokens: 32_000,
            template: PromptTemplate::SearchAccess,
            valid_instruction: true,
            reward: AsearcherReward::F1,
            require_format: true,
            agent: AgentConfig::default(),
        }
    }
}

/// How the prompt is built from a task (upstream `is_chat_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TirPrompt {
    /// The ToRL instruction around the question, as raw text for a base model (upstream's default).
    #[default]
    Torl,
    /// A system message describing the tools, then the task's messages, through the chat template.
    Chat,
}

/// Settings of the TIR environment; defaults are upstream's `TIRConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TirEnvConfig {
    /// The tools the model may call, `python` and `calculator`, in routing order (upstream
    /// `enable_tools`).
    #[serde(with = "tool_names")]
    #[schemars(with = "Vec<String>")]
    pub tools: Vec<Tool>,
    /// Tool calls allowed: generation goes on while at most this many were made.
    pub max_turns: usize,
    /// Most tokens in the trajectory, prompt included; reaching it ends the episode as `truncated`.
    pub max_length: usize,
    /// How the prompt is built.
    pub prompt: TirPrompt,
}

impl Default for TirEnvConfig {
    fn default() -> Self {
        let agent = TirConfig::default();
        TirEnvConfig {
            tools: agent.tools,
            max_turns: agent.max_turns,
            max_length: 3000,
            prompt: TirPrompt::Torl,
        }
    }
}

/// A tool's name in configs and statistics.
pub fn tool_name(tool: Tool) -> &'static str {
    match tool {
        Tool::Python => "python",
        Tool::Calculator => "calculator",
    }
}

/// Tools as their names in configs: `["python", "calculator"]`.
mod tool_names {
    use super::tool_name;
    use crate::agent::tir::Tool;
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    const TOOLS: [Tool; 2] = [Tool::Python, Tool::Calculator];

    pub fn serialize<S: Serializer>(tools: &[Tool], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(tools.iter().map(|&tool| tool_name(tool)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Tool>, D::Error> {
        Vec::<String>::deserialize(deserializer)?
            .iter()
            .map(|name| {
                TOOLS
                    .into_iter()
                    .find(|&tool| tool_name(tool) == name)
                    .ok_or_else(|| D::Error::unknown_variant(name, &["python", "calculator"]))
            })
            .collect()
    }
}

/// Settings of the `tools` environment: the model calls functions in the format its chat template
/// teaches, their schemas rendered by that template and their results given back as `tool`
/// messages, until it answers without a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// How the model writes calls.
    pub format: CallFormat,
    /// The functions offered and their back ends. A task's `tools` column, when set, is the list
    /// of schemas offered instead; each must name a function configured here.
    pub functions: Vec<FunctionConfig>,
    /// Passages per built-in `search` call.
    pub search_topk: usize,
    /// A system message put before a task's messages (unless empty or the task has its own).
    pub system_prompt: String,
    /// Assistant turns with calls; the episode ends after this many.
    pub max_turns: usize,
    /// Most tokens generated per turn.
    pub max_response_length: usize,
    /// Longest tool response in tokens (longer ones keep their first tokens).
    pub max_tool_response_tokens: usize,
    /// Most tokens in the whole trajectory, prompt included; reaching it ends the episode as
    /// `truncated`.
    pub max_trajectory_tokens: usize,
    /// Where the final message holds the answer.
    pub answer: AnswerFormat,
    /// How the answer is scored against the golden answers.
    pub score: Score,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            format: CallFormat::Hermes,
            functions: vec![FunctionConfig::Builtin(Builtin::Search)],
            search_topk: 3,
            system_prompt: String::new(),
            max_turns: 4,
            max_response_length: 500,
            max_tool_response_tokens: 500,
            max_trajectory_tokens: 4096,
            answer: AnswerFormat::Tagged,
            score: Score::Em,
        }
    }
}

impl ToolsConfig {
    /// Checks the settings, naming the bad field and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, function) in self.functions.iter().enumerate() {
            function.validate(i)?;
        }
        if self.max_turns == 0 {
            return Err(ConfigError::new("max_turns", 0, "must be at least 1"));
        }
        Ok(())
    }
}

/// Where a final message holds its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AnswerFormat {
    /// The last `<answer>…</answer>`; no answer without one.
    #[default]
    Tagged,
    /// The last `\boxed{…}`.
    Boxed,
    /// The whole message.
    Content,
}

/// How an answer is scored against the golden answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Score {
    /// 1 when the normalised answer equals a golden one (Search-R1's `em_check`).
    #[default]
    Em,
    /// 1 when a normalised golden answer occurs in the normalised answer (`subem_check`).
    SubEm,
    /// The best token-set F1 over the golden answers (ASearcher's).
    F1,
    /// 1 when the answer is mathematically equivalent to the first golden answer.
    Math,
}
