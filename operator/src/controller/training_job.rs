//! The TrainingJob controller: waits for its Retriever and RolloutPool, runs the trainer Job
//! attempts with the rendered config, Services and checkpoint claim, reads the trainer's status,
//! and cleans up after `ttlSecondsAfterFinished`.
//!
//! The current Job is always read from the API (not a cache), and a Job created for the next
//! attempt whose status write was lost is adopted, so a restarted operator never starts an
//! attempt twice. When an attempt ends, rank 0's termination message (the trainer's final
//! `/status` JSON, written to `KART_STATUS_FILE`) fills in the last step.

use super::apply::{apply, delete, ensure, get, patch_status, publish};
use super::{Context, Error, Scope, child_api};
use crate::build::InvalidSpec;
use crate::build::meta::{COMPONENT as COMPONENT_LABEL, INSTANCE};
use crate::build::training_job::{
    ATTEMPT, COMPONENT, TrainingJobChildren, children, job, job_name, nodes_service_name, status_url,
    workload_name,
};
use crate::crd::condition::{self, types};
use crate::crd::{Retriever, RolloutPool, TrainingJob};
use crate::status::Transition;
use crate::status::job::{JobOutcome, outcome, termination_message};
use crate::status::trainer::TrainerReport;
use crate::status::training_job::{Action as Step, Dependency, Observed, plan};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::ListParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The controller's name in metrics and logs.
pub const NAME: &str = "training-job";

/// Brings `tj`'s children and status one step further.
pub async fn reconcile(tj: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    let now = Time(jiff::Timestamp::now());
    let namespace = tj.namespace().unwrap_or_default();
    let name = tj.name_any();
    let children = match children(&tj) {
        Ok(c) => c,
        Err(invalid) => return invalid_spec(&tj, &ctx, &invalid, &now).await,
    };
    let mut view = (*tj).clone();
    let status = view.status.get_or_insert_default();
    let finished = status.phase.is_finished();
    if !finished && get::<Job>(&ctx, &namespace, &job_name(&name, status.attempts)).await?.is_some() {
        status.job_name = Some(job_name(&name, status.attempts));
        status.attempts += 1;
    }
    let current = match (&status.job_name, finished) {
        (Some(job), false) => {
            get::<Job>(&ctx, &namespace, job).await?.filter(|j| j.metadata.deletion_timestamp.is_none())
        }
        _ => None,
    };
    let attempt = status.attempts - 1;
    let (mut retriever, mut rollout_pool) = (None, None);
    if current.is_none() && !finished && !tj.spec.suspend {
        if let Some(r) = &tj.spec.retriever_ref {
            let ret = get::<Retriever>(&ctx, &namespace, r).await?;
            retriever = Some(dependency(
                ret.as_ref().and_then(|r| r.status.as_ref()).map(|s| s.conditions.as_slice()),
                ret.is_some(),
            ));
        }
        if let Some(p) = &tj.spec.rollout_pool_ref {
            let pool = get::<RolloutPool>(&ctx, &namespace, p).await?;
            rollout_pool = Some(dependency(
                pool.as_ref().and_then(|p| p.status.as_ref()).map(|s| s.conditions.as_slice()),
                pool.is_some(),
            ));
        }
    }
    let report = match current.as_ref().map(outcome) {
        Some(JobOutcome::Active) => match ctx.status_source.fetch(&status_url(&tj)).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!(training_job = %name, error = %e, "trainer status not available");
                None
            }
        },
        Some(_) => final_report(&ctx, &tj, attempt).await?,
        None => None,
    };
    let plan =
        plan(&view, Observed { retriever, rollout_pool, job: current.as_ref(), report, now }, ctx.poll);
    match &plan.action {
        Step::None => {}
        Step::Apply => apply_children(&ctx, &children).await?,
        Step::Start { attempt } => {
            apply_children(&ctx, &children).await?;
            apply(&ctx, &job(&tj, &ctx.settings, *attempt)).await?;
        }
        Step::StopJob { name } => delete::<Job>(&ctx, &namespace, name).await?,
        Step::CleanUp => clean_up(&ctx, &tj, plan.status.attempts).await?,
    }
    if tj.status.as_ref() != Some(&plan.status) {
        patch_status(&ctx, tj.as_ref(), &plan.status).await?;
    }
    if let Some(t) = &plan.transition {
        publish(&ctx, tj.as_ref(), t).await;
    }
    ctx.backoff.succeeded(&key(&tj));
    Ok(Action::requeue(plan.requeue.unwrap_or(ctx.resync)))
}

/// How a referenced resource stands, from its conditions.
fn dependency(conditions: Option<&[Condition]>, exists: bool) -> Dependency {
    match (exists, conditions) {
        (false, _) => Dependency::Missing,
        (true, Some(c)) if condition::is_true(c, types::READY) => Dependency::Ready,
        _ => Dependency::NotReady,
    }
}

/// Applies the children other than Jobs.
async fn apply_children(ctx: &Context, children: &TrainingJobChildren) -> Result<(), Error> {
    apply(ctx, &children.config_map).await?;
    if let Some(claim) = &children.claim {
        ensure(ctx, claim).await?;
    }
    apply(ctx, &children.service).await?;
    if let Some(nodes) = &children.nodes_service {
        apply(ctx, nodes).await?;
    }
    Ok(())
}

/// Rank 0's termination message of attempt `attempt`: the trainer's final report, if it wrote
/// one.
async fn final_report(ctx: &Context, tj: &TrainingJob, attempt: i32) -> Result<Option<TrainerReport>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    let selector = format!("{INSTANCE}={},{COMPONENT_LABEL}={COMPONENT},{ATTEMPT}={attempt}", tj.name_any());
    let pods = pods.list(&ListParams::default().labels(&selector)).await?;
    let rank0 = pods.items.iter().find(|p| {
        let index = p.annotations().get(crate::build::meta::COMPLETION_INDEX).map(String::as_str);
        index.is_none_or(|i| i == "0")
    });
    Ok(rank0.and_then(termination_message).and_then(|m| serde_json::from_str(m).ok()))
}

/// Deletes a finished run's workloads: its Jobs, Services and ConfigMap (not the checkpoints).
async fn clean_up(ctx: &Context, tj: &TrainingJob, attempts: i32) -> Result<(), Error> {
    let namespace = tj.namespace().unwrap_or_default();
    let name = tj.name_any();
    for attempt in 0..attempts {
        delete::<Job>(ctx, &namespace, &job_name(&name, attempt)).await?;
    }
    delete::<Service>(ctx, &namespace, &workload_name(&name)).await?;
    delete::<Service>(ctx, &namespace, &nodes_service_name(&name)).await?;
    delete::<ConfigMap>(ctx, &namespace, &workload_name(&name)).await?;
    Ok(())
}

/// Records an invalid spec as a `ValidationFailed` condition (and an Event when new).
async fn invalid_spec(
    tj: &TrainingJob,
    ctx: &Context,
    invalid: &InvalidSpec,
    now: &Time,
) -> Result<Action, Error> {
    let mut status = tj.status.clone().unwrap_or_default();
    let message = invalid.to_string();
    let changed = condition::set(
        &mut status.conditions,
        types::VALIDATION_FAILED,
        true,
        "InvalidSpec",
        message.clone(),
        tj.metadata.generation,
        now,
    );
    status.observed_generation = tj.metadata.generation;
    if tj.status.as_ref() != Some(&status) {
        patch_status(ctx, tj, &status).await?;
    }
    if changed {
        publish(ctx, tj, &Transition::warning("ValidationFailed", message)).await;
    }
    ctx.backoff.succeeded(&key(tj));
    Ok(Action::await_change())
}

fn key(tj: &TrainingJob) -> String {
    format!("{NAME}/{}/{}", tj.namespace().unwrap_or_default(), tj.name_any())
}

/// Retries a failed reconciliation after the object's backoff.
pub fn error_policy(tj: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(NAME, error.reason());
    let delay = ctx.backoff.failed(&key(&tj));
    tracing::warn!(training_job = %tj.name_any(), error = %error, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// TrainingJobs of `namespace` whose `reference` (a ref field) names `name`.
fn referencing(
    store: &Store<TrainingJob>,
    namespace: Option<String>,
    name: String,
    reference: fn(&TrainingJob) -> Option<&String>,
) -> Vec<ObjectRef<TrainingJob>> {
    store
        .state()
        .iter()
        .filter(|tj| tj.namespace() == namespace && reference(tj) == Some(&name))
        .map(|tj| ObjectRef::from_obj(tj.as_ref()))
        .collect()
}

/// Runs the controller over `scope` until `shutdown` completes: per watched namespace, the
/// controller and a task that keeps the `kart_operator_training_jobs` gauge current.
pub fn run(
    ctx: Arc<Context>,
    scope: &Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Vec<BoxFuture<'static, ()>> {
    let mut tasks = Vec::new();
    for api in scope.apis::<TrainingJob>(&ctx.client) {
        let ns = api.namespace().map(str::to_string);
        let c = &ctx.client;
        let wc = watcher::Config::default();
        let controller = Controller::new(api, wc.clone());
        let store = controller.store();
        let (by_retriever, by_pool) = (store.clone(), store.clone());
        tasks.push(
            controller
                .owns(child_api::<Job>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<Service>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<ConfigMap>(c, ns.as_deref()), wc.clone())
                .owns(child_api::<PersistentVolumeClaim>(c, ns.as_deref()), wc.clone())
                .watches(child_api::<Retriever>(c, ns.as_deref()), wc.clone(), move |r: Retriever| {
                    referencing(&by_retriever, r.namespace(), r.name_any(), |tj| {
                        tj.spec.retriever_ref.as_ref()
                    })
                })
                .watches(child_api::<RolloutPool>(c, ns.as_deref()), wc, move |p: RolloutPool| {
                    referencing(&by_pool, p.namespace(), p.name_any(), |tj| tj.spec.rollout_pool_ref.as_ref())
                })
                .graceful_shutdown_on(shutdown.clone())
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|result| async move {
                    if let Err(e) = result {
                        tracing::debug!(controller = NAME, error = %e, "controller event");
                    }
                })
                .boxed(),
        );
        let metrics = ctx.metrics.clone();
        let stop = shutdown.clone();
        tasks.push(
            async move {
                let gauge = async {
                    loop {
                        metrics.set_training_jobs(
                            store
                                .state()
                                .iter()
                                .map(|tj| tj.status.as_ref().map(|s| s.phase).unwrap_or_default()),
                        );
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                };
                tokio::select! {
                    () = gauge => {}
                    () = stop => {}
                }
            }
            .boxed(),
        );
    }
    tasks
}
