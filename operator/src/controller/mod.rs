//! The reconcilers, modelled on kube-rs's controller-rs: a shared [`Context`], an error policy
//! with per-object exponential backoff, metrics per controller.
//!
//! - [`kind`]: the controller written once: the [`Kind`] trait each kind implements, and
//!   [`reconcile`], [`error_policy`] and [`run`] over it;
//! - [`retriever`], [`rollout_pool`], [`training_job`]: each kind's [`Kind`];
//! - [`apply`]: server-side apply, deletion and Events; [`backoff`]: the per-object backoff;
//! - [`error`]: what can fail.

pub mod apply;
pub mod backoff;
pub mod error;
pub mod kind;
pub mod retriever;
pub mod rollout_pool;
pub mod training_job;

pub use error::Error;
pub use kind::{Kind, error_policy, reconcile, run};

use crate::build::Settings;
use crate::crd::{Retriever, RolloutPool, TrainingJob};
use crate::metrics::Metrics;
use crate::status::trainer::StatusSource;
use backoff::Backoff;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use std::sync::Arc;
use std::time::Duration;

/// Everything the reconcilers share.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Reads trainers' `/status`.
    pub status_source: Arc<dyn StatusSource>,
    /// How often a running trainer's status is read.
    pub poll: Duration,
    /// How often every object is reconciled without a change.
    pub resync: Duration,
    pub backoff: Backoff,
}

impl Context {
    /// A context reporting Events as `kart-operator` (instance `instance`).
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Arc<Metrics>,
        status_source: Arc<dyn StatusSource>,
        instance: Option<String>,
    ) -> Self {
        let recorder =
            Recorder::new(client.clone(), Reporter { controller: "kart-operator".into(), instance });
        Context {
            client,
            settings,
            recorder,
            metrics,
            status_source,
            poll: Duration::from_secs(10),
            resync: Duration::from_secs(300),
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(300)),
        }
    }
}

/// The namespaces the controllers watch: some, or all when empty.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub namespaces: Vec<String>,
}

impl Scope {
    /// One `Api` per watched namespace (or one over all namespaces).
    pub fn apis<K>(&self, client: &Client) -> Vec<kube::Api<K>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        if self.namespaces.is_empty() {
            vec![kube::Api::all(client.clone())]
        } else {
            self.namespaces.iter().map(|ns| kube::Api::namespaced(client.clone(), ns)).collect()
        }
    }
}

/// An `Api` of child kind `K` in `namespace` (all namespaces when `None`).
pub fn child_api<K>(client: &Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    }
}

/// All three controllers over `scope`, stopping gracefully when `shutdown` completes; await them
/// together (e.g. with `futures::future::join_all`).
pub fn all(
    ctx: Arc<Context>,
    scope: &Scope,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Vec<futures::future::BoxFuture<'static, ()>> {
    let mut tasks = run::<Retriever>(ctx.clone(), scope, shutdown.clone());
    tasks.extend(run::<RolloutPool>(ctx.clone(), scope, shutdown.clone()));
    tasks.extend(run::<TrainingJob>(ctx, scope, shutdown));
    tasks
}
