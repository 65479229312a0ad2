//! Server-side apply of children (field manager `kart-operator`), deletion, status patches and
//! Events.
//!
//! An applied child carries [`APPLIED_HASH`], the hash of what was applied; a child whose cached
//! copy carries the hash of what would be applied now, and whose `generation` nobody else moved
//! since this operator applied it, is not applied again: an unchanged cluster gets no writes.

use super::cache::Cached;
use super::{Context, Error};
use crate::build::meta::{FIELD_MANAGER, config_hash};
use crate::status::Transition;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

/// The annotation holding the hash of what the operator last applied to a child.
pub const APPLIED_HASH: &str = "kart.dev/applied-hash";

/// The `generation` of each child (by UID) as this operator's last apply left it: a child found
/// at another one was changed by someone else, and is applied again.
#[derive(Debug, Default)]
pub struct Applied(Mutex<HashMap<String, i64>>);

impl Applied {
    fn record<K: Resource>(&self, stored: &K) {
        if let (Some(uid), Some(generation)) = (&stored.meta().uid, stored.meta().generation) {
            self.0.lock().expect("never poisoned").insert(uid.clone(), generation);
        }
    }

    /// Whether `live`'s generation is another than this operator's last apply left.
    fn moved<K: Resource>(&self, live: &K) -> bool {
        let Some(uid) = &live.meta().uid else { return true };
        let applied = self.0.lock().expect("never poisoned").get(uid).copied();
        applied.is_some_and(|g| live.meta().generation != Some(g))
    }
}

/// Object `name` of `namespace` as the operator's cache last saw it.
pub fn cached<K: Cached>(ctx: &Context, namespace: &str, name: &str) -> Option<Arc<K>> {
    K::stores(&ctx.caches)?.get(namespace, name)
}

/// Applies `obj` (create or update) and returns the object as stored, unless the cached child
/// is as `obj` would make it (then that, and nothing is sent).
pub async fn apply<K: Cached + Serialize>(ctx: &Context, obj: &K) -> Result<K, Error> {
    let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    let hash = config_hash(&serde_json::to_string(obj).expect("Kubernetes objects serialise"));
    if let Some(live) = cached::<K>(ctx, &namespace, &name)
        && live.meta().deletion_timestamp.is_none()
        && live.annotations().get(APPLIED_HASH) == Some(&hash)
        && !ctx.applied.moved(live.as_ref())
    {
        return Ok(live.as_ref().clone());
    }
    let mut obj = obj.clone();
    obj.annotations_mut().insert(APPLIED_HASH.into(), hash);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let stored = api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&obj)).await?;
    ctx.applied.record(&stored);
    Ok(stored)
}

/// Creates `obj` unless it exists (for children whose spec is immutable once bound, like
/// PersistentVolumeClaims); returns the stored object.
pub async fn ensure<K: Cached + Serialize>(ctx: &Context, obj: &K) -> Result<K, Error> {
    let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    if let Some(live) = cached::<K>(ctx, &namespace, &name) {
        return Ok(live.as_ref().clone());
    }
    match get::<K>(ctx, &namespace, &name).await? {
        Some(existing) => Ok(existing),
        None => apply(ctx, obj).await,
    }
}

/// Reads object `name` in `namespace`, `None` when absent.
pub async fn get<K>(ctx: &Context, namespace: &str, name: &str) -> Result<Option<K>, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    Ok(Api::<K>::namespaced(ctx.client.clone(), namespace).get_opt(name).await?)
}

/// Deletes object `name` (its dependents in the background); absent is fine.
pub async fn delete<K>(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Applies `status` as the status of `obj` (a custom resource of kind `kind`).
pub async fn patch_status<K, S>(ctx: &Context, obj: &K, status: &S) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + DeserializeOwned + Clone + Debug,
    S: Serialize,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(&obj.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await?;
    Ok(())
}

/// Publishes `transition` as an Event on `obj`; a failure is logged, not returned (Events are
/// best effort).
pub async fn publish<K>(ctx: &Context, obj: &K, transition: &Transition)
where
    K: Resource<DynamicType = ()>,
{
    let event = Event {
        type_: if transition.warning { EventType::Warning } else { EventType::Normal },
        reason: transition.reason.clone(),
        note: Some(transition.note.clone()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(error = %e, reason = %transition.reason, "publishing an event failed");
    }
}
