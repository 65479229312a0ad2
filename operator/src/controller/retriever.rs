//! The Retriever controller: index-build Job, then Deployment, Service and ConfigMap; readiness
//! from the Deployment.

use super::apply::{apply, ensure, get};
use super::kind::{Kind, Outcome, Watches};
use super::{Context, Error};
use crate::build::meta;
use crate::build::retriever::{INDEX_COMPONENT, RetrieverChildren, children, index_name};
use crate::build::{InvalidSpec, Settings};
use crate::crd::Retriever;
use crate::crd::retriever::{RetrieverPhase, RetrieverStatus};
use crate::status::job::{JobOutcome, outcome, termination_message};
use crate::status::retriever::{derive, documents_indexed, index_ready};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

impl Kind for Retriever {
    const NAME: &'static str = "retriever";
    type Children = RetrieverChildren;

    fn children(&self, settings: &Settings) -> Result<RetrieverChildren, InvalidSpec> {
        children(self, settings)
    }

    async fn sync(
        &self,
        ctx: &Context,
        children: RetrieverChildren,
        now: &Time,
    ) -> Result<Outcome<RetrieverStatus>, Error> {
        apply(ctx, &children.config_map).await?;
        if let Some(claim) = &children.claim {
            ensure(ctx, claim).await?;
        }
        let mut job = None;
        if !index_ready(self)
            && let Some(desired) = &children.index_job
        {
            let namespace = self.namespace().unwrap_or_default();
            job = match get::<Job>(ctx, &namespace, &index_name(&self.name_any())).await? {
                Some(existing) => Some(existing),
                None => Some(apply(ctx, desired).await?),
            };
        }
        let succeeded = job.as_ref().map(outcome) == Some(JobOutcome::Succeeded);
        let built = index_ready(self) || succeeded;
        let documents = if succeeded { index_report(ctx, self).await? } else { None };
        let deployment = if built {
            let d = apply(ctx, &children.deployment).await?;
            apply(ctx, &children.service).await?;
            Some(d)
        } else {
            None
        };
        let (status, transition) = derive(self, job.as_ref(), documents, deployment.as_ref(), now);
        Ok(Outcome { status, transition, requeue: None })
    }

    fn conditions(status: &mut RetrieverStatus) -> &mut Vec<Condition> {
        &mut status.conditions
    }

    fn mark_invalid(status: &mut RetrieverStatus, generation: Option<i64>) {
        status.phase = RetrieverPhase::Failed;
        status.observed_generation = generation;
    }

    fn watch(watches: Watches<Self>) -> Watches<Self> {
        watches
            .owns::<Job>()
            .owns::<Deployment>()
            .owns::<Service>()
            .owns::<ConfigMap>()
            .owns::<PersistentVolumeClaim>()
    }
}

/// The passage count the index-build pod left as its termination message, if it did.
async fn index_report(ctx: &Context, ret: &Retriever) -> Result<Option<u64>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ret.namespace().unwrap_or_default());
    let selector = meta::selector_string(&ret.name_any(), INDEX_COMPONENT);
    let pods = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(pods.items.iter().filter_map(termination_message).find_map(documents_indexed))
}
