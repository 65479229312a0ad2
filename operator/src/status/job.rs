//! A Job's outcome, from its conditions or its pod counts.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

/// Where a Job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// Pods run or are about to.
    Active,
    /// Suspended (by Kueue, while the Job waits in its queue): no pods run.
    Suspended,
    /// All completions succeeded.
    Succeeded,
    /// The Job gave up.
    Failed,
}

/// The outcome of `job`: its `Complete`/`Failed` conditions, else its counts (`succeeded` reaching
/// `completions`, or `failed` beyond `backoffLimit`), else whether it is suspended.
pub fn outcome(job: &Job) -> JobOutcome {
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    let unfinished = if suspended { JobOutcome::Suspended } else { JobOutcome::Active };
    let Some(status) = &job.status else { return unfinished };
    let condition = |t: &str| status.conditions.iter().flatten().any(|c| c.type_ == t && c.status == "True");
    if condition("Complete") {
        return JobOutcome::Succeeded;
    }
    if condition("Failed") {
        return JobOutcome::Failed;
    }
    let spec = job.spec.as_ref();
    let completions = spec.and_then(|s| s.completions).unwrap_or(1);
    let backoff_limit = spec.and_then(|s| s.backoff_limit).unwrap_or(6);
    if status.succeeded.unwrap_or(0) >= completions {
        JobOutcome::Succeeded
    } else if status.failed.unwrap_or(0) > backoff_limit {
        JobOutcome::Failed
    } else {
        unfinished
    }
}

/// The termination message of `pod`'s first container, once it has ended: the report a kart
/// workload writes to `KART_STATUS_FILE`.
pub fn termination_message(pod: &Pod) -> Option<&str> {
    let container = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    container.state.as_ref()?.terminated.as_ref()?.message.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};

    fn job(completions: i32, succeeded: i32, failed: i32, condition: Option<&str>) -> Job {
        Job {
            spec: Some(JobSpec {
                completions: Some(completions),
                backoff_limit: Some(0),
                ..JobSpec::default()
            }),
            status: Some(JobStatus {
                succeeded: Some(succeeded),
                failed: Some(failed),
                conditions: condition.map(|t| {
                    vec![JobCondition { type_: t.into(), status: "True".into(), ..JobCondition::default() }]
                }),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    #[test]
    fn outcomes_from_conditions_and_counts() {
        assert_eq!(outcome(&Job::default()), JobOutcome::Active);
        assert_eq!(outcome(&job(2, 1, 0, None)), JobOutcome::Active);
        assert_eq!(outcome(&job(2, 2, 0, None)), JobOutcome::Succeeded);
        assert_eq!(outcome(&job(2, 0, 1, None)), JobOutcome::Failed);
        assert_eq!(outcome(&job(2, 0, 0, Some("Complete"))), JobOutcome::Succeeded);
        assert_eq!(outcome(&job(2, 0, 0, Some("Failed"))), JobOutcome::Failed);
        let mut queued = job(2, 0, 0, None);
        queued.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(outcome(&queued), JobOutcome::Suspended);
        queued.status = None;
        assert_eq!(outcome(&queued), JobOutcome::Suspended, "before the Job controller saw it");
        let mut done = job(2, 2, 0, None);
        done.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(outcome(&done), JobOutcome::Succeeded);
    }
}
