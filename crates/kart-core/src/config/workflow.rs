//! Settings of a multi-agent workflow (`env.kind: workflow`): roles that run in order on one
//! policy, each in its own environment, later roles reading earlier roles' outputs, and the
//! final outcome shared back to every role's reward (slime's solver, rewriter and selector).
//!
//! ```yaml
//! env:
//!   kind: workflow
//!   roles:
//!     - {name: solver, count: 3, env: {kind: tools, functions: [], answer: boxed, score: math}}
//!     - name: rewriter
//!       count: 3
//!       input: "{question}\n\nEarlier solutions:\n{solver}\nWrite a better solution."
//!       env: {kind: tools, functions: [], answer: boxed, score: math}
//!     - name: selector
//!       input: "{question}\n\n{rewriter}\nEnd with `Judgment: IDX`."
//!       select: {from: rewriter}
//!       env: {kind: tools, functions: [], answer: content, score: math}
//!   reward_sharing: {kind: scale, success: 1.2, failure: 0.8}
//! ```

use super::ConfigError;
use super::env::EnvConfig;
use serde::{Deserialize, Serialize};

/// Roles run in order for each question, their trajectories trained together as the question's
/// group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowConfig {
    /// The roles, in the order they run.
    pub roles: Vec<Role>,
    /// How the workflow's outcome (its last role's reward) is shared back to every trajectory.
    #[serde(default)]
    pub reward_sharing: RewardSharing,
}

/// One role: `count` episodes of one environment, run concurrently once the earlier roles are
/// done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Role {
    /// The role's name, in trajectory ids, `role/{name}/reward` and other roles' inputs.
    pub name: String,
    /// Episodes of the role per workflow run.
    #[serde(default = "one")]
    pub count: usize,
    /// The question the role's episodes get. `{question}` is the task's question; for each
    /// earlier role, `{name}` is its outputs (its episodes not aborted) as `#### Solution i`
    /// sections (the last model turn, after any `</think>`) and `{name_count}` their number. A role whose input
    /// names a role without outputs does not run, nor do the roles after it.
    #[serde(default = "question")]
    pub input: String,
    /// The role's environment, with its own system prompt: any kind but `workflow`.
    #[schemars(schema_with = "agent_env_schema")]
    pub env: EnvConfig,
    /// The role picks one output of an earlier role, and its reward is that output's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Selection>,
}

/// How a selecting role's pick is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    /// The earlier role whose outputs are picked from.
    pub from: String,
    /// A regular expression over the role's last model turn whose first match's first group is
    /// the picked output's number, from 1 (slime's `Judgment:\s*(\d+)`). No match, or a number
    /// out of range, scores 0.
    #[serde(default = "judgment")]
    pub pattern: String,
}

/// How the outcome `o` (the last role's mean reward; 0 when it did not run) changes each
/// trajectory's own reward `r`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RewardSharing {
    /// `r`: roles are rewarded for their own outputs alone.
    #[default]
    Own,
    /// `o`: every role is rewarded for the outcome.
    Final,
    /// `r * success` when `o >= threshold`, else `r * failure` (slime's reward adjustment).
    Scale {
        /// The factor of a successful outcome (`scale`).
        #[serde(default = "success")]
        success: f64,
        /// The factor of a failed outcome (`scale`).
        #[serde(default = "failure")]
        failure: f64,
        /// The least outcome that counts as success (`scale`).
        #[serde(default = "threshold")]
        threshold: f64,
    },
    /// `(1 - alpha) * r + alpha * o`.
    Mix {
        /// The outcome's share of the reward (`mix`), within [0, 1].
        alpha: f64,
    },
}

impl RewardSharing {
    /// The reward of a trajectory whose own reward is `own` in a workflow whose outcome is
    /// `outcome`.
    pub fn share(&self, own: f64, outcome: f64) -> f64 {
        match *self {
            RewardSharing::Own => own,
            RewardSharing::Final => outcome,
            RewardSharing::Scale { success, failure, threshold } => {
                own * if outcome >= threshold { success } else { failure }
            }
            RewardSharing::Mix { alpha } => (1.0 - alpha) * own + alpha * outcome,
        }
    }

    /// Whether the outcome enters the rewards (all but `own`).
    pub fn uses_outcome(&self) -> bool {
        *self != RewardSharing::Own
    }
}

impl WorkflowConfig {
    /// Checks the settings, naming the bad field and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.roles.is_empty() {
            return Err(ConfigError::new("roles", "[]", "a workflow needs at least one role"));
        }
        for (i, role) in self.roles.iter().enumerate() {
            let field = |name: &str| format!("roles[{i}].{name}");
            let earlier = &self.roles[..i];
            if role.name.is_empty()
                || !role.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(ConfigError::new(
                    field("name"),
                    &role.name,
                    "must be letters, digits, `_` or `-`",
                ));
            }
            if earlier.iter().any(|r| r.name == role.name) {
                return Err(ConfigError::new(field("name"), &role.name, "two roles have this name"));
            }
            if role.count == 0 {
                return Err(ConfigError::new(field("count"), 0, "must be at least 1"));
            }
            let known = |name: &str| {
                if known(name, earlier) { Ok(Some(String::new())) } else { Err(name.to_owned()) }
            };
            if let Err(unknown) = fill(&role.input, known) {
                return Err(ConfigError::new(
                    field("input"),
                    format!("{{{unknown}}}"),
                    "names no earlier role (placeholders: {question}, {role}, {role_count})",
                ));
            }
            if matches!(role.env, EnvConfig::Workflow(_)) {
                return Err(ConfigError::new(field("env.kind"), "workflow", "a role runs one agent"));
            }
            role.env.validate().map_err(|e| e.within(&field("env")))?;
            if let Some(select) = &role.select {
                if !earlier.iter().any(|r| r.name == select.from) {
                    return Err(ConfigError::new(
                        field("select.from"),
                        &select.from,
                        "names no earlier role",
                    ));
                }
                match regex::Regex::new(&select.pattern) {
                    Ok(re) if re.captures_len() > 1 => {}
                    _ => {
                        let reason = "must be a regular expression with a group for the number";
                        return Err(ConfigError::new(field("select.pattern"), &select.pattern, reason));
                    }
                }
            }
        }
        if let RewardSharing::Mix { alpha } = self.reward_sharing
            && !(0.0..=1.0).contains(&alpha)
        {
            return Err(ConfigError::new("reward_sharing.alpha", alpha, "must be within [0, 1]"));
        }
        Ok(())
    }
}

/// Fills the `{name}` placeholders of an input template in one pass (filled text is never read
/// again): `value(name)` gives `Ok(Some(text))` for a placeholder, `Ok(None)` for braces that
/// are not one (left as written), or an error that ends the filling.
pub fn fill<E>(
    template: &str,
    mut value: impl FnMut(&str) -> Result<Option<String>, E>,
) -> Result<String, E> {
    let mut text = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let filled = match after.find('}') {
            Some(close) => value(&after[..close])?.map(|t| (close, t)),
            None => None,
        };
        match filled {
            Some((close, filled)) => {
                text.push_str(&filled);
                rest = &after[close + 1..];
            }
            None => {
                text.push('{');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    Ok(text)
}

/// Whether `placeholder` is `question` or names an earlier role (`{name}`, `{name_count}`).
fn known(placeholder: &str, earlier: &[Role]) -> bool {
    let role = placeholder.strip_suffix("_count").unwrap_or(placeholder);
    placeholder == "question" || earlier.iter().any(|r| r.name == role || r.name == placeholder)
}

/// A role's environment in the custom resources: an object with a `kind`, checked when the
/// config is read (a schema of its own would recurse through `workflow`).
fn agent_env_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "The role's environment: an `env` of any kind but `workflow`.",
        "type": "object",
        "properties": {"kind": {"type": "string", "enum": ["search-r1", "asearcher", "tir", "tools"]}},
        "required": ["kind"],
        "x-kubernetes-preserve-unknown-fields": true
    })
}

fn one() -> usize {
    1
}

fn question() -> String {
    "{question}".into()
}

fn judgment() -> String {
    r"Judgment:\s*(\d+)".into()
}

fn success() -> f64 {
    1.2
}

fn failure() -> f64 {
    0.8
}

fn threshold() -> f64 {
    1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow(json: &str) -> Result<WorkflowConfig, String> {
        let w: WorkflowConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
        w.validate().map_err(|e| e.to_string())?;
        Ok(w)
    }

    const ROLES: &str = r#"{"roles": [
        {"name": "solver", "count": 2, "env": {"kind": "tools", "functions": []}},
        {"name": "selector", "input": "{question} {solver} of {solver_count}", "select": {"from": "solver"},
         "env": {"kind": "tools", "functions": []}}
    ]"#;

    fn roles(end: &str) -> String {
        format!("{ROLES}{end}")
    }

    #[test]
    fn a_workflow_reads_with_its_defaults() {
        let w = workflow(&roles("}")).unwrap();
        assert_eq!((w.roles[0].count, w.roles[0].input.as_str()), (2, "{question}"));
        assert_eq!(w.roles[1].select.as_ref().unwrap().pattern, r"Judgment:\s*(\d+)");
        assert_eq!(w.reward_sharing, RewardSharing::Own);
        let scale: RewardSharing = serde_json::from_str(r#"{"kind": "scale"}"#).unwrap();
        assert_eq!(scale, RewardSharing::Scale { success: 1.2, failure: 0.8, threshold: 1.0 });
    }

    #[test]
    fn templates_fill_in_one_pass_and_leave_other_braces() {
        let value = |name: &str| -> Result<Option<String>, ()> {
            Ok(match name {
                "question" => Some("{solver}?".into()),
                "solver" => Some("S".into()),
                _ => None,
            })
        };
        assert_eq!(
            fill("Q: {question} {solver} {\"a\": 1} {x", value),
            Ok("Q: {solver}? S {\"a\": 1} {x".into())
        );
        assert_eq!(fill("{solver}", |_| Err::<Option<String>, _>("stop")), Err("stop"));
    }

    #[test]
    fn sharing_follows_its_kind() {
        let scale = RewardSharing::Scale { success: 1.2, failure: 0.8, threshold: 1.0 };
        assert_eq!(scale.share(1.0, 1.0), 1.2);
        assert_eq!(scale.share(1.0, 0.5), 0.8);
        assert_eq!(scale.share(0.0, 1.0), 0.0);
        assert_eq!(RewardSharing::Final.share(0.0, 0.75), 0.75);
        assert_eq!(RewardSharing::Own.share(0.25, 1.0), 0.25);
        assert_eq!(RewardSharing::Mix { alpha: 0.25 }.share(1.0, 0.0), 0.75);
    }

    #[test]
    fn bad_workflows_name_the_field() {
        let ok = roles("}");
        let first_env = r#""count": 2, "env": {"kind": "tools", "functions": []}"#;
        let cases = [
            (r#"{"roles": []}"#.to_owned(), "roles = []"),
            (ok.replace(r#""count": 2"#, r#""count": 0"#), "roles[0].count = 0"),
            (ok.replace("{solver_count}", "{rewriter}"), "roles[1].input = {rewriter}"),
            (ok.replace(r#""from": "solver""#, r#""from": "selector""#), "roles[1].select.from = selector"),
            (ok.replace(r#""name": "selector""#, r#""name": "solver""#), "roles[1].name = solver"),
            (ok.replace(r#""name": "selector""#, r#""name": "a b""#), "roles[1].name = a b"),
            (
                ok.replace(r#"{"from": "solver"}"#, r#"{"from": "solver", "pattern": "Judgment: \\d+"}"#),
                r"roles[1].select.pattern = Judgment: \d+",
            ),
            (
                ok.replace(first_env, r#""env": {"kind": "workflow", "roles": []}"#),
                "roles[0].env.kind = workflow",
            ),
            (
                ok.replace(first_env, r#""env": {"kind": "tools", "max_turns": 0}"#),
                "roles[0].env.max_turns = 0",
            ),
            (roles(r#", "reward_sharing": {"kind": "mix", "alpha": 2}}"#), "reward_sharing.alpha = 2"),
        ];
        for (json, expected) in cases {
            let err = workflow(&json).expect_err(&json);
            assert!(err.starts_with(expected), "{json}: {err}");
        }
    }
}
