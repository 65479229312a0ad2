//! `scripts/gpu-check.sh --cpu-rehearsal`: every step the lent GPU machine runs
//! (`--single-gpu`, from the device kit), run here on the CPU with tiny shapes, so that a broken
//! step is found in CI rather than in the scarce GPU minutes; its report as the GPU run writes it.

use kart_tests::{binary, repo_root};
use serde_json::Value;
use std::process::Command;

#[test]
fn the_cpu_rehearsal_runs_every_step_of_the_gpu_check() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new("bash")
        .arg(repo_root().join("scripts/gpu-check.sh"))
        .arg("--cpu-rehearsal")
        .arg(out.path())
        .env("KART", binary("kart"))
        // Generous: the rehearsal's own budget is the GPU run's, and a loaded machine is slower.
        .env("BUDGET_SECONDS", "3000")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("gpu-check.json")).unwrap()).unwrap();
    let steps: Vec<(&str, i64)> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap(), s["rc"].as_i64().unwrap_or(-1)))
        .collect();
    let names: Vec<&str> = steps.iter().map(|s| s.0).collect();
    assert_eq!(
        names,
        [
            "doctor",
            "model-f32",
            "model-bf16",
            "step-gpu",
            "step-cpu",
            "train-0.5b",
            "train-1.5b",
            "memory",
            "dense",
            "local"
        ]
    );
    assert!(steps.iter().all(|s| s.1 == 0), "{steps:?}");
    let results = &report["results"];
    // f32 on the CPU: the same logits as transformers; bf16 runs and is compared too.
    assert!(results["model-f32"]["logits"]["max_abs_diff"].as_f64().unwrap() < 1e-4, "{results}");
    assert!(results["model-bf16"]["logits"]["max_abs_diff"].as_f64().unwrap().is_finite(), "{results}");
    assert_eq!(results["model-bf16"]["precision"], "bf16");
    // The training steps ran in bf16 with checkpointing on both sides, with an MFU.
    for shape in ["train-0.5b", "train-1.5b"] {
        let train = &results[shape];
        assert_eq!(
            (train["precision"].as_str(), train["activation_checkpointing"].as_bool()),
            (Some("bf16"), Some(true))
        );
        assert!(train["pairs"][0]["mfu"]["kart"].as_f64().unwrap() > 0.0, "{train}");
    }
    assert!(results["memory"].as_array().unwrap().iter().all(|r| r["setup"]["precision"] == "bf16"));
    assert!(results["dense"]["torch_exact"]["recall"].as_f64().unwrap() >= 0.99, "{results}");
    assert!(results["local"]["after_rl"]["exact_match"].is_number(), "{results}");
    // The tables, as the book takes them.
    let markdown = std::fs::read_to_string(out.path().join("gpu-check.md")).unwrap();
    let headings = [
        "## Steps",
        "## Correctness",
        "## One GRPO step",
        "## Generation",
        "## GRPO step",
        "## Memory",
        "## Dense",
        "## `kart local",
    ];
    for heading in headings {
        assert!(markdown.contains(heading), "{heading}: {markdown}");
    }
    assert!(out.path().join("logs.tar.gz").is_file());
}
