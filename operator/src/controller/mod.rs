//! The reconcilers, modelled on kube-rs's controller-rs: a shared [`Context`], an error policy
//! with per-object exponential backoff, metrics per controller.
//!
//! - [`kind`]: the controller written once: the [`Kind`] trait each kind implements, and
//!   [`reconcile`], [`error_policy`] and [`run`] over it;
//! - [`retriever`], [`rollout_pool`], [`training_job`]: each kind's [`Kind`];
//! - [`apply`]: server-side apply, deletion and Events; [`backoff`]: the per-object backoff;
//! - [`cache`]: the caches of the kinds and children the reconcilers read;
//! - [`error`]: what can fail.

pub mod apply;
pub mod backoff;
pub mod cache;
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
use apply::Applied;
use backoff::Backoff;
use cache::Caches;
use futures::FutureExt;
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
    /// How many objects of one kind (per watched namespace) are reconciled at once: more queue
    /// at the API server when thousands change together, and each takes longer.
    pub concurrency: u16,
    pub backoff: Backoff,
    /// What the reconcilers read instead of the API.
    pub caches: Caches,
    /// The children's generations as this operator applied them.
    pub applied: Applied,
}

impl Context {
    /// A context over `scope` reporting Events as `kart-operator` (instance `instance`); its
    /// caches fill once [`all`] runs.
    pub fn new(
        client: Client,
        scope: &Scope,
        settings: Settings,
        metrics: Arc<Metrics>,
        status_source: Arc<dyn StatusSource>,
        instance: Option<String>,
    ) -> Self {
        let recorder =
            Recorder::new(client.clone(), Reporter { controller: "kart-operator".into(), instance });
        Context {
            caches: Caches::new(&client, scope),
            applied: Applied::default(),
            client,
            settings,
            recorder,
            metrics,
            status_source,
            poll: Duration::from_secs(10),
            resync: Duration::from_secs(300),
            concurrency: 4,
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

/// The caches' reflectors and all three controllers over `scope`, stopping gracefully when
/// `shutdown` completes; await them together (e.g. with `futures::future::join_all`). The
/// controllers start once every cache has listed its objects, so a restarted operator finds
/// every child it made before it reconciles.
pub fn all(
    ctx: Arc<Context>,
    scope: &Scope,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Vec<futures::future::BoxFuture<'static, ()>> {
    let mut tasks = ctx.caches.reflectors(shutdown.clone());
    let mut controllers = run::<Retriever>(ctx.clone(), scope, shutdown.clone());
    controllers.extend(run::<RolloutPool>(ctx.clone(), scope, shutdown.clone()));
    controllers.extend(run::<TrainingJob>(ctx.clone(), scope, shutdown.clone()));
    let controllers = async move {
        tokio::select! {
            () = ctx.caches.ready() => {}
            () = shutdown => return,
        }
        tracing::info!("caches listed; reconciling");
        futures::future::join_all(controllers).await;
    };
    tasks.push(controllers.boxed());
    tasks
}
