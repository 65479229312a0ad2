//! What the controllers, the kubelet and the proxy share: the state of Pods, which object
//! controls another, status writes.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

/// The Pod's phase (`Pending` until the kubelet reports one).
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// Whether the Pod has not finished (`Succeeded` or `Failed`) and is not being deleted.
pub fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

/// Whether the Pod reports the Ready condition.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the object of `meta` is controlled by the object whose uid is `owner`.
pub fn controlled_by(meta: &ObjectMeta, owner: Option<&String>) -> bool {
    meta.owner_references.iter().flatten().any(|r| r.controller == Some(true) && Some(&r.uid) == owner)
}

/// Writes `status` as the status of `object`, unless `current` (its status now) already is it.
pub async fn write_status<K, S>(
    client: &kube::Client,
    object: &K,
    current: Option<&S>,
    status: S,
) -> kube::Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
    S: PartialEq + k8s_openapi::serde::Serialize,
{
    if current == Some(&status) {
        return Ok(());
    }
    let api = Api::<K>::namespaced(client.clone(), &object.namespace().unwrap_or_default());
    let patch = Patch::Merge(serde_json::json!({"status": status}));
    api.patch_status(&object.name_any(), &PatchParams::default(), &patch).await.map(drop)
}
