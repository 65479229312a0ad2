//! Rolling out a group: `n` episodes of one task, run concurrently, as GRPO-style advantage
//! estimators need them (a workflow's episode gives a trajectory per role episode, all in the
//! task's group).

use super::env::{Context, Environment, RolloutError};
use super::metrics::RolloutMetrics;
use kart_core::generation::SamplingParams;
use kart_core::wire::Group;
use kart_core::wire::Task;

/// Rolls out `n` episodes of `task` concurrently. A request seed `s` gives episode `i` the seed
/// `s + i`, so a group is reproducible and its members differ.
pub async fn run_group(
    ctx: &Context,
    env: &dyn Environment,
    task: &Task,
    n: usize,
    sampling: &SamplingParams,
    metrics: Option<&RolloutMetrics>,
) -> Result<Group, RolloutError> {
    let runs = (0..n).map(|i| {
        let sampling =
            SamplingParams { seed: sampling.seed.map(|s| s.wrapping_add(i as u64)), ..sampling.clone() };
        async move {
            let _in_flight = metrics.map(InFlight::new);
            let id = format!("{}#{i}", task.id);
            let result = env.episode(ctx, task, id, &sampling).await;
            if let (Some(m), Ok(trajectories)) = (metrics, &result) {
                trajectories.iter().for_each(|t| m.observe(env.name(), t));
            }
            result
        }
    });
    let episodes = futures::future::join_all(runs).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    let trajectories = episodes.into_iter().flatten().collect();
    Ok(Group { prompt_id: task.id.clone(), data_source: task.data_source.clone(), trajectories })
}

/// Counts a trajectory in flight until dropped, also when its rollout is cancelled.
struct InFlight<'a>(&'a RolloutMetrics);

impl<'a> InFlight<'a> {
    fn new(metrics: &'a RolloutMetrics) -> Self {
        metrics.in_flight.inc();
        InFlight(metrics)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}
