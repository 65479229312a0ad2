//! `kart bench operator --quick` as a developer runs it: a real control plane with KWOK's
//! simulated GPU nodes, the operator under its own user (its requests counted from the API
//! server's audit log). Every object gets a phase, nothing is written once the cluster settled
//! (every object reconciled again by a short resync), and a restarted operator re-lists and
//! reconciles every object without writing a child.

use kart_tests::{binary, report_of};
use serde_json::json;
use std::process::Command;

#[test]
fn quick_operator_bench_settles_without_writes_and_restarts_without_rewriting_a_child() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut command = Command::new(binary("kart"));
    command.args(["bench", "operator", "--quick", "--json"]).arg(&json);
    let (stdout, report) = report_of(&mut command, &json);
    let counts = &report["counts"];
    let objects = ["training_jobs", "rollout_pools", "retrievers"]
        .iter()
        .map(|k| counts[k].as_u64().unwrap())
        .sum::<u64>();
    let phases = report["phases"].as_object().unwrap();
    assert!(!phases.contains_key("(none)"), "{stdout}");
    assert_eq!(phases.values().map(|n| n.as_u64().unwrap()).sum::<u64>(), objects, "{stdout}");
    // More TrainingJobs than the nodes' GPUs: some run, the rest wait for theirs.
    let settled = report["settled_phases"].as_object().unwrap();
    assert!(
        settled.contains_key("TrainingJob Running") && settled.contains_key("Retriever Ready"),
        "{stdout}"
    );
    let pods = &report["pods"];
    assert!(pods["Running"].as_u64().unwrap() > 0 && pods["Pending"].as_u64().unwrap() > 0, "{stdout}");
    assert!(report["reconciles"].as_u64().unwrap() >= objects, "{stdout}");
    let requests = report["requests"].as_object().unwrap();
    assert!(["list", "watch", "patch"].iter().all(|v| requests.contains_key(*v)), "{stdout}");
    assert_eq!(report["steady_writes"], json!({}), "{stdout}");
    assert!(report["steady_reconciles"].as_u64().unwrap() >= objects, "{stdout}");
    assert_eq!(report["restart_child_writes"], json!({}), "{stdout}");
    assert_eq!(report["restart_status_writes"], 0, "{stdout}");
    assert!(report["peak_rss_mb"].as_f64().is_some_and(|mb| mb > 1.0), "{stdout}");
    assert!(report["p99_reconcile_secs"].as_f64().is_some_and(f64::is_finite), "{stdout}");
    for line in [
        "time until every object has a phase",
        "writes per minute at steady state",
        "child writes after a restart",
    ] {
        assert!(stdout.contains(line), "{stdout}");
    }
}
