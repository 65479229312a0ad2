//! Prometheus metrics: every kart metric is prefixed `kart_` and registered in the registry of the
//! service that exports it. These helpers keep registration terse and the names checked.

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// The prefix of every kart metric.
pub const PREFIX: &str = "kart_";

fn checked(name: &str) -> &str {
    assert!(name.starts_with(PREFIX), "metric `{name}` must start with `{PREFIX}`");
    name
}

/// Registers a counter family. Panics on a duplicate or malformed name: a programming error.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(checked(name), help), labels).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("metric registered once");
    c
}

/// Registers a histogram family with the given bucket bounds.
pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(checked(name), help).buckets(buckets), labels)
        .expect("valid histogram");
    registry.register(Box::new(h.clone())).expect("metric registered once");
    h
}

/// Registers a histogram without labels.
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(checked(name), help).buckets(buckets))
        .expect("valid histogram");
    registry.register(Box::new(h.clone())).expect("metric registered once");
    h
}

/// Registers a gauge.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(checked(name), help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("metric registered once");
    g
}

/// Registers a floating-point gauge.
pub fn float_gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(checked(name), help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("metric registered once");
    g
}

/// Registers a floating-point gauge family.
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(checked(name), help), labels).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("metric registered once");
    g
}

/// Registers a counter without labels.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(checked(name), help).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("metric registered once");
    c
}

/// Latency buckets in seconds, from 100 µs to 60 s.
pub fn latency_buckets() -> Vec<f64> {
    vec![
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ]
}

/// The registry in Prometheus' text exposition format.
pub fn encode(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf).expect("text encoding cannot fail");
    String::from_utf8(buf).expect("the text format is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_appear_in_the_text_format() {
        let r = Registry::new();
        let c = counter_vec(&r, "kart_test_total", "a test counter", &["kind"]);
        c.with_label_values(&["a"]).inc_by(3);
        let g = gauge(&r, "kart_test_gauge", "a test gauge");
        g.set(7);
        let text = encode(&r);
        assert!(text.contains("kart_test_total{kind=\"a\"} 3"), "{text}");
        assert!(text.contains("kart_test_gauge 7"), "{text}");
    }

    #[test]
    #[should_panic(expected = "must start with `kart_`")]
    fn names_without_the_prefix_are_refused() {
        counter_vec(&Registry::new(), "requests_total", "x", &[]);
    }
}
