//! A TrainingJob's lifecycle: from its status, its dependencies, its current Job and the
//! trainer's report to its next status and the one action that gets it there.
//!
//! Pending or WaitingForDependencies -> (Retriever and RolloutPool Ready) -> Running -> Succeeded,
//! or, after a failed attempt, Running again from the last checkpoint until more than
//! `backoffLimit` attempts failed -> Failed. `suspend` stops the Job (Suspended); unsuspending
//! starts a new attempt that resumes. A finished run's children are never recreated; after
//! `ttlSecondsAfterFinished` its workloads are deleted once.
//!
//! With a Kueue queue the new attempt's Job waits suspended: Queued (with Kueue's reason) ->
//! (admitted) -> Running; Kueue evicting the running trainer (suspending its Job) makes it
//! Queued again, counted as a preemption, not a failure; readmitted, the same Job's pods resume
//! from the checkpoint the trainer wrote on SIGTERM.

use super::Transition;
use super::job::{JobOutcome, outcome};
use super::trainer::TrainerReport;
use crate::build::training_job::{job_name, world_size};
use crate::crd::condition::{self, types};
use crate::crd::training_job::{QueueStatus, TrainingJob, TrainingJobPhase, TrainingJobStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// How a referenced resource stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    Missing,
    NotReady,
    /// A RolloutPool with `holdUntilAdmitted` that runs no pods until a queued TrainingJob of it
    /// is admitted: met for a queued TrainingJob.
    Held,
    Ready,
}

/// What the reconciler observed.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The Retriever of `retrieverRef` (`None` without one).
    pub retriever: Option<Dependency>,
    /// The RolloutPool of `rolloutPoolRef` (`None` without one).
    pub rollout_pool: Option<Dependency>,
    /// The current attempt's Job, unless absent or being deleted.
    pub job: Option<&'a Job>,
    /// The trainer's latest report.
    pub report: Option<TrainerReport>,
    /// Where the current Job stands in its Kueue queue (with a queue and a Job).
    pub queue: Option<QueueStatus>,
    pub now: Time,
}

/// What to change in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Apply the children (config, claim, Services); the Job stays.
    Apply,
    /// Apply the children and create the Job of `attempt`.
    Start { attempt: i32 },
    /// Delete Job `name` (suspend).
    StopJob { name: String },
    /// Delete the finished run's workloads.
    CleanUp,
}

/// The next status, the action, the Event and when to look again.
#[derive(Debug, Clone)]
pub struct Plan {
    pub status: TrainingJobStatus,
    pub action: Action,
    pub transition: Option<Transition>,
    /// Look again after this long even without a change (polling, TTL).
    pub requeue: Option<Duration>,
}

/// How long a waiting job waits before it looks at its dependencies again without an event.
const DEPENDENCY_RECHECK: Duration = Duration::from_secs(30);

/// How often a queued job reads its Workload again (Kueue's message changes without the Job).
const QUEUE_RECHECK: Duration = Duration::from_secs(15);

/// The plan for `tj`; `poll` is how often a running trainer's `/status` is read.
pub fn plan(tj: &TrainingJob, observed: Observed<'_>, poll: Duration) -> Plan {
    let old = tj.status.clone().unwrap_or_default();
    let status = observe(tj, &old, &observed);
    let mut plan = Plan { status, action: Action::None, transition: None, requeue: None };
    if old.phase.is_finished() {
        finished(tj, &mut plan, &observed.now);
    } else if tj.spec.suspend {
        suspend(tj, &mut plan, old.phase, observed.job, &observed.now);
    } else {
        proceed(tj, &mut plan, &old, &observed, poll);
    }
    plan
}

/// The `old` status with `tj`'s generation observed, its spec valid and the trainer's report
/// folded in.
fn observe(tj: &TrainingJob, old: &TrainingJobStatus, observed: &Observed<'_>) -> TrainingJobStatus {
    let mut s = old.clone();
    let generation = tj.metadata.generation;
    s.observed_generation = generation;
    condition::clear(&mut s.conditions, types::VALIDATION_FAILED, "Valid", generation, &observed.now);
    if let Some(r) = &observed.report {
        s.step = r.step.unwrap_or(s.step);
        s.policy_version = r.policy_version.or(s.policy_version);
        s.reward = r.reward.or(s.reward);
        s.eval_em = r.eval_em.or(s.eval_em);
        s.checkpoint = r.checkpoint.clone().or(s.checkpoint);
        s.world_size = r.world_size.filter(|&w| w > 0).or(s.world_size);
    }
    if let Some(queue) = &observed.queue {
        s.queue = Some(queue.clone());
    }
    s
}

/// A suspended run (phase `old` before): stops the active Job.
fn suspend(tj: &TrainingJob, plan: &mut Plan, old: TrainingJobPhase, job: Option<&Job>, now: &Time) {
    let generation = tj.metadata.generation;
    let s = &mut plan.status;
    s.phase = TrainingJobPhase::Suspended;
    condition::set(
        &mut s.conditions,
        types::SUSPENDED,
        true,
        "Suspended",
        "spec.suspend is set",
        generation,
        now,
    );
    condition::clear(&mut s.conditions, types::RUNNING, "Suspended", generation, now);
    if let Some(job) = job.filter(|j| matches!(outcome(j), JobOutcome::Active | JobOutcome::Suspended)) {
        plan.action = Action::StopJob { name: job.metadata.name.clone().unwrap_or_default() };
    }
    if old != TrainingJobPhase::Suspended {
        plan.transition = Some(Transition::normal("Suspended", "the trainer is stopped"));
    }
}

/// A run neither finished nor suspended: follows the current Job's outcome, or, without a Job,
/// counts a deleted one as failed or waits for the dependencies and starts.
fn proceed(
    tj: &TrainingJob,
    plan: &mut Plan,
    old: &TrainingJobStatus,
    observed: &Observed<'_>,
    poll: Duration,
) {
    let now = &observed.now;
    condition::clear(&mut plan.status.conditions, types::SUSPENDED, "Resumed", tj.metadata.generation, now);
    match observed.job.map(outcome) {
        Some(JobOutcome::Active) => running(tj, plan, old, poll, now),
        Some(JobOutcome::Suspended) => queued(tj, plan, old, now),
        Some(JobOutcome::Succeeded) => succeeded(tj, plan, now),
        Some(JobOutcome::Failed) => fail_or_restart(tj, plan, "JobFailed", now),
        None if old.phase == TrainingJobPhase::Running && old.job_name.is_some() => {
            fail_or_restart(tj, plan, "JobDeleted", now)
        }
        None => wait_or_start(tj, plan, observed, poll),
    }
}

/// The trainer runs: keep the children applied and read its status every `poll`. Coming out of
/// a queue, it was admitted.
fn running(tj: &TrainingJob, plan: &mut Plan, old: &TrainingJobStatus, poll: Duration, now: &Time) {
    let s = &mut plan.status;
    s.phase = TrainingJobPhase::Running;
    if old.phase == TrainingJobPhase::Queued {
        let cluster_queue = s.queue.as_ref().and_then(|q| q.cluster_queue.clone());
        let to = cluster_queue.map_or_else(String::new, |q| format!(" to ClusterQueue {q}"));
        let from = match &s.checkpoint {
            Some(c) if s.preemptions > 0 => format!("; it resumes from {c}"),
            _ => String::new(),
        };
        plan.transition =
            Some(Transition::normal("Admitted", format!("Kueue admitted the trainer{to}{from}")));
    }
    condition::clear(&mut s.conditions, types::QUEUED, "Admitted", tj.metadata.generation, now);
    let message = format!("step {}", s.step);
    condition::set(
        &mut s.conditions,
        types::RUNNING,
        true,
        "TrainerRunning",
        message,
        tj.metadata.generation,
        now,
    );
    plan.action = Action::Apply;
    plan.requeue = Some(poll);
}

/// The trainer Job waits suspended in its Kueue queue: not yet admitted, or (when it ran before)
/// evicted, which counts as a preemption and not as a failure.
fn queued(tj: &TrainingJob, plan: &mut Plan, old: &TrainingJobStatus, now: &Time) {
    let generation = tj.metadata.generation;
    let s = &mut plan.status;
    let queue = s.queue.clone().unwrap_or_default();
    s.phase = TrainingJobPhase::Queued;
    let changed = condition::set(
        &mut s.conditions,
        types::QUEUED,
        true,
        &queue.reason,
        &queue.message,
        generation,
        now,
    );
    condition::clear(&mut s.conditions, types::RUNNING, "Queued", generation, now);
    if old.phase == TrainingJobPhase::Running {
        s.preemptions += 1;
        let resumes = s.checkpoint.as_ref().map_or_else(|| "the start".to_string(), Clone::clone);
        let reason = if queue.reason == "Preempted" { "Preempted" } else { "Evicted" };
        let note = format!(
            "Kueue evicted the trainer at step {} ({}: {}); it resumes from {resumes} when readmitted",
            s.step, queue.reason, queue.message
        );
        plan.transition = Some(Transition::warning(reason, note));
    } else if changed {
        let note = format!("LocalQueue {}: {} {}", queue.local_queue, queue.reason, queue.message);
        plan.transition = Some(Transition::normal("Queued", note.trim_end()));
    }
    plan.requeue = Some(QUEUE_RECHECK);
}

/// The Job completed: the run succeeded.
fn succeeded(tj: &TrainingJob, plan: &mut Plan, now: &Time) {
    let generation = tj.metadata.generation;
    let s = &mut plan.status;
    s.phase = TrainingJobPhase::Succeeded;
    s.completion_time = Some(now.clone());
    let message = format!("finished at step {}", s.step);
    condition::set(&mut s.conditions, types::SUCCEEDED, true, "Completed", message.clone(), generation, now);
    condition::clear(&mut s.conditions, types::RUNNING, "Completed", generation, now);
    plan.transition = Some(Transition::normal("Succeeded", message));
    finished(tj, plan, now);
}

/// No Job: waits for the first unmet dependency (looking again after [`DEPENDENCY_RECHECK`]), or
/// starts the next attempt once all are met.
fn wait_or_start(tj: &TrainingJob, plan: &mut Plan, observed: &Observed<'_>, poll: Duration) {
    let (generation, now) = (tj.metadata.generation, &observed.now);
    let s = &mut plan.status;
    match unmet(observed, tj.queue().is_some()) {
        Some((reason, message)) => {
            s.phase = TrainingJobPhase::WaitingForDependencies;
            let changed = condition::set(
                &mut s.conditions,
                types::WAITING_FOR_DEPENDENCIES,
                true,
                reason,
                message,
                generation,
                now,
            );
            if changed {
                plan.transition = Some(Transition::normal(reason, message));
            }
            plan.requeue = Some(DEPENDENCY_RECHECK);
        }
        None => {
            condition::clear(
                &mut s.conditions,
                types::WAITING_FOR_DEPENDENCIES,
                "DependenciesReady",
                generation,
                now,
            );
            start(tj, plan, "Started", now);
            plan.requeue = Some(poll);
        }
    }
}

/// The first unmet dependency: the condition's reason and message (`queued`: the run has a
/// Kueue queue).
fn unmet(observed: &Observed<'_>, queued: bool) -> Option<(&'static str, &'static str)> {
    match (observed.retriever, observed.rollout_pool) {
        (Some(Dependency::Missing), _) => {
            Some(("RetrieverNotFound", "the Retriever of spec.retrieverRef does not exist"))
        }
        (Some(Dependency::NotReady), _) => {
            Some(("RetrieverNotReady", "the Retriever of spec.retrieverRef is not Ready"))
        }
        (_, Some(Dependency::Missing)) => {
            Some(("RolloutPoolNotFound", "the RolloutPool of spec.rolloutPoolRef does not exist"))
        }
        (_, Some(Dependency::NotReady)) => {
            Some(("RolloutPoolNotReady", "the RolloutPool of spec.rolloutPoolRef is not Ready"))
        }
        (_, Some(Dependency::Held)) if !queued => Some((
            "RolloutPoolHeld",
            "the RolloutPool of spec.rolloutPoolRef holds its pods until a queued TrainingJob is admitted; this one has no spec.queueName",
        )),
        _ => None,
    }
}

/// Starts the next attempt.
fn start(tj: &TrainingJob, plan: &mut Plan, reason: &str, now: &Time) {
    let s = &mut plan.status;
    let attempt = s.attempts;
    s.attempts += 1;
    s.job_name = Some(job_name(&tj.metadata.name.clone().unwrap_or_default(), attempt));
    s.start_time.get_or_insert_with(|| now.clone());
    s.world_size = world_size(tj).ok();
    let message = if attempt == 0 {
        "the trainer starts".to_string()
    } else {
        format!("attempt {attempt} resumes from the last checkpoint")
    };
    let generation = tj.metadata.generation;
    match tj.queue() {
        // The Job waits suspended until Kueue admits it.
        Some(queue) => {
            s.phase = TrainingJobPhase::Queued;
            s.queue = Some(QueueStatus {
                local_queue: queue.to_string(),
                reason: "Submitted".into(),
                ..QueueStatus::default()
            });
            let waits = format!("the trainer Job waits in LocalQueue {queue}");
            condition::set(&mut s.conditions, types::QUEUED, true, "Submitted", waits, generation, now);
        }
        None => {
            s.phase = TrainingJobPhase::Running;
            condition::set(&mut s.conditions, types::RUNNING, true, reason, message.clone(), generation, now);
        }
    }
    plan.action = Action::Start { attempt };
    plan.transition.get_or_insert_with(|| Transition::normal(reason, message));
}

/// Counts a failed attempt: restarts, or fails the run past `backoffLimit`.
fn fail_or_restart(tj: &TrainingJob, plan: &mut Plan, reason: &str, now: &Time) {
    let generation = tj.metadata.generation;
    let s = &mut plan.status;
    s.failures += 1;
    if s.failures > tj.spec.backoff_limit {
        s.phase = TrainingJobPhase::Failed;
        s.completion_time = Some(now.clone());
        let message = format!("{} attempts failed (backoffLimit {})", s.failures, tj.spec.backoff_limit);
        condition::set(
            &mut s.conditions,
            types::FAILED,
            true,
            "BackoffLimitExceeded",
            message.clone(),
            generation,
            now,
        );
        condition::clear(&mut s.conditions, types::RUNNING, reason, generation, now);
        plan.transition = Some(Transition::warning("BackoffLimitExceeded", message));
        finished(tj, plan, now);
    } else {
        let message = format!("attempt {} failed ({reason}); restarting", s.attempts - 1);
        plan.transition = Some(Transition::warning("Restarting", message));
        start(tj, plan, "Restarting", now);
    }
}

/// A finished run: clean up once its TTL passed.
fn finished(tj: &TrainingJob, plan: &mut Plan, now: &Time) {
    let s = &mut plan.status;
    let (Some(ttl), Some(done)) = (tj.spec.ttl_seconds_after_finished, s.completion_time.clone()) else {
        return;
    };
    if s.cleaned_up {
        return;
    }
    let deadline = done.0 + jiff::SignedDuration::from_secs(i64::from(ttl.max(0)));
    if now.0 >= deadline {
        s.cleaned_up = true;
        plan.action = Action::CleanUp;
        plan.transition
            .get_or_insert_with(|| Transition::normal("CleanedUp", "ttlSecondsAfterFinished passed"));
    } else {
        let left = deadline.duration_since(now.0).as_secs_f64().max(0.0);
        plan.requeue = Some(Duration::from_secs_f64(left));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const POLL: Duration = Duration::from_secs(10);

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    fn observed(job: Option<&Job>, now: i64) -> Observed<'_> {
        Observed {
            retriever: Some(Dependency::Ready),
            rollout_pool: Some(Dependency::Ready),
            job,
            report: None,
            queue: None,
            now: at(now),
        }
    }

    fn job(name: &str, condition: Option<&str>) -> Job {
        Job {
            metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
            status: Some(JobStatus {
                conditions: condition.map(|t| {
                    vec![JobCondition { type_: t.into(), status: "True".into(), ..JobCondition::default() }]
                }),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    /// Applies `plan`'s status to `tj`, as the API server would.
    fn step(tj: &mut TrainingJob, o: Observed<'_>) -> Plan {
        let p = plan(tj, o, POLL);
        tj.status = Some(p.status.clone());
        p
    }

    #[test]
    fn waits_for_dependencies_in_order_then_starts() {
        let mut tj = fixtures::training_job(1);
        let mut o = observed(None, 0);
        o.retriever = Some(Dependency::NotReady);
        o.rollout_pool = Some(Dependency::Missing);
        let p = step(&mut tj, o);
        assert_eq!(p.status.phase, TrainingJobPhase::WaitingForDependencies);
        assert_eq!(p.action, Action::None);
        let c = p.status.conditions.iter().find(|c| c.type_ == types::WAITING_FOR_DEPENDENCIES).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "RetrieverNotReady"));
        assert_eq!(p.transition.unwrap().reason, "RetrieverNotReady");

        let mut o = observed(None, 1);
        o.rollout_pool = Some(Dependency::Missing);
        let p = step(&mut tj, o);
        assert_eq!(
            p.status.conditions.iter().find(|c| c.type_ == types::WAITING_FOR_DEPENDENCIES).unwrap().reason,
            "RolloutPoolNotFound"
        );

        let p = step(&mut tj, observed(None, 2));
        assert_eq!(p.action, Action::Start { attempt: 0 });
        assert_eq!(p.status.phase, TrainingJobPhase::Running);
        assert_eq!(p.status.job_name.as_deref(), Some("run-trainer-0"));
        assert_eq!((p.status.attempts, p.status.start_time.clone()), (1, Some(at(2))));
        let waiting =
            p.status.conditions.iter().find(|c| c.type_ == types::WAITING_FOR_DEPENDENCIES).unwrap();
        assert_eq!(waiting.status, "False");
        assert_eq!(p.requeue, Some(POLL));
    }

    #[test]
    fn running_job_takes_the_trainer_report() {
        let mut tj = fixtures::training_job(1);
        step(&mut tj, observed(None, 0));
        let j = job("run-trainer-0", None);
        let mut o = observed(Some(&j), 5);
        o.report = Some(TrainerReport {
            step: Some(3),
            reward: Some(0.5),
            eval_em: Some(0.25),
            ..TrainerReport::default()
        });
        let p = step(&mut tj, o);
        assert_eq!(p.action, Action::Apply);
        assert_eq!((p.status.step, p.status.reward, p.status.eval_em), (3, Some(0.5), Some(0.25)));
        assert!(p.transition.is_none(), "no transition while running");
        let p = step(&mut tj, observed(Some(&j), 6));
        assert_eq!(p.status.step, 3, "a missing report keeps the last values");
    }

    #[test]
    fn failures_restart_with_resume_until_the_backoff_limit() {
        let mut tj = fixtures::training_job(1);
        tj.spec.backoff_limit = 1;
        step(&mut tj, observed(None, 0));
        let failed = job("run-trainer-0", Some("Failed"));
        let p = step(&mut tj, observed(Some(&failed), 10));
        assert_eq!(p.action, Action::Start { attempt: 1 });
        assert_eq!((p.status.failures, p.status.attempts, p.status.phase), (1, 2, TrainingJobPhase::Running));
        let t = p.transition.unwrap();
        assert!(t.warning && t.reason == "Restarting", "{t:?}");
        let failed = job("run-trainer-1", Some("Failed"));
        let p = step(&mut tj, observed(Some(&failed), 20));
        assert_eq!(p.action, Action::None);
        assert_eq!((p.status.failures, p.status.phase), (2, TrainingJobPhase::Failed));
        assert_eq!(p.status.completion_time, Some(at(20)));
        assert_eq!(p.transition.unwrap().reason, "BackoffLimitExceeded");
        let p = step(&mut tj, observed(None, 30));
        assert_eq!(p.action, Action::None, "a failed run is never restarted");
    }

    #[test]
    fn a_deleted_job_counts_as_a_failed_attempt() {
        let mut tj = fixtures::training_job(1);
        step(&mut tj, observed(None, 0));
        let p = step(&mut tj, observed(None, 5));
        assert_eq!(p.action, Action::Start { attempt: 1 });
        assert_eq!(p.status.failures, 1);
    }

    #[test]
    fn success_then_ttl_cleans_up_once_and_never_recreates() {
        let mut tj = fixtures::training_job(1);
        tj.spec.ttl_seconds_after_finished = Some(60);
        step(&mut tj, observed(None, 0));
        let done = job("run-trainer-0", Some("Complete"));
        let p = step(&mut tj, observed(Some(&done), 100));
        assert_eq!(p.status.phase, TrainingJobPhase::Succeeded);
        assert_eq!(p.action, Action::None);
        assert_eq!(p.requeue, Some(Duration::from_secs(60)));
        let p = step(&mut tj, observed(None, 130));
        assert_eq!((p.action.clone(), p.requeue), (Action::None, Some(Duration::from_secs(30))));
        let p = step(&mut tj, observed(None, 161));
        assert_eq!(p.action, Action::CleanUp);
        assert!(p.status.cleaned_up);
        let p = step(&mut tj, observed(None, 200));
        assert_eq!((p.action, p.status.phase), (Action::None, TrainingJobPhase::Succeeded));
    }

    fn in_queue<'a>(job: &'a Job, reason: &str, admitted: bool) -> Observed<'a> {
        let mut o = observed(Some(job), 0);
        o.queue = Some(QueueStatus {
            local_queue: "team".into(),
            cluster_queue: admitted.then(|| "gpus".into()),
            admitted,
            reason: reason.into(),
            message: format!("{reason} message"),
            ..QueueStatus::default()
        });
        o
    }

    fn suspended(name: &str) -> Job {
        let mut j = job(name, None);
        j.spec = Some(k8s_openapi::api::batch::v1::JobSpec { suspend: Some(true), ..Default::default() });
        j
    }

    #[test]
    fn a_queued_run_waits_is_admitted_and_an_eviction_is_a_preemption_not_a_failure() {
        let mut tj = fixtures::training_job(1);
        tj.spec.queue_name = Some("team".into());
        let p = step(&mut tj, observed(None, 0));
        assert_eq!(p.action, Action::Start { attempt: 0 });
        assert_eq!(p.status.phase, TrainingJobPhase::Queued, "created suspended: it waits for Kueue");
        assert!(!condition::is_true(&p.status.conditions, types::RUNNING));

        let waiting = suspended("run-trainer-0");
        let p = step(&mut tj, in_queue(&waiting, "Pending", false));
        assert_eq!(p.status.phase, TrainingJobPhase::Queued);
        let queued = p.status.conditions.iter().find(|c| c.type_ == types::QUEUED).unwrap();
        assert_eq!((queued.status.as_str(), queued.reason.as_str()), ("True", "Pending"));
        assert_eq!(p.status.queue.as_ref().unwrap().message, "Pending message");
        assert_eq!((p.action.clone(), p.requeue), (Action::None, Some(QUEUE_RECHECK)));

        let admitted = job("run-trainer-0", None);
        let p = step(&mut tj, in_queue(&admitted, "Admitted", true));
        assert_eq!(p.status.phase, TrainingJobPhase::Running);
        let t = p.transition.unwrap();
        assert_eq!(
            (t.reason.as_str(), t.note.as_str()),
            ("Admitted", "Kueue admitted the trainer to ClusterQueue gpus")
        );
        assert!(!condition::is_true(&p.status.conditions, types::QUEUED));

        tj.status.as_mut().unwrap().checkpoint = Some("/ckpt/step-00000003".into());
        tj.status.as_mut().unwrap().step = 3;
        let evicted = suspended("run-trainer-0");
        let p = step(&mut tj, in_queue(&evicted, "Preempted", false));
        assert_eq!(p.status.phase, TrainingJobPhase::Queued);
        assert_eq!((p.status.preemptions, p.status.failures, p.status.attempts), (1, 0, 1));
        assert_eq!(p.action, Action::None, "the same Job waits to be readmitted");
        let t = p.transition.unwrap();
        assert!(t.warning && t.reason == "Preempted", "{t:?}");
        assert!(t.note.contains("at step 3") && t.note.contains("resumes from /ckpt/step-00000003"), "{t:?}");
        let p = step(&mut tj, in_queue(&evicted, "Preempted", false));
        assert_eq!(p.status.preemptions, 1, "counted once");
        assert!(p.transition.is_none());

        let p = step(&mut tj, in_queue(&admitted, "Admitted", true));
        assert_eq!((p.status.phase, p.status.attempts), (TrainingJobPhase::Running, 1));
        assert!(p.transition.unwrap().note.ends_with("it resumes from /ckpt/step-00000003"));
    }

    #[test]
    fn suspend_stops_the_job_and_resume_starts_a_resuming_attempt() {
        let mut tj = fixtures::training_job(1);
        step(&mut tj, observed(None, 0));
        tj.spec.suspend = true;
        let running = job("run-trainer-0", None);
        let p = step(&mut tj, observed(Some(&running), 5));
        assert_eq!(p.action, Action::StopJob { name: "run-trainer-0".into() });
        assert_eq!(p.status.phase, TrainingJobPhase::Suspended);
        let p = step(&mut tj, observed(None, 6));
        assert_eq!(p.action, Action::None);
        tj.spec.suspend = false;
        let p = step(&mut tj, observed(None, 7));
        assert_eq!(p.action, Action::Start { attempt: 1 });
        assert_eq!(p.status.failures, 0, "a suspension is not a failure");
        let suspended = p.status.conditions.iter().find(|c| c.type_ == types::SUSPENDED).unwrap();
        assert_eq!(suspended.status, "False");
    }
}
