//! The controller written once, generic over the reconciled kind: what a kind supplies is the
//! [`Kind`] trait; [`reconcile`], [`error_policy`] and [`run`] are the same for every kind.
//!
//! A reconciliation builds the kind's children from its spec (an invalid spec becomes a
//! `ValidationFailed` condition and a Warning Event, and is not retried until the object
//! changes), lets the kind bring the cluster in line ([`Kind::sync`]), writes the status if it
//! changed, publishes the transition and resets the object's backoff.

use super::apply::{patch_status, publish};
use super::cache::Cached;
use super::{Context, Error, Scope, child_api};
use crate::build::{InvalidSpec, Settings};
use crate::crd::condition::{self, types};
use crate::status::Transition;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::object::HasStatus;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A custom resource kind the operator reconciles: what differs between its controllers.
pub trait Kind: Cached + HasStatus<Status: Clone + Default + PartialEq + Serialize + Send + Sync> {
    /// The controller's name in metrics, logs and backoff keys.
    const NAME: &'static str;

    /// The children the spec asks for.
    type Children: Send;

    /// The children of this object, or why its spec cannot have any.
    fn children(&self, settings: &Settings) -> Result<Self::Children, InvalidSpec>;

    /// Why the spec cannot work with the objects it refers to, read from the API (none unless the
    /// kind checks some); a `Some` is handled as an invalid spec.
    fn check_references(
        &self,
        _ctx: &Context,
    ) -> impl Future<Output = Result<Option<InvalidSpec>, Error>> + Send {
        async { Ok(None) }
    }

    /// Brings `children` and the cluster in line with the spec; returns the next status.
    fn sync(
        &self,
        ctx: &Context,
        children: Self::Children,
        now: &Time,
    ) -> impl Future<Output = Result<Outcome<Self::Status>, Error>> + Send;

    /// The conditions of `status`.
    fn conditions(status: &mut Self::Status) -> &mut Vec<Condition>;

    /// Records an invalid spec of `generation` in `status` besides its condition:
    /// `observedGeneration`, and the failed phase where the kind has one.
    fn mark_invalid(status: &mut Self::Status, generation: Option<i64>);

    /// Adds what the controller watches besides the objects: the children it owns, related kinds.
    fn watch(watches: Watches<Self>) -> Watches<Self>;

    /// Tasks run beside the controller of each watched namespace, over its cache of objects
    /// (none unless the kind adds some); they end when `shutdown` completes.
    fn tasks(
        _store: Store<Self>,
        _ctx: &Arc<Context>,
        _shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
    ) -> Vec<BoxFuture<'static, ()>> {
        Vec::new()
    }
}

/// What [`Kind::sync`] arrived at.
#[derive(Debug, Clone)]
pub struct Outcome<S> {
    /// The next status (written when it differs from the current one).
    pub status: S,
    /// The transition worth an Event.
    pub transition: Option<Transition>,
    /// When to reconcile again without a change; `None`: after the context's resync period.
    pub requeue: Option<Duration>,
}

/// A kind's `Controller` over one namespace (or all), and what else it watches there.
pub struct Watches<K: Kind> {
    controller: Controller<K>,
    client: Client,
    namespace: Option<String>,
}

impl<K: Kind> Watches<K> {
    /// Also reconciles an object when a child of kind `C` it owns changes.
    pub fn owns<C>(self) -> Self
    where
        C: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + 'static,
    {
        let api = child_api::<C>(&self.client, self.namespace.as_deref());
        Watches { controller: self.controller.owns(api, watcher::Config::default()), ..self }
    }

    /// Also reconciles the objects `mapper` names when an object of kind `O` changes.
    pub fn watches<O, I>(self, mapper: impl Fn(O) -> I + Send + Sync + 'static) -> Self
    where
        O: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + 'static,
        I: IntoIterator<Item = ObjectRef<K>> + 'static,
        I::IntoIter: Send,
    {
        let api = child_api::<O>(&self.client, self.namespace.as_deref());
        Watches { controller: self.controller.watches(api, watcher::Config::default(), mapper), ..self }
    }

    /// The controller's cache of objects.
    pub fn store(&self) -> Store<K> {
        self.controller.store()
    }
}

/// Brings `obj`'s children and status in line with its spec.
pub async fn reconcile<K: Kind>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(K::NAME);
    let now = Time(jiff::Timestamp::now());
    let children = match obj.children(&ctx.settings) {
        Ok(c) => c,
        Err(invalid) => return invalid_spec(obj.as_ref(), &ctx, &invalid, &now).await,
    };
    if let Some(invalid) = obj.check_references(&ctx).await? {
        return invalid_spec(obj.as_ref(), &ctx, &invalid, &now).await;
    }
    let outcome = obj.sync(&ctx, children, &now).await?;
    record(obj.as_ref(), &ctx, &outcome.status, outcome.transition.as_ref()).await?;
    Ok(Action::requeue(outcome.requeue.unwrap_or(ctx.resync)))
}

/// Records an invalid spec as a `ValidationFailed` condition (and a Warning Event when new); the
/// object is not retried until it changes.
async fn invalid_spec<K: Kind>(
    obj: &K,
    ctx: &Context,
    invalid: &InvalidSpec,
    now: &Time,
) -> Result<Action, Error> {
    let mut status = obj.status().cloned().unwrap_or_default();
    let message = invalid.to_string();
    let generation = obj.meta().generation;
    let changed = condition::set(
        K::conditions(&mut status),
        types::VALIDATION_FAILED,
        true,
        "InvalidSpec",
        message.clone(),
        generation,
        now,
    );
    K::mark_invalid(&mut status, generation);
    let transition = changed.then(|| Transition::warning("ValidationFailed", message));
    record(obj, ctx, &status, transition.as_ref()).await?;
    Ok(Action::await_change())
}

/// Writes `status` if it differs from `obj`'s, publishes `transition`, and forgets `obj`'s
/// failures.
async fn record<K: Kind>(
    obj: &K,
    ctx: &Context,
    status: &K::Status,
    transition: Option<&Transition>,
) -> Result<(), Error> {
    if obj.status() != Some(status) {
        patch_status(ctx, obj, status).await?;
    }
    if let Some(t) = transition {
        publish(ctx, obj, t).await;
    }
    ctx.backoff.succeeded(&key(obj));
    Ok(())
}

/// `obj`'s key in the backoff: `{NAME}/{namespace}/{name}`.
fn key<K: Kind>(obj: &K) -> String {
    format!("{}/{}/{}", K::NAME, obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Retries a failed reconciliation after the object's backoff.
pub fn error_policy<K: Kind>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(K::NAME, error.reason());
    let delay = ctx.backoff.failed(&key(obj.as_ref()));
    tracing::warn!(controller = K::NAME, object = %obj.name_any(), error = %error, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Runs the controller of `K` over `scope` until `shutdown` completes: per watched namespace, the
/// controller and the kind's [`Kind::tasks`].
pub fn run<K: Kind>(
    ctx: Arc<Context>,
    scope: &Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Vec<BoxFuture<'static, ()>> {
    let mut tasks = Vec::new();
    for api in scope.apis::<K>(&ctx.client) {
        let namespace = api.namespace().map(str::to_string);
        let controller = Controller::new(api, watcher::Config::default())
            .with_config(controller::Config::default().concurrency(ctx.concurrency));
        let watches = K::watch(Watches { controller, client: ctx.client.clone(), namespace });
        let store = watches.store();
        tasks.push(
            watches
                .controller
                .graceful_shutdown_on(shutdown.clone())
                .run(reconcile::<K>, error_policy::<K>, ctx.clone())
                .for_each(|result| async move {
                    if let Err(e) = result {
                        tracing::debug!(controller = K::NAME, error = %e, "controller event");
                    }
                })
                .boxed(),
        );
        tasks.extend(K::tasks(store, &ctx, shutdown.clone()));
    }
    tasks
}
