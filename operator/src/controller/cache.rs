//! The operator's caches of what it reads: the three kinds, and the children it made (watched by
//! their `app.kubernetes.io/managed-by` label, so no other ConfigMap of the cluster is held), one
//! reflector per kind and watched namespace, kept without `managedFields`. Secrets are not cached:
//! the operator never lists or watches them (its RBAC has only get, create and patch).
//!
//! The reconcilers read references and children here instead of from the API, and
//! [`super::apply::apply`] sends nothing for a child that is as it would make it: at steady state
//! and after a restart, a reconciliation writes nothing.

use super::Scope;
use crate::build::meta::FIELD_MANAGER;
use crate::crd::{Retriever, RolloutPool, TrainingJob};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// A kind the operator caches.
pub trait Cached:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Debug
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Whether it is a child kind (only the operator's own objects are watched).
    const CHILD: bool;

    /// Its caches in `caches` (none for a kind never watched).
    fn stores(caches: &Caches) -> Option<&Stores<Self>>;
}

/// One kind's caches: a store per watched namespace (one for all when the scope is all), with
/// the writers the reflectors take when they start.
pub struct Stores<K: Cached> {
    stores: Vec<(Option<String>, Store<K>)>,
    writers: Mutex<Vec<(Api<K>, Writer<K>)>>,
}

impl<K: Cached> Stores<K> {
    fn new(client: &Client, scope: &Scope) -> Self {
        let namespaces: Vec<Option<String>> = match scope.namespaces.is_empty() {
            true => vec![None],
            false => scope.namespaces.iter().cloned().map(Some).collect(),
        };
        let (mut stores, mut writers) = (Vec::new(), Vec::new());
        for namespace in namespaces {
            let (store, writer) = reflector::store();
            writers.push((super::child_api::<K>(client, namespace.as_deref()), writer));
            stores.push((namespace, store));
        }
        Stores { stores, writers: Mutex::new(writers) }
    }

    /// Object `name` of `namespace` as last seen, if it is cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let store = self.store(namespace)?;
        store.get(&ObjectRef::new(name).within(namespace))
    }

    /// The cached objects of `namespace`.
    pub fn list(&self, namespace: &str) -> Vec<Arc<K>> {
        let Some(store) = self.store(namespace) else { return Vec::new() };
        store.state().into_iter().filter(|o| o.namespace().as_deref() == Some(namespace)).collect()
    }

    fn store(&self, namespace: &str) -> Option<&Store<K>> {
        let watched = |ns: &Option<String>| ns.as_deref().is_none_or(|ns| ns == namespace);
        self.stores.iter().find(|(ns, _)| watched(ns)).map(|(_, store)| store)
    }

    /// Fills the stores with `objects` as a first list would, instead of their reflectors (a
    /// reconciliation tested without a cluster).
    pub fn fill(&self, objects: Vec<K>) {
        let writers = std::mem::take(&mut *self.writers.lock().expect("the writers' lock is never poisoned"));
        for (_, mut writer) in writers {
            writer.apply_watcher_event(&watcher::Event::Init);
            for object in &objects {
                writer.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
        }
    }

    /// The reflectors filling the stores, until `shutdown` (none once taken).
    fn reflectors(
        &self,
        shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
    ) -> Vec<BoxFuture<'static, ()>> {
        let writers = std::mem::take(&mut *self.writers.lock().expect("the writers' lock is never poisoned"));
        let config = match K::CHILD {
            true => {
                watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={FIELD_MANAGER}"))
            }
            false => watcher::Config::default(),
        };
        writers
            .into_iter()
            .map(|(api, writer)| {
                let stream = watcher(api, config.clone())
                    .default_backoff()
                    .modify(|o| o.managed_fields_mut().clear())
                    .reflect(writer)
                    .for_each(|event| async move {
                        if let Err(e) = event {
                            tracing::debug!(kind = %K::kind(&()), error = %e, "cache watch");
                        }
                    });
                let shutdown = shutdown.clone();
                async move {
                    tokio::select! {
                        () = stream => {}
                        () = shutdown => {}
                    }
                }
                .boxed()
            })
            .collect()
    }
}

/// Every cache of the operator.
pub struct Caches {
    pub training_jobs: Stores<TrainingJob>,
    pub rollout_pools: Stores<RolloutPool>,
    pub retrievers: Stores<Retriever>,
    pub jobs: Stores<Job>,
    pub deployments: Stores<Deployment>,
    pub services: Stores<Service>,
    pub config_maps: Stores<ConfigMap>,
    pub claims: Stores<PersistentVolumeClaim>,
}

impl Caches {
    /// Empty caches over `scope`, filled once [`Caches::reflectors`] run.
    pub fn new(client: &Client, scope: &Scope) -> Self {
        Caches {
            training_jobs: Stores::new(client, scope),
            rollout_pools: Stores::new(client, scope),
            retrievers: Stores::new(client, scope),
            jobs: Stores::new(client, scope),
            deployments: Stores::new(client, scope),
            services: Stores::new(client, scope),
            config_maps: Stores::new(client, scope),
            claims: Stores::new(client, scope),
        }
    }

    /// The reflectors of every cache, until `shutdown` (none the second time).
    pub fn reflectors(
        &self,
        shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
    ) -> Vec<BoxFuture<'static, ()>> {
        let mut tasks = self.training_jobs.reflectors(shutdown.clone());
        tasks.extend(self.rollout_pools.reflectors(shutdown.clone()));
        tasks.extend(self.retrievers.reflectors(shutdown.clone()));
        tasks.extend(self.jobs.reflectors(shutdown.clone()));
        tasks.extend(self.deployments.reflectors(shutdown.clone()));
        tasks.extend(self.services.reflectors(shutdown.clone()));
        tasks.extend(self.config_maps.reflectors(shutdown.clone()));
        tasks.extend(self.claims.reflectors(shutdown));
        tasks
    }

    /// Until every cache has listed its objects once.
    pub async fn ready(&self) {
        async fn all<K: Cached>(stores: &Stores<K>) {
            for (_, store) in &stores.stores {
                let _ = store.wait_until_ready().await;
            }
        }
        all(&self.training_jobs).await;
        all(&self.rollout_pools).await;
        all(&self.retrievers).await;
        all(&self.jobs).await;
        all(&self.deployments).await;
        all(&self.services).await;
        all(&self.config_maps).await;
        all(&self.claims).await;
    }
}

macro_rules! cached {
    ($kind:ty, $field:ident, $child:expr) => {
        impl Cached for $kind {
            const CHILD: bool = $child;
            fn stores(caches: &Caches) -> Option<&Stores<Self>> {
                Some(&caches.$field)
            }
        }
    };
}

cached!(TrainingJob, training_jobs, false);
cached!(RolloutPool, rollout_pools, false);
cached!(Retriever, retrievers, false);
cached!(Job, jobs, true);
cached!(Deployment, deployments, true);
cached!(Service, services, true);
cached!(ConfigMap, config_maps, true);
cached!(PersistentVolumeClaim, claims, true);

impl Cached for Secret {
    const CHILD: bool = true;
    fn stores(_: &Caches) -> Option<&Stores<Self>> {
        None
    }
}
