//! Where a queued trainer Job stands in Kueue, from its Workload's conditions: admitted, waiting
//! for quota (with Kueue's reason and message), or evicted (preempted by a job of higher
//! priority, deactivated, …).

use crate::crd::training_job::QueueStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Deserialize;

/// The parts of a Workload's status the operator reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub admission: Option<WorkloadAdmission>,
}

/// The ClusterQueue a Workload was admitted to.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadAdmission {
    #[serde(default)]
    pub cluster_queue: String,
}

/// What the operator could read of a trainer Job's Workload.
#[derive(Debug, Clone)]
pub enum Workload {
    /// The Workload `name`, with its status.
    Found { name: String, status: WorkloadStatus },
    /// Kueue has made none (yet: it does within moments when it manages the Job).
    Missing,
    /// The Workload could not be read: why (Kueue's API absent, the operator not allowed to).
    Unreadable(String),
}

/// The queue status of a Job in LocalQueue `queue` whose Workload is `workload`; `admitted`:
/// Kueue let the Job run (it is not suspended).
pub fn queue_status(queue: &str, workload: &Workload, admitted: bool) -> QueueStatus {
    let mut status = QueueStatus { local_queue: queue.to_string(), admitted, ..QueueStatus::default() };
    let (reason, message) = match workload {
        Workload::Missing if admitted => ("Admitted".to_string(), String::new()),
        Workload::Missing => (
            "NoWorkload".to_string(),
            format!(
                "Kueue has made no Workload for the trainer Job; is Kueue installed and managing \
                 batch/job, and does LocalQueue {queue} exist?"
            ),
        ),
        Workload::Unreadable(why) => ("WorkloadUnreadable".to_string(), why.clone()),
        Workload::Found { name, status: w } => {
            status.workload = Some(name.clone());
            status.cluster_queue =
                w.admission.as_ref().map(|a| a.cluster_queue.clone()).filter(|q| !q.is_empty());
            let find = |t: &str| w.conditions.iter().find(|c| c.type_ == t);
            let is_true = |t: &str| find(t).is_some_and(|c| c.status == "True");
            match (admitted, find("Evicted").filter(|_| is_true("Evicted")), find("QuotaReserved")) {
                // Admitted and running; an eviction (if any) is being carried out.
                (true, None, _) => ("Admitted".to_string(), String::new()),
                (_, Some(evicted), _) => (evicted.reason.clone(), evicted.message.clone()),
                (false, None, Some(quota)) if quota.status != "True" => {
                    (quota.reason.clone(), quota.message.clone())
                }
                (false, None, Some(_)) => {
                    ("QuotaReserved".to_string(), "waiting for admission checks".to_string())
                }
                (false, None, None) => ("Pending".to_string(), "not yet considered by Kueue".to_string()),
            }
        }
    };
    status.reason = reason;
    status.message = message;
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn found(conditions: Vec<Condition>, cluster_queue: Option<&str>) -> Workload {
        Workload::Found {
            name: "job-run-trainer-0-1a2b3".into(),
            status: WorkloadStatus {
                conditions,
                admission: cluster_queue.map(|q| WorkloadAdmission { cluster_queue: q.into() }),
            },
        }
    }

    #[test]
    fn waiting_admitted_and_evicted_read_from_the_workload() {
        let waiting = found(
            vec![condition(
                "QuotaReserved",
                false,
                "Pending",
                "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default, 2 more needed",
            )],
            None,
        );
        let s = queue_status("team", &waiting, false);
        assert_eq!((s.reason.as_str(), s.admitted), ("Pending", false));
        assert!(s.message.contains("insufficient unused quota"), "{s:?}");
        assert_eq!(s.workload.as_deref(), Some("job-run-trainer-0-1a2b3"));

        let admitted = found(
            vec![
                condition("QuotaReserved", true, "QuotaReserved", ""),
                condition("Admitted", true, "Admitted", ""),
            ],
            Some("gpus"),
        );
        let s = queue_status("team", &admitted, true);
        assert_eq!((s.reason.as_str(), s.cluster_queue.as_deref()), ("Admitted", Some("gpus")));

        let evicted = found(
            vec![
                condition("QuotaReserved", false, "Pending", "Preempted to accommodate a workload"),
                condition(
                    "Evicted",
                    true,
                    "Preempted",
                    "Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue",
                ),
            ],
            None,
        );
        for admitted in [true, false] {
            let s = queue_status("team", &evicted, admitted);
            assert_eq!(s.reason, "Preempted", "evicted, whether or not the Job is suspended yet");
        }
    }

    #[test]
    fn a_missing_or_unreadable_workload_says_why() {
        let s = queue_status("team", &Workload::Missing, false);
        assert_eq!(s.reason, "NoWorkload");
        assert!(s.message.contains("LocalQueue team"), "{s:?}");
        let s = queue_status("team", &Workload::Unreadable("403".into()), false);
        assert_eq!((s.reason.as_str(), s.message.as_str()), ("WorkloadUnreadable", "403"));
    }
}
