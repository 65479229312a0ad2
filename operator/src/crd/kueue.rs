//! Kueue's API as the operator uses it (`kueue.x-k8s.io/v1beta2`): the labels that put a Job
//! behind a LocalQueue and give it a priority, and the Workload Kueue keeps for each queued Job,
//! whose conditions say whether it is admitted, waiting, or was evicted.

use kube::core::{ApiResource, GroupVersionKind};

/// The label naming the LocalQueue a Job waits in (Kueue keeps the Job suspended until its
/// Workload is admitted).
pub const QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";

/// The label naming a Job's WorkloadPriorityClass (who preempts whom).
pub const PRIORITY_CLASS: &str = "kueue.x-k8s.io/priority-class";

/// The label Kueue puts on a Workload with the UID of the Job it stands for.
pub const JOB_UID: &str = "kueue.x-k8s.io/job-uid";

/// Kueue's Workload resource.
pub fn workload_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    )
}
