//! The TrainingJob controller: waits for its Retriever and RolloutPool, runs the trainer Job
//! attempts with the rendered config, Services and checkpoint claim, reads the trainer's status,
//! and cleans up after `ttlSecondsAfterFinished`.
//!
//! The Retriever, RolloutPool and Jobs are read from the operator's caches (a dependency not Ready
//! there, or a current Job not there, from the API). A Job created for the next attempt whose
//! status write was lost is adopted, so a restarted operator never starts an attempt twice (one
//! a lagging cache misses is applied again under its own name, the same Job). When an attempt ends, rank 0's termination message (the trainer's final
//! `/status` JSON, written to `KART_STATUS_FILE`) fills in the last step. A queued run's Job is
//! read with its Kueue Workload, which says why it waits.

use super::apply::{apply, cached, delete, ensure, get};
use super::cache::Cached;
use super::kind::{Kind, Outcome, Watches};
use super::{Context, Error};
use crate::build::meta::{COMPONENT as COMPONENT_LABEL, INSTANCE};
use crate::build::training_job::{
    ATTEMPT, COMPONENT, TrainingJobChildren, children, job, job_name, nodes_service_name, status_url,
    weight_sync_fits, workload_name,
};
use crate::build::{InvalidSpec, Settings};
use crate::crd::condition::{self, types};
use crate::crd::rollout_pool::RolloutPoolPhase;
use crate::crd::training_job::TrainingJobStatus;
use crate::crd::{Retriever, RolloutPool, TrainingJob, kueue};
use crate::status::job::{JobOutcome, outcome, termination_message};
use crate::status::queue::{Workload, queue_status};
use crate::status::trainer::TrainerReport;
use crate::status::training_job::{Action as Step, Dependency, Observed, plan};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{DynamicObject, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

impl Kind for TrainingJob {
    const NAME: &'static str = "training-job";
    type Children = TrainingJobChildren;

    fn children(&self, _settings: &Settings) -> Result<TrainingJobChildren, InvalidSpec> {
        children(self)
    }

    /// The weight sync against the engine of the RolloutPool of `rolloutPoolRef`.
    async fn check_references(&self, ctx: &Context) -> Result<Option<InvalidSpec>, Error> {
        let Some(pool) = &self.spec.rollout_pool_ref else { return Ok(None) };
        let namespace = self.namespace().unwrap_or_default();
        let pool = cached::<RolloutPool>(ctx, &namespace, pool);
        Ok(pool.and_then(|p| weight_sync_fits(self, &p).err()))
    }

    /// Brings the children and status one step further.
    async fn sync(
        &self,
        ctx: &Context,
        children: TrainingJobChildren,
        now: &Time,
    ) -> Result<Outcome<TrainingJobStatus>, Error> {
        let namespace = self.namespace().unwrap_or_default();
        let name = self.name_any();
        let mut view = self.clone();
        let status = view.status.get_or_insert_default();
        let finished = status.phase.is_finished();
        if !finished && cached::<Job>(ctx, &namespace, &job_name(&name, status.attempts)).is_some() {
            status.job_name = Some(job_name(&name, status.attempts));
            status.attempts += 1;
        }
        let current = match (&status.job_name, finished) {
            (Some(job), false) => match cached::<Job>(ctx, &namespace, job) {
                Some(cached) => Some(cached.as_ref().clone()),
                None => get::<Job>(ctx, &namespace, job).await?,
            }
            .filter(|j| j.metadata.deletion_timestamp.is_none()),
            _ => None,
        };
        let attempt = status.attempts - 1;
        let (mut retriever, mut rollout_pool) = (None, None);
        if current.is_none() && !finished && !self.spec.suspend {
            if let Some(r) = &self.spec.retriever_ref {
                let ret = ready_or_read::<Retriever>(ctx, &namespace, r, |r| {
                    r.status.as_ref().map(|s| &s.conditions)
                })
                .await?;
                retriever = Some(dependency(
                    ret.as_ref().and_then(|r| r.status.as_ref()).map(|s| s.conditions.as_slice()),
                    ret.is_some(),
                ));
            }
            if let Some(p) = &self.spec.rollout_pool_ref {
                let pool = ready_or_read::<RolloutPool>(ctx, &namespace, p, |p| {
                    p.status.as_ref().map(|s| &s.conditions)
                })
                .await?;
                let status = pool.as_ref().and_then(|p| p.status.as_ref());
                rollout_pool = Some(match status.map(|s| s.phase) {
                    Some(RolloutPoolPhase::Held) => Dependency::Held,
                    _ => dependency(status.map(|s| s.conditions.as_slice()), pool.is_some()),
                });
            }
        }
        let report = match current.as_ref().map(outcome) {
            Some(JobOutcome::Active) => match ctx.status_source.fetch(&status_url(self)).await {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::debug!(training_job = %name, error = %e, "trainer status not available");
                    None
                }
            },
            Some(JobOutcome::Suspended) | None => None,
            Some(_) => final_report(ctx, self, attempt).await?,
        };
        let queue = match (self.queue(), &current) {
            (Some(queue), Some(job)) => {
                let admitted = outcome(job) != JobOutcome::Suspended;
                Some(queue_status(queue, &workload(ctx, &namespace, job).await?, admitted))
            }
            _ => None,
        };
        let observed =
            Observed { retriever, rollout_pool, job: current.as_ref(), report, queue, now: now.clone() };
        let plan = plan(&view, observed, ctx.poll);
        match &plan.action {
            Step::None => {}
            Step::Apply => apply_children(ctx, &children).await?,
            Step::Start { attempt } => {
                apply_children(ctx, &children).await?;
                apply(ctx, &job(self, &ctx.settings, *attempt)).await?;
            }
            Step::StopJob { name } => delete::<Job>(ctx, &namespace, name).await?,
            Step::CleanUp => clean_up(ctx, self, plan.status.attempts).await?,
        }
        Ok(Outcome { status: plan.status, transition: plan.transition, requeue: plan.requeue })
    }

    fn conditions(status: &mut TrainingJobStatus) -> &mut Vec<Condition> {
        &mut status.conditions
    }

    fn mark_invalid(status: &mut TrainingJobStatus, generation: Option<i64>) {
        status.observed_generation = generation;
    }

    /// The children, and the Retrievers and RolloutPools the TrainingJobs refer to.
    fn watch(watches: Watches<Self>) -> Watches<Self> {
        let (by_retriever, by_pool) = (watches.store(), watches.store());
        watches
            .owns::<Job>()
            .owns::<Service>()
            .owns::<ConfigMap>()
            .owns::<PersistentVolumeClaim>()
            .watches(move |r: Retriever| {
                referencing(&by_retriever, r.namespace(), r.name_any(), |tj| tj.spec.retriever_ref.as_ref())
            })
            .watches(move |p: RolloutPool| {
                referencing(&by_pool, p.namespace(), p.name_any(), |tj| tj.spec.rollout_pool_ref.as_ref())
            })
    }

    /// A task that keeps the `kart_operator_training_jobs` gauge current.
    fn tasks(
        store: Store<Self>,
        ctx: &Arc<Context>,
        shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
    ) -> Vec<BoxFuture<'static, ()>> {
        let metrics = ctx.metrics.clone();
        let gauge = async move {
            loop {
                metrics.set_training_jobs(
                    store.state().iter().map(|tj| tj.status.as_ref().map(|s| s.phase).unwrap_or_default()),
                );
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        };
        let task = async move {
            tokio::select! {
                () = gauge => {}
                () = shutdown => {}
            }
        };
        vec![task.boxed()]
    }
}

/// Referenced object `name` of `namespace` from the cache when it is Ready there (`conditions`:
/// its conditions), else read from the API: the cache may not yet hold the change that woke this
/// reconciliation (it has a watch of its own), and a dependency seen stale would wait for the
/// next recheck.
async fn ready_or_read<K: Cached>(
    ctx: &Context,
    namespace: &str,
    name: &str,
    conditions: impl Fn(&K) -> Option<&Vec<Condition>>,
) -> Result<Option<Arc<K>>, Error> {
    match cached::<K>(ctx, namespace, name) {
        Some(o) if conditions(&o).is_some_and(|c| condition::is_true(c, types::READY)) => Ok(Some(o)),
        _ => Ok(get::<K>(ctx, namespace, name).await?.map(Arc::new)),
    }
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
    let claim = async {
        match &children.claim {
            Some(claim) => ensure(ctx, claim).await.map(drop),
            None => Ok(()),
        }
    };
    let nodes = async {
        match &children.nodes_service {
            Some(nodes) => apply(ctx, nodes).await.map(drop),
            None => Ok(()),
        }
    };
    futures::try_join!(apply(ctx, &children.config_map), claim, apply(ctx, &children.service), nodes)?;
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

/// Kueue's Workload for trainer Job `job` (the one labelled with its UID).
async fn workload(ctx: &Context, namespace: &str, job: &Job) -> Result<Workload, Error> {
    let resource = kueue::workload_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    let selector = format!("{}={}", kueue::JOB_UID, job.metadata.uid.as_deref().unwrap_or_default());
    let listed = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Ok(Workload::Unreadable(
                "Kueue's Workload API (kueue.x-k8s.io/v1beta2) is not installed".into(),
            ));
        }
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok(Workload::Unreadable(format!(
                "the operator may not list Kueue's Workloads (the chart's kueue.enabled): {}",
                e.message
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let Some(found) = listed.items.into_iter().next() else { return Ok(Workload::Missing) };
    let status = found.data.get("status").cloned().unwrap_or_default();
    Ok(Workload::Found { name: found.name_any(), status: serde_json::from_value(status).unwrap_or_default() })
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
