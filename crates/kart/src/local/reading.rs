//! Held-out trajectories rendered for a person to read: the question and its gold answers, the
//! outcome, then the model's turns and the search results between them.

use kart_core::agent::trajectory::Trajectory;
use kart_core::wire::Task;
use kart_tokenizer::Tokenizer;
use kart_train::dump::segments;
use std::collections::HashMap;

/// The held-out question two evaluations show best, with its trajectory in each: the first
/// (in the tasks' order) answered with a higher reward after than before, else the first both
/// evaluations answered.
pub fn pick<'a>(
    tasks: &'a [Task],
    before: &'a [Trajectory],
    after: &'a [Trajectory],
) -> Option<(&'a Task, &'a Trajectory, &'a Trajectory)> {
    let by_prompt = |ts: &'a [Trajectory]| -> HashMap<&'a str, &'a Trajectory> {
        ts.iter().map(|t| (t.prompt_id.as_str(), t)).collect()
    };
    let (before, after) = (by_prompt(before), by_prompt(after));
    let answered: Vec<_> = tasks
        .iter()
        .filter_map(|task| Some((task, *before.get(task.id.as_str())?, *after.get(task.id.as_str())?)))
        .collect();
    answered.iter().find(|(_, b, a)| a.reward > b.reward).or(answered.first()).copied()
}

/// `t`, a trajectory of `task`, as text under the heading `title`.
pub fn render(title: &str, task: &Task, t: &Trajectory, tokenizer: &Tokenizer) -> anyhow::Result<String> {
    let prompt = task.prompt.clone().or_else(|| {
        let messages = task.messages.as_ref()?;
        messages.iter().rev().find(|m| m.role == "user").map(|m| m.content.clone())
    });
    // Search-R1's prompt is its instructions, then `Question: …`.
    let question = prompt.map(|p| match p.rsplit_once("Question:") {
        Some((_, question)) => question.trim().to_string(),
        None => p,
    });
    let status = serde_json::to_value(t.status)?;
    let mut out = format!(
        "{title}\n\nquestion: {}\ngold answer: {}\nreward {:.2} · {} search(es) · {}\n",
        question.as_deref().unwrap_or("(none)"),
        task.ground_truth.join(" | "),
        t.reward,
        t.stats.total_tool_calls(),
        status.as_str().unwrap_or_default(),
    );
    // The prompt (system prompt and question, templated) is summarised above.
    for segment in segments(t, tokenizer)?.iter().skip(1) {
        let heading = if segment["role"] == "model" { "model" } else { "search results" };
        let text = segment["text"].as_str().unwrap_or_default().trim();
        out.push_str(&format!("\n--- {heading} ---\n{text}\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str) -> Task {
        Task {
            id: id.into(),
            messages: None,
            prompt: Some(format!("question {id}?")),
            ground_truth: vec!["Lyon".into()],
            data_source: "world".into(),
            tools: None,
        }
    }

    fn answered(prompt: &str, reward: f64) -> Trajectory {
        let mut t = Trajectory::new(format!("{prompt}-0"), prompt, &[1, 2]);
        t.push_model(&[3, 4], &[-0.1, -0.2], 0).unwrap();
        t.reward = reward;
        t
    }

    #[test]
    fn the_question_rl_improved_is_picked_else_the_first_answered_twice() {
        let tasks = [task("a"), task("b"), task("c")];
        let before = [answered("c", 0.0), answered("b", 0.0), answered("a", 1.0)];
        let after = [answered("a", 1.0), answered("b", 1.0)];
        let (t, b, a) = pick(&tasks, &before, &after).unwrap();
        assert_eq!((t.id.as_str(), b.reward, a.reward), ("b", 0.0, 1.0));
        let after = [answered("c", 0.0), answered("b", 0.0)];
        assert_eq!(pick(&tasks, &before, &after).unwrap().0.id, "b", "the first answered in both");
        assert!(pick(&tasks, &before, &[]).is_none());
    }
}
