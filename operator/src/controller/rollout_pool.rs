//! The RolloutPool controller: worker Deployment, Service and ConfigMap, and the inference server
//! Deployment and Service for SGLang or vLLM; readiness from the Deployments. The servers also
//! take the LoRA adapters of the TrainingJobs that publish theirs to the pool
//! ([`crate::build::adapters`]), so a TrainingJob's change reconciles the pool it names.

use super::apply::{apply, ensure};
use super::kind::{Kind, Outcome, Watches};
use super::{Context, Error};
use crate::build::rollout_pool::{RolloutPoolChildren, children};
use crate::build::{InvalidSpec, Settings, adapters};
use crate::crd::rollout_pool::{RolloutPoolPhase, RolloutPoolStatus};
use crate::crd::training_job::TrainingJobPhase;
use crate::crd::{RolloutPool, TrainingJob};
use crate::status::rollout_pool::derive;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

impl Kind for RolloutPool {
    const NAME: &'static str = "rollout-pool";
    type Children = RolloutPoolChildren;

    fn children(&self, settings: &Settings) -> Result<RolloutPoolChildren, InvalidSpec> {
        children(self, settings)
    }

    async fn sync(
        &self,
        ctx: &Context,
        mut children: RolloutPoolChildren,
        now: &Time,
    ) -> Result<Outcome<RolloutPoolStatus>, Error> {
        ensure(ctx, &children.token).await?;
        apply(ctx, &children.config_map).await?;
        let name = self.name_any();
        let jobs: Vec<TrainingJob> = ctx
            .caches
            .training_jobs
            .list(&self.namespace().unwrap_or_default())
            .into_iter()
            .filter(|tj| tj.spec.rollout_pool_ref.as_ref() == Some(&name))
            .map(|tj| tj.as_ref().clone())
            .collect();
        if let Some(servers) = children.inference.as_mut()
            && let Some(rank) = adapters::needed_rank(self, &jobs)
        {
            adapters::serve(self, servers, rank);
        }
        let held = self.spec.hold_until_admitted && !serves_a_running_job(self, &jobs);
        if held {
            hold(&mut children);
        }
        let inference = match &children.inference {
            Some(servers) => {
                let d = apply(ctx, &servers.deployment).await?;
                apply(ctx, &servers.service).await?;
                apply(ctx, &servers.replicas).await?;
                Some(d)
            }
            None => None,
        };
        let (workers, _) =
            futures::try_join!(apply(ctx, &children.deployment), apply(ctx, &children.service))?;
        let inference = children.inference.as_ref().map(|_| inference.as_ref());
        let (status, transition) = derive(self, Some(&workers), inference, held, now);
        Ok(Outcome { status, transition, requeue: None })
    }

    fn conditions(status: &mut RolloutPoolStatus) -> &mut Vec<Condition> {
        &mut status.conditions
    }

    fn mark_invalid(status: &mut RolloutPoolStatus, generation: Option<i64>) {
        status.phase = RolloutPoolPhase::Failed;
        status.observed_generation = generation;
    }

    /// The children, and the TrainingJobs that name the pool (their LoRA adapters, whether one
    /// runs).
    fn watch(watches: Watches<Self>) -> Watches<Self> {
        watches.owns::<Deployment>().owns::<Service>().owns::<ConfigMap>().watches(|tj: TrainingJob| {
            let namespace = tj.namespace();
            tj.spec.rollout_pool_ref.map(|pool| match namespace {
                Some(namespace) => ObjectRef::new(&pool).within(&namespace),
                None => ObjectRef::new(&pool),
            })
        })
    }
}

/// Whether a TrainingJob of `jobs` that names `pool` runs (its trainer admitted and started).
fn serves_a_running_job(pool: &RolloutPool, jobs: &[TrainingJob]) -> bool {
    let name = pool.name_any();
    jobs.iter().any(|tj| {
        tj.spec.rollout_pool_ref.as_ref() == Some(&name)
            && tj.status.as_ref().is_some_and(|s| s.phase == TrainingJobPhase::Running)
    })
}

/// Scales the workers and inference servers of `children` to zero.
fn hold(children: &mut RolloutPoolChildren) {
    let deployments = std::iter::once(&mut children.deployment)
        .chain(children.inference.as_mut().map(|i| &mut i.deployment));
    for deployment in deployments {
        if let Some(spec) = deployment.spec.as_mut() {
            spec.replicas = Some(0);
        }
    }
}
