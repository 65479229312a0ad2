//! A RolloutPool's status from its worker and inference Deployments.

use super::Transition;
use crate::build::rollout_pool::{endpoint, selector};
use crate::crd::condition::{self, types};
use crate::crd::rollout_pool::{RolloutPool, RolloutPoolPhase, RolloutPoolStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn ready_replicas(d: Option<&Deployment>) -> i32 {
    d.and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas).unwrap_or(0)
}

/// The new status given the worker Deployment and, when the operator runs them, the inference
/// Deployment, as observed; `held`: scaled to zero by `holdUntilAdmitted`.
pub fn derive(
    pool: &RolloutPool,
    workers: Option<&Deployment>,
    inference: Option<Option<&Deployment>>,
    held: bool,
    now: &Time,
) -> (RolloutPoolStatus, Option<Transition>) {
    let old = pool.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let generation = pool.metadata.generation;
    condition::clear(&mut status.conditions, types::VALIDATION_FAILED, "Valid", generation, now);
    status.observed_generation = generation;
    status.endpoint = Some(endpoint(pool));
    status.selector = Some(selector(pool));
    status.replicas = workers.and_then(|d| d.status.as_ref()).and_then(|s| s.replicas).unwrap_or(0);
    status.ready_replicas = ready_replicas(workers);
    let want = pool.spec.replicas;
    let workers_ready = workers.is_some() && status.ready_replicas >= want;
    let (servers_ready, servers_note) = match (inference, &pool.spec.inference) {
        (Some(d), Some(spec)) => {
            let ready = ready_replicas(d);
            (
                d.is_some() && ready >= spec.replicas,
                format!(", {ready}/{} inference servers ready", spec.replicas),
            )
        }
        _ => (true, String::new()),
    };
    if held {
        status.phase = RolloutPoolPhase::Held;
        let message = "no TrainingJob of the pool runs (holdUntilAdmitted): no workers";
        condition::set(&mut status.conditions, types::READY, false, "Held", message, generation, now);
        let transition = (status.phase != old.phase).then(|| Transition::normal("Held", message));
        return (status, transition);
    }
    let message = format!("{}/{want} workers ready{servers_note}", status.ready_replicas);
    let ready = workers_ready && servers_ready;
    status.phase = if ready { RolloutPoolPhase::Ready } else { RolloutPoolPhase::Progressing };
    let reason = if ready { "Available" } else { "Progressing" };
    condition::set(&mut status.conditions, types::READY, ready, reason, message.clone(), generation, now);
    let transition = (status.phase != old.phase).then(|| Transition::normal(reason, message));
    (status, transition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use k8s_openapi::api::apps::v1::DeploymentStatus;

    fn deployment(replicas: i32, ready: i32) -> Deployment {
        Deployment {
            status: Some(DeploymentStatus {
                replicas: Some(replicas),
                ready_replicas: Some(ready),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        }
    }

    #[test]
    fn ready_needs_workers_and_inference_servers() {
        let now = Time(jiff::Timestamp::from_second(1).unwrap());
        let pool = fixtures::rollout_pool();
        let (s, _) = derive(&pool, Some(&deployment(2, 2)), Some(Some(&deployment(1, 0))), false, &now);
        assert_eq!(s.phase, RolloutPoolPhase::Progressing);
        assert!(s.conditions[0].message.contains("0/1 inference servers ready"), "{:?}", s.conditions);
        let (s, t) = derive(&pool, Some(&deployment(2, 2)), Some(Some(&deployment(1, 1))), false, &now);
        assert_eq!((s.phase, s.replicas, s.ready_replicas), (RolloutPoolPhase::Ready, 2, 2));
        assert_eq!(
            s.selector.as_deref(),
            Some("app.kubernetes.io/component=rollout,app.kubernetes.io/instance=pool")
        );
        assert_eq!(t.unwrap().reason, "Available");
        let (s, t) = derive(&pool, Some(&deployment(0, 0)), Some(Some(&deployment(0, 0))), true, &now);
        assert_eq!(s.phase, RolloutPoolPhase::Held);
        assert!(!condition::is_true(&s.conditions, types::READY));
        assert_eq!(t.unwrap().reason, "Held");
    }
}
