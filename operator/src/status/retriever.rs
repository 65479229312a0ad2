//! A Retriever's status from its index-build Job and its Deployment.

use super::Transition;
use super::job::{JobOutcome, outcome};
use crate::build::retriever::{endpoint, needs_index};
use crate::crd::condition::{self, types};
use crate::crd::retriever::{Retriever, RetrieverPhase, RetrieverStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

/// Whether the serving Deployment may run: the index exists (or none is needed).
pub fn index_ready(ret: &Retriever) -> bool {
    !needs_index(ret) || ret.spec.index.prebuilt || ret.status.as_ref().is_some_and(|s| s.index_built)
}

/// The passage count in an index-build pod's termination message (`kart retriever index` writes
/// `{"documents": N, …}` to `KART_STATUS_FILE`).
pub fn documents_indexed(message: &str) -> Option<u64> {
    #[derive(Deserialize)]
    struct IndexReport {
        documents: u64,
    }
    serde_json::from_str::<IndexReport>(message).ok().map(|r| r.documents)
}

/// The new status given the index-build Job, the passage count it reported (if read) and the
/// Deployment as observed.
pub fn derive(
    ret: &Retriever,
    index_job: Option<&Job>,
    documents: Option<u64>,
    deployment: Option<&Deployment>,
    now: &Time,
) -> (RetrieverStatus, Option<Transition>) {
    let old = ret.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let generation = ret.metadata.generation;
    condition::clear(&mut status.conditions, types::VALIDATION_FAILED, "Valid", generation, now);
    status.observed_generation = generation;
    status.endpoint = Some(endpoint(ret));
    status.replicas = ret.spec.replicas;
    let job = index_job.map(outcome);
    status.index_built = index_ready(ret) || job == Some(JobOutcome::Succeeded);
    status.documents_indexed = documents.or(status.documents_indexed);
    let (phase, ready, reason, message) = if !status.index_built {
        status.ready_replicas = 0;
        if job == Some(JobOutcome::Failed) {
            (RetrieverPhase::Failed, false, "IndexFailed", "the index-build Job failed".to_string())
        } else {
            (RetrieverPhase::Indexing, false, "Indexing", "the index-build Job runs".to_string())
        }
    } else {
        let ready = deployment.and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas).unwrap_or(0);
        status.ready_replicas = ready;
        let message = format!("{ready}/{} replicas ready", ret.spec.replicas);
        if ready >= ret.spec.replicas && deployment.is_some() {
            (RetrieverPhase::Ready, true, "Available", message)
        } else {
            (RetrieverPhase::Progressing, false, "Progressing", message)
        }
    };
    status.phase = phase;
    condition::set(&mut status.conditions, types::READY, ready, reason, message.clone(), generation, now);
    let transition = (phase != old.phase).then(|| match phase {
        RetrieverPhase::Failed => Transition::warning(reason, message),
        _ => Transition::normal(reason, message),
    });
    (status, transition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    fn now() -> Time {
        Time(jiff::Timestamp::from_second(100).unwrap())
    }

    fn job(condition: Option<&str>) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: condition.map(|t| {
                    vec![JobCondition { type_: t.into(), status: "True".into(), ..JobCondition::default() }]
                }),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    fn deployment(ready: i32) -> Deployment {
        Deployment {
            status: Some(DeploymentStatus { ready_replicas: Some(ready), ..DeploymentStatus::default() }),
            ..Deployment::default()
        }
    }

    #[test]
    fn indexing_then_progressing_then_ready() {
        let mut ret = fixtures::retriever();
        let (s, t) = derive(&ret, Some(&job(None)), None, None, &now());
        assert_eq!((s.phase, s.index_built), (RetrieverPhase::Indexing, false));
        assert_eq!(t.unwrap().reason, "Indexing");
        ret.status = Some(s);
        let (s, t) = derive(&ret, Some(&job(Some("Complete"))), Some(1200), Some(&deployment(0)), &now());
        assert_eq!(
            (s.phase, s.index_built, s.documents_indexed),
            (RetrieverPhase::Progressing, true, Some(1200))
        );
        assert!(!condition::is_true(&s.conditions, types::READY));
        assert!(t.is_some());
        ret.status = Some(s);
        assert!(index_ready(&ret), "once built, the Job is not consulted again");
        let (s, t) = derive(&ret, None, None, Some(&deployment(1)), &now());
        assert_eq!((s.phase, s.ready_replicas), (RetrieverPhase::Ready, 1));
        assert_eq!(s.documents_indexed, Some(1200), "the count stays once the Job is gone");
        assert!(condition::is_true(&s.conditions, types::READY));
        assert_eq!(s.endpoint.as_deref(), Some("http://wiki-retriever.ml.svc:8000"));
        assert_eq!(t.unwrap().reason, "Available");
        ret.status = Some(s.clone());
        let (again, t) = derive(&ret, None, None, Some(&deployment(1)), &now());
        assert_eq!((again, t), (s, None), "a stable retriever derives the same status");
    }

    #[test]
    fn the_passage_count_comes_from_the_index_report() {
        assert_eq!(documents_indexed(r#"{"documents": 21015324, "method": "bm25"}"#), Some(21015324));
        for message in ["", "Error: corpus.jsonl: line 3: missing `contents`", r#"{"documents": -1}"#] {
            assert_eq!(documents_indexed(message), None, "{message}");
        }
    }

    #[test]
    fn failed_index_job_fails_the_retriever() {
        let ret = fixtures::retriever();
        let (s, t) = derive(&ret, Some(&job(Some("Failed"))), None, None, &now());
        assert_eq!(s.phase, RetrieverPhase::Failed);
        let t = t.unwrap();
        assert!(t.warning && t.reason == "IndexFailed");
    }
}
