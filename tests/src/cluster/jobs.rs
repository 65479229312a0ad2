//! The Job controller, as far as kart's Jobs need it.
//!
//! Pods from the template carry the Job's labels (`batch.kubernetes.io/job-name`,
//! `batch.kubernetes.io/controller-uid`); in an `Indexed` Job each also carries its index as the
//! label and annotation `batch.kubernetes.io/job-completion-index` and the host name
//! `<job>-<index>`. The controller keeps one active Pod per index (`Indexed`) or up to
//! `parallelism` Pods (`NonIndexed`) until `completions` succeeded (condition `Complete`) or more
//! than `backoffLimit` failed (condition `Failed`, active Pods deleted). Not simulated: suspension,
//! pod failure policies, success policies, TTL after finishing.

use super::objects;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeSet;

/// Label and annotation of an indexed Job's Pods with their index.
const INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Reconciles every Job.
pub async fn sync(client: &kube::Client) -> anyhow::Result<()> {
    let pods = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await?.items;
    for job in Api::<Job>::all(client.clone()).list(&ListParams::default()).await?.items {
        sync_job(client, &job, &pods).await?;
    }
    Ok(())
}

fn index_of(pod: &Pod) -> Option<i32> {
    pod.annotations().get(INDEX)?.parse().ok()
}

fn finished(status: Option<&JobStatus>) -> Option<&str> {
    status?.conditions.iter().flatten().find(|c| c.status == "True").map(|c| c.type_.as_str())
}

async fn sync_job(client: &kube::Client, job: &Job, all: &[Pod]) -> anyhow::Result<()> {
    let namespace = job.namespace().unwrap_or_default();
    let api = Api::<Pod>::namespaced(client.clone(), &namespace);
    let spec = job.spec.clone().unwrap_or_default();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completions = spec.completions.unwrap_or(1);
    let owned: Vec<&Pod> =
        all.iter().filter(|p| objects::controlled_by(&p.metadata, job.uid().as_ref())).collect();
    let active: Vec<&Pod> = owned.iter().copied().filter(|p| objects::is_active(p)).collect();
    let succeeded: Vec<&Pod> = owned.iter().copied().filter(|p| objects::phase(p) == "Succeeded").collect();
    let failed = i32::try_from(owned.iter().filter(|p| objects::phase(p) == "Failed").count())?;
    let done: BTreeSet<i32> = match indexed {
        true => succeeded.iter().filter_map(|p| index_of(p)).collect(),
        false => (0..i32::try_from(succeeded.len())?).collect(),
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let condition = |kind: &str, reason: &str| JobCondition {
        type_: kind.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        last_transition_time: Some(now.clone()),
        ..JobCondition::default()
    };
    let mut status = job.status.clone().unwrap_or_default();
    if finished(Some(&status)).is_none() {
        if failed > spec.backoff_limit.unwrap_or(6) {
            status.conditions = Some(vec![condition("Failed", "BackoffLimitExceeded")]);
        } else if i32::try_from(done.len())? >= completions {
            status.conditions = Some(vec![condition("Complete", "Completed")]);
            status.completion_time = Some(now.clone());
        } else {
            let running: BTreeSet<i32> = active.iter().filter_map(|p| index_of(p)).collect();
            let missing: Vec<Option<i32>> = if indexed {
                (0..completions).filter(|i| !done.contains(i) && !running.contains(i)).map(Some).collect()
            } else {
                let room = spec.parallelism.unwrap_or(1).min(completions - i32::try_from(done.len())?);
                vec![None; usize::try_from(room - i32::try_from(active.len())?).unwrap_or(0)]
            };
            for index in missing {
                api.create(&PostParams::default(), &pod(job, index)).await?;
            }
        }
    }
    if finished(Some(&status)) == Some("Failed") {
        for pod in &active {
            api.delete(&pod.name_any(), &DeleteParams::default()).await?;
        }
    }
    status.start_time.get_or_insert(now);
    status.active = Some(i32::try_from(active.len())?);
    status.ready = Some(i32::try_from(active.iter().filter(|p| objects::is_ready(p)).count())?);
    status.succeeded = Some(i32::try_from(succeeded.len())?);
    status.failed = Some(failed);
    if indexed {
        status.completed_indexes = Some(done.iter().map(i32::to_string).collect::<Vec<_>>().join(","));
    }
    Ok(objects::write_status(client, job, job.status.as_ref(), status).await?)
}

/// A Pod of `job`, for completion index `index` in an indexed Job.
fn pod(job: &Job, index: Option<i32>) -> Pod {
    let name = job.name_any();
    let template = job.spec.clone().unwrap_or_default().template;
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    for (key, value) in [
        ("batch.kubernetes.io/job-name", &name),
        ("batch.kubernetes.io/controller-uid", &uid),
        ("job-name", &name),
        ("controller-uid", &uid),
    ] {
        labels.insert(key.into(), value.clone());
    }
    let mut spec = template.spec.unwrap_or_default();
    let prefix = match index {
        Some(i) => {
            labels.insert(INDEX.into(), i.to_string());
            annotations.insert(INDEX.into(), i.to_string());
            spec.hostname = Some(format!("{name}-{i}"));
            format!("{name}-{i}-")
        }
        None => format!("{name}-"),
    };
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(prefix),
            namespace: job.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: job.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}
