//! The Retriever controller: index-build Job, then Deployment, Service and ConfigMap; readiness
//! from the Deployment.

use super::apply::{apply, ensure, get, patch_status, publish};
use super::{Context, Error, Scope, child_api};
use crate::build::InvalidSpec;
use crate::build::meta;
use crate::build::retriever::{INDEX_COMPONENT, children, index_name};
use crate::crd::Retriever;
use crate::crd::condition::{self, types};
use crate::crd::retriever::RetrieverPhase;
use crate::status::Transition;
use crate::status::job::{JobOutcome, outcome, termination_message};
use crate::status::retriever::{derive, documents_indexed, index_ready};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use std::future::Future;
use std::sync::Arc;

/// The controller's name in metrics and logs.
pub const NAME: &str = "retriever";

/// Brings `ret`'s children and status in line with its spec.
pub async fn reconcile(ret: Arc<Retriever>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    let now = Time(jiff::Timestamp::now());
    let namespace = ret.namespace().unwrap_or_default();
    let children = match children(&ret, &ctx.settings) {
        Ok(c) => c,
        Err(invalid) => return invalid_spec(&ret, &ctx, &invalid, &now).await,
    };
    apply(&ctx, &children.config_map).await?;
    if let Some(claim) = &children.claim {
        ensure(&ctx, claim).await?;
    }
    let mut job = None;
    if !index_ready(&ret)
        && let Some(desired) = &children.index_job
    {
        job = match get::<Job>(&ctx, &namespace, &index_name(&ret.name_any())).await? {
            Some(existing) => Some(existing),
            None => Some(apply(&ctx, desired).await?),
        };
    }
    let succeeded = job.as_ref().map(outcome) == Some(JobOutcome::Succeeded);
    let built = index_ready(&ret) || succeeded;
    let documents = if succeeded { index_report(&ctx, &ret).await? } else { None };
    let deployment = if built {
        let d = apply(&ctx, &children.deployment).await?;
        apply(&ctx, &children.service).await?;
        Some(d)
    } else {
        None
    };
    let (status, transition) = derive(&ret, job.as_ref(), documents, deployment.as_ref(), &now);
    if ret.status.as_ref() != Some(&status) {
        patch_status(&ctx, ret.as_ref(), &status).await?;
    }
    if let Some(t) = transition {
        publish(&ctx, ret.as_ref(), &t).await;
    }
    ctx.backoff.succeeded(&key(&ret));
    Ok(Action::requeue(ctx.resync))
}

/// The passage count the index-build pod left as its termination message, if it did.
async fn index_report(ctx: &Context, ret: &Retriever) -> Result<Option<u64>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ret.namespace().unwrap_or_default());
    let selector = meta::selector_string(&ret.name_any(), INDEX_COMPONENT);
    let pods = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(pods.items.iter().filter_map(termination_message).find_map(documents_indexed))
}

/// Records an invalid spec as a `ValidationFailed` condition (and an Event when new); the
/// object is not retried until it changes.
async fn invalid_spec(
    ret: &Retriever,
    ctx: &Context,
    invalid: &InvalidSpec,
    now: &Time,
) -> Result<Action, Error> {
    let mut status = ret.status.clone().unwrap_or_default();
    let message = invalid.to_string();
    let changed = condition::set(
        &mut status.conditions,
        types::VALIDATION_FAILED,
        true,
        "InvalidSpec",
        message.clone(),
        ret.metadata.generation,
        now,
    );
    status.phase = RetrieverPhase::Failed;
    status.observed_generation = ret.metadata.generation;
    if ret.status.as_ref() != Some(&status) {
        patch_status(ctx, ret, &status).await?;
    }
    if changed {
        publish(ctx, ret, &Transition::warning("ValidationFailed", message)).await;
    }
    ctx.backoff.succeeded(&key(ret));
    Ok(Action::await_change())
}

fn key(ret: &Retriever) -> String {
    format!("{NAME}/{}/{}", ret.namespace().unwrap_or_default(), ret.name_any())
}

/// Retries a failed reconciliation after the object's backoff.
pub fn error_policy(ret: Arc<Retriever>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(NAME, error.reason());
    let delay = ctx.backoff.failed(&key(&ret));
    tracing::warn!(retriever = %ret.name_any(), error = %error, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Runs the controller over `scope` until `shutdown` completes: one future per watched namespace.
pub fn run(
    ctx: Arc<Context>,
    scope: &Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Vec<BoxFuture<'static, ()>> {
    scope
        .apis::<Retriever>(&ctx.client)
        .into_iter()
        .map(|api| {
            let ns = api.namespace().map(str::to_string);
            let c = &ctx.client;
            let wc = watcher::Config::default();
            Controller::new(api, wc.clone())
                .owns(child_api::<Job>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<Deployment>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<Service>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<ConfigMap>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<PersistentVolumeClaim>(c, ns.as_deref()), wc)
                .graceful_shutdown_on(shutdown.clone())
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|result| async move {
                    if let Err(e) = result {
                        tracing::debug!(controller = NAME, error = %e, "controller event");
                    }
                })
                .boxed()
        })
        .collect()
}
