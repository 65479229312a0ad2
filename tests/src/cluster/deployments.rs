//! The Deployment and ReplicaSet controllers, as far as kart's workloads need them.
//!
//! A Deployment owns one ReplicaSet per pod template, named by the template's hash (the
//! `pod-template-hash` label, added to its selector and its Pods); the newest gets
//! `spec.replicas`, older ones scale to zero once it is ready (a rolling update with full surge).
//! A ReplicaSet keeps `spec.replicas` active Pods. Both report replica counts in their status.

use super::objects;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentStatus, ReplicaSet, ReplicaSetSpec, ReplicaSetStatus,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

/// The label naming a ReplicaSet's pod template.
const TEMPLATE_HASH: &str = "pod-template-hash";

/// Reconciles every Deployment, then every ReplicaSet.
pub async fn sync(client: &kube::Client) -> anyhow::Result<()> {
    let sets = Api::<ReplicaSet>::all(client.clone()).list(&ListParams::default()).await?.items;
    for deployment in Api::<Deployment>::all(client.clone()).list(&ListParams::default()).await?.items {
        sync_deployment(client, &deployment, &sets).await?;
    }
    let pods = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await?.items;
    for set in Api::<ReplicaSet>::all(client.clone()).list(&ListParams::default()).await?.items {
        sync_replica_set(client, &set, &pods).await?;
    }
    Ok(())
}

/// A stable hash of a pod template (FNV-1a of its JSON), 10 hex digits.
fn template_hash(template: &PodTemplateSpec) -> String {
    let text = serde_json::to_string(template).expect("a template serialises");
    let hash = text
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")[..10].to_string()
}

async fn sync_deployment(client: &kube::Client, d: &Deployment, sets: &[ReplicaSet]) -> anyhow::Result<()> {
    let namespace = d.namespace().unwrap_or_default();
    let api = Api::<ReplicaSet>::namespaced(client.clone(), &namespace);
    let spec = d.spec.clone().unwrap_or_default();
    let desired = spec.replicas.unwrap_or(1);
    let hash = template_hash(&spec.template);
    let name = format!("{}-{hash}", d.name_any());
    let owned: Vec<&ReplicaSet> =
        sets.iter().filter(|s| objects::controlled_by(&s.metadata, d.uid().as_ref())).collect();
    let current = owned.iter().find(|s| s.name_any() == name);
    if current.is_none() {
        let mut template = spec.template.clone();
        let meta = template.metadata.get_or_insert_default();
        meta.labels.get_or_insert_default().insert(TEMPLATE_HASH.into(), hash.clone());
        let mut selector = spec.selector.clone();
        selector.match_labels.get_or_insert_default().insert(TEMPLATE_HASH.into(), hash.clone());
        let set = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                labels: meta.labels.clone(),
                owner_references: d.controller_owner_ref(&()).map(|r| vec![r]),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(desired),
                selector,
                template: Some(template),
                ..Default::default()
            }),
            status: None,
        };
        api.create(&PostParams::default(), &set).await?;
    }
    let ready = |s: &ReplicaSet| s.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    let new_ready = current.map_or(0, |s| ready(s));
    for set in &owned {
        let want = if set.name_any() == name {
            desired
        } else if new_ready >= desired {
            0
        } else {
            set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
        };
        if set.spec.as_ref().and_then(|s| s.replicas) != Some(want) {
            api.patch(
                &set.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": want}})),
            )
            .await?;
        }
    }
    let count = |f: fn(&ReplicaSetStatus) -> Option<i32>| -> i32 {
        owned.iter().filter_map(|s| s.status.as_ref().and_then(f)).sum()
    };
    let (replicas, ready_total) = (count(|s| Some(s.replicas)), count(|s| s.ready_replicas));
    let status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(replicas),
        updated_replicas: Some(current.and_then(|s| s.status.as_ref()).map_or(0, |s| s.replicas)),
        ready_replicas: Some(ready_total),
        available_replicas: Some(ready_total),
        unavailable_replicas: Some((desired - ready_total).max(0)),
        ..DeploymentStatus::default()
    };
    Ok(objects::write_status(client, d, d.status.as_ref(), status).await?)
}

async fn sync_replica_set(client: &kube::Client, set: &ReplicaSet, all: &[Pod]) -> anyhow::Result<()> {
    let namespace = set.namespace().unwrap_or_default();
    let api = Api::<Pod>::namespaced(client.clone(), &namespace);
    let spec = set.spec.clone().unwrap_or_default();
    let desired = spec.replicas.unwrap_or(1);
    let mut active: Vec<&Pod> = all
        .iter()
        .filter(|p| objects::controlled_by(&p.metadata, set.uid().as_ref()) && objects::is_active(p))
        .collect();
    let count = i32::try_from(active.len())?;
    if count < desired {
        let template = spec.template.clone().unwrap_or_default();
        let meta = template.metadata.unwrap_or_default();
        let pod = Pod {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", set.name_any())),
                namespace: Some(namespace.clone()),
                labels: meta.labels,
                annotations: meta.annotations,
                owner_references: set.controller_owner_ref(&()).map(|r| vec![r]),
                ..ObjectMeta::default()
            },
            spec: template.spec,
            status: None,
        };
        for _ in count..desired {
            api.create(&PostParams::default(), &pod).await?;
        }
    } else if count > desired {
        // Pods that are not ready go first, then the newest.
        active.sort_by_key(|p| {
            (objects::is_ready(p), std::cmp::Reverse(p.creation_timestamp().map(|Time(t)| t)))
        });
        for pod in &active[..(count - desired) as usize] {
            api.delete(&pod.name_any(), &DeleteParams::default()).await?;
        }
    }
    let ready = i32::try_from(active.iter().filter(|p| objects::is_ready(p)).count())?;
    let status = ReplicaSetStatus {
        observed_generation: set.metadata.generation,
        replicas: count,
        fully_labeled_replicas: Some(count),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        ..ReplicaSetStatus::default()
    };
    Ok(objects::write_status(client, set, set.status.as_ref(), status).await?)
}
