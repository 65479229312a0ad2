//! Status derivation: pure functions from a resource and the observed state of its children to
//! its new status, the transition worth an Event, and (for TrainingJobs) the next action.
//!
//! - [`job`]: a Job's outcome; [`trainer`]: the trainer's `/status` report; [`queue`]: a queued
//!   Job's place in Kueue;
//! - [`retriever`], [`rollout_pool`], [`training_job`]: each kind's status.

pub mod job;
pub mod queue;
pub mod retriever;
pub mod rollout_pool;
pub mod trainer;
pub mod training_job;

/// A transition worth an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// A Warning (not Normal) event.
    pub warning: bool,
    /// PascalCase reason (`Ready`, `IndexFailed`, `Restarting`, …).
    pub reason: String,
    /// What happened.
    pub note: String,
}

impl Transition {
    /// A Normal event.
    pub fn normal(reason: &str, note: impl Into<String>) -> Self {
        Transition { warning: false, reason: reason.into(), note: note.into() }
    }

    /// A Warning event.
    pub fn warning(reason: &str, note: impl Into<String>) -> Self {
        Transition { warning: true, reason: reason.into(), note: note.into() }
    }
}
