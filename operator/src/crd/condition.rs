//! Status conditions (`type`, `status`, `reason`, `message`, `lastTransitionTime`,
//! `observedGeneration`), kept the way Kubernetes expects: a condition's transition time changes
//! only when its status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types the operator sets.
pub mod types {
    /// The workload serves (Retriever, RolloutPool).
    pub const READY: &str = "Ready";
    /// The spec cannot be turned into workloads; the message says which field and value.
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    /// A TrainingJob waits for its Retriever or RolloutPool.
    pub const WAITING_FOR_DEPENDENCIES: &str = "WaitingForDependencies";
    /// A TrainingJob's trainer waits in its Kueue queue.
    pub const QUEUED: &str = "Queued";
    /// The trainer runs.
    pub const RUNNING: &str = "Running";
    /// The trainer finished successfully.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The trainer failed more often than `backoffLimit` allows.
    pub const FAILED: &str = "Failed";
    /// The TrainingJob is suspended.
    pub const SUSPENDED: &str = "Suspended";
}

/// Sets condition `type_` in `conditions`; returns whether its status or reason changed (a
/// transition worth an Event).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = if status { "True" } else { "False" };
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let transitioned = c.status != status;
            let changed = transitioned || c.reason != reason;
            if transitioned {
                c.last_transition_time = now.clone();
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                last_transition_time: now.clone(),
                observed_generation: generation,
            });
            true
        }
    }
}

/// Sets condition `type_` to `False` if it is present (conditions a kind never reached stay absent).
pub fn clear(conditions: &mut [Condition], type_: &str, reason: &str, generation: Option<i64>, now: &Time) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != "False" {
            c.last_transition_time = now.clone();
        }
        c.status = "False".into();
        c.reason = reason.into();
        c.message = String::new();
        c.observed_generation = generation;
    }
}

/// Whether condition `type_` is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut cs = Vec::new();
        assert!(set(&mut cs, types::READY, false, "Progressing", "0/1", Some(1), &at(10)));
        assert!(!set(&mut cs, types::READY, false, "Progressing", "0/2", Some(2), &at(20)));
        assert_eq!(cs[0].last_transition_time, at(10));
        assert_eq!((cs[0].message.as_str(), cs[0].observed_generation), ("0/2", Some(2)));
        assert!(set(&mut cs, types::READY, true, "Available", "1/1", Some(2), &at(30)));
        assert_eq!(cs[0].last_transition_time, at(30));
        assert!(is_true(&cs, types::READY));
        clear(&mut cs, types::VALIDATION_FAILED, "Valid", Some(2), &at(40));
        assert_eq!(cs.len(), 1, "absent conditions stay absent");
    }
}
