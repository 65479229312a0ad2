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
use crate::crd::{RolloutPool, TrainingJob};
use crate::status::rollout_pool::derive;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
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
        if let Some(servers) = children.inference.as_mut() {
            let namespace = self.namespace().unwrap_or_default();
            let jobs = Api::<TrainingJob>::namespaced(ctx.client.clone(), &namespace);
            let jobs = jobs.list(&ListParams::default()).await?.items;
            if let Some(rank) = adapters::needed_rank(self, &jobs) {
                adapters::serve(self, servers, rank);
            }
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
        let workers = apply(ctx, &children.deployment).await?;
        apply(ctx, &children.service).await?;
        let inference = children.inference.as_ref().map(|_| inference.as_ref());
        let (status, transition) = derive(self, Some(&workers), inference, now);
        Ok(Outcome { status, transition, requeue: None })
    }

    fn conditions(status: &mut RolloutPoolStatus) -> &mut Vec<Condition> {
        &mut status.conditions
    }

    fn mark_invalid(status: &mut RolloutPoolStatus, generation: Option<i64>) {
        status.phase = RolloutPoolPhase::Failed;
        status.observed_generation = generation;
    }

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
