//! The operator's own metrics (every name prefixed `kart_operator_`, documented in the book's
//! metrics table).

use crate::crd::training_job::TrainingJobPhase;
use prometheus::{
    Encoder, HistogramOpts, HistogramTimer, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::collections::HashMap;

/// The reconciliation counter's name, by controller.
pub const RECONCILES: &str = "kart_operator_reconciles_total";
/// The reconciliation duration histogram's name, by controller.
pub const RECONCILE_DURATION: &str = "kart_operator_reconcile_duration_seconds";

/// Counters, durations and the TrainingJob gauge, in their own registry.
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    training_jobs: IntGaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciles =
            IntCounterVec::new(Opts::new(RECONCILES, "Reconciliations run, by controller."), &["controller"])
                .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new(
                "kart_operator_reconcile_errors_total",
                "Reconciliations that failed, by controller and reason.",
            ),
            &["controller", "reason"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new(RECONCILE_DURATION, "Duration of one reconciliation.")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["controller"],
        )
        .expect("valid metric");
        let training_jobs =
            IntGaugeVec::new(Opts::new("kart_operator_training_jobs", "TrainingJobs by phase."), &["phase"])
                .expect("valid metric");
        let registry = Registry::new();
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(errors.clone()),
            Box::new(duration.clone()),
            Box::new(training_jobs.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        for phase in TrainingJobPhase::ALL {
            training_jobs.with_label_values(&[phase.as_str()]).set(0);
        }
        Metrics { registry, reconciles, errors, duration, training_jobs }
    }
}

impl Metrics {
    /// Counts a reconciliation of `controller` and times it until the timer drops.
    pub fn reconcile(&self, controller: &str) -> HistogramTimer {
        self.reconciles.with_label_values(&[controller]).inc();
        self.duration.with_label_values(&[controller]).start_timer()
    }

    /// Counts a failed reconciliation.
    pub fn error(&self, controller: &str, reason: &str) {
        self.errors.with_label_values(&[controller, reason]).inc();
    }

    /// Sets the TrainingJob gauge from the phases of all TrainingJobs.
    pub fn set_training_jobs(&self, phases: impl IntoIterator<Item = TrainingJobPhase>) {
        let mut counts: HashMap<TrainingJobPhase, i64> = HashMap::new();
        for p in phases {
            *counts.entry(p).or_default() += 1;
        }
        for p in TrainingJobPhase::ALL {
            self.training_jobs.with_label_values(&[p.as_str()]).set(counts.get(&p).copied().unwrap_or(0));
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding");
        String::from_utf8(out).expect("the exposition is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauge_counts_jobs_per_phase() {
        let m = Metrics::default();
        m.set_training_jobs([TrainingJobPhase::Running, TrainingJobPhase::Succeeded]);
        drop(m.reconcile("training-job"));
        m.error("training-job", "conflict");
        let text = m.render();
        assert!(text.contains("kart_operator_training_jobs{phase=\"Running\"} 1"), "{text}");
        assert!(text.contains("kart_operator_training_jobs{phase=\"Succeeded\"} 1"), "{text}");
        assert!(text.contains("kart_operator_reconciles_total{controller=\"training-job\"} 1"), "{text}");
        assert!(text.contains(
            "kart_operator_reconcile_errors_total{controller=\"training-job\",reason=\"conflict\"} 1"
        ));
        assert!(
            text.contains("kart_operator_reconcile_duration_seconds_count{controller=\"training-job\"} 1")
        );
        m.set_training_jobs([TrainingJobPhase::Succeeded]);
        assert!(m.render().contains("kart_operator_training_jobs{phase=\"Running\"} 0"));
    }
}
