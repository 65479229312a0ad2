//! `kart doctor`: the release binary built against the CUDA wheel has CUDA support loaded on a
//! machine without a GPU, and `device: cuda` without a GPU is refused naming the field.

use kart_tests::{binary, fresh_dir, shared_dir, write_capitals};
use serde_json::{Value, json};
use std::process::Command;

/// Whether the venv's torch is a CUDA build (libtorch_cuda beside libtorch_cpu).
fn torch_has_cuda() -> bool {
    let lib = kart_testing::venv().join("lib");
    std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .any(|python| python.path().join("site-packages/torch/lib/libtorch_cuda.so").exists())
}

#[test]
fn doctor_reports_cuda_support_gloo_nccl_and_the_rank() {
    let output = Command::new(binary("kart"))
        .args(["doctor", "--json"])
        .env("WORLD_SIZE", "4")
        .env("RANK", "3")
        .env("LOCAL_RANK", "1")
        .env("LOCAL_WORLD_SIZE", "2")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(report["torch_version"].as_str().unwrap().starts_with("2."), "{report}");
    assert!(report["gloo"]["available"].is_string(), "{report}");
    if torch_has_cuda() {
        assert_eq!(report["cuda"]["loaded"], json!(true), "{report}");
        assert_eq!(report["cuda"]["library_mapped"], json!(true), "{report}");
        assert!(report["nccl"]["available"].is_string(), "{report}");
    }
    assert_eq!(report["ranks"]["rank"], json!(3));
    assert_eq!(report["ranks"]["local_rank"], json!(1));
    let components = report["components"].as_array().unwrap();
    assert_eq!(components.len(), 3, "{report}");
    let gpus = report["devices"].as_array().unwrap().len();
    if gpus < 2 {
        assert!(components.iter().all(|c| c["device"] == "cpu"), "local rank 1 has no GPU: {report}");
    }

    let text = Command::new(binary("kart")).arg("doctor").output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("CUDA support: ") && text.contains("Gloo: available"), "{text}");
}

#[test]
fn device_cuda_without_a_gpu_is_refused_naming_the_field() {
    if tch::Cuda::device_count() > 0 {
        println!("skipped: this machine has a GPU");
        return;
    }
    let dir = fresh_dir("kart-doctor-device");
    write_capitals(&dir);
    let config = json!({
        "model": shared_dir().join("fixtures/models/tiny-qwen2"),
        "output_dir": dir.join("out"),
        "device": "cuda",
        "data": {"train": dir.join("train.jsonl")},
        "rollout": {"urls": ["http://127.0.0.1:9"]},
        "host": "127.0.0.1",
        "port": 0,
    });
    std::fs::write(dir.join("train.json"), config.to_string()).unwrap();
    let output = Command::new(binary("kart"))
        .args(["train", "--config"])
        .arg(dir.join("train.json"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("device = cuda: no CUDA device is visible"), "{stderr}");
}
