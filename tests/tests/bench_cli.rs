//! `kart bench` as a developer runs it: quick runs of the model, train, rollout and sync benchmarks
//! report their figures, and a missing anchor environment is reported with the way to install it.

use kart_tests::{binary, repo_root, report_of};
use serde_json::Value;
use std::process::Command;

/// Held by the tests that start several ranks: a launcher picks a free loopback port for its
/// ranks' store and another launcher in the same moment could pick it too, so they take turns.
static RANKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The venv's Python when it has the anchors' packages.
fn anchor_python() -> Option<std::path::PathBuf> {
    let python = repo_root().join(".venv/bin/python");
    let has_transformers = Command::new(&python)
        .args(["-c", "import torch, transformers"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_transformers {
        eprintln!("skipping: {} cannot import torch and transformers", python.display());
    }
    has_transformers.then_some(python)
}

/// `kart bench <args> --quick` with the anchor run by `python`: its output and JSON report.
fn quick_bench(python: &std::path::Path, args: &[&str]) -> (String, Value) {
    let json = std::env::temp_dir().join(format!("kart-bench-{}-{}.json", args[0], std::process::id()));
    let mut command = Command::new(binary("kart"));
    command.arg("bench").args(args).args(["--quick", "--json"]).arg(&json).arg("--python").arg(python);
    let (stdout, report) = report_of(&mut command, &json);
    std::fs::remove_file(&json).unwrap();
    (stdout, report)
}

#[test]
fn quick_model_bench_reports_every_metric() {
    let Some(python) = anchor_python() else { return };
    let (stdout, report) = quick_bench(&python, &["model"]);
    assert!(stdout.contains("met?") && stdout.contains("train step"), "{stdout}");
    let rows = report["rows"].as_array().unwrap();
    let metrics: Vec<&str> = rows.iter().map(|row| row["metric"].as_str().unwrap()).collect();
    assert_eq!(
        metrics,
        [
            "generate, batch 1 (tokens/s)",
            "generate, batch 4 (tokens/s)",
            "train step, forward + backward (s)"
        ]
    );
    for row in rows {
        for key in ["kart", "anchor", "ratio"] {
            assert!(row[key].as_f64().unwrap() > 0.0, "{row}");
        }
        assert!(row["met"].is_boolean(), "{row}");
    }
    assert!(report["threads"].as_i64().unwrap() >= 1 && report["anchor"]["threads"].as_i64().unwrap() >= 1);
    // Both sides computed the same loss on the same weights and batch.
    let (kart, anchor) =
        (report["loss"]["kart"].as_f64().unwrap(), report["loss"]["anchor"].as_f64().unwrap());
    assert!((kart - anchor).abs() < 1e-4, "loss: kart {kart}, transformers {anchor}");
    // And the same logits (f32 on the CPU).
    let logits = &report["logits"];
    assert!(logits["max_abs_diff"].as_f64().unwrap() < 1e-4, "{logits}");
    assert_eq!(logits["argmax_agreement"].as_f64(), Some(1.0), "{logits}");
    assert_eq!((report["device"].as_str(), report["precision"].as_str()), (Some("Cpu"), Some("f32")));
}

#[test]
fn quick_train_bench_on_two_ranks_matches_ddp_and_reports_the_scaling() {
    let Some(python) = anchor_python() else { return };
    let _turn = RANKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (stdout, report) = quick_bench(&python, &["train", "--ranks", "2", "--peak-tflops", "1"]);
    assert!(stdout.contains("scaling efficiency") && stdout.contains("MFU kart"), "{stdout}");
    let metrics: Vec<&str> =
        report["rows"].as_array().unwrap().iter().map(|r| r["metric"].as_str().unwrap()).collect();
    assert_eq!(metrics, ["GRPO step, 2 rank(s) (s)", "GRPO step, 1 rank(s) (s)"]);
    // kart's 2 ranks over c10d, torch's DDP and both single ranks computed the same steps.
    let pairs = report["pairs"].as_array().unwrap();
    let figure =
        |pair: &Value, side: &str, step: usize, key: &str| pair[side]["steps"][step][key].as_f64().unwrap();
    let entropy = figure(&pairs[0], "kart", 0, "entropy");
    let kl = figure(&pairs[0], "kart", 1, "kl");
    assert!(kl > 0.0, "the policy moved from the reference: {report}");
    let (pg_loss, grad_norm) =
        (figure(&pairs[0], "kart", 0, "pg_loss"), figure(&pairs[0], "kart", 0, "grad_norm"));
    assert!(grad_norm > 0.0, "{report}");
    for pair in pairs {
        let share = (std::thread::available_parallelism().unwrap().get() / 2).max(1);
        assert_eq!(pair["kart"]["threads"], share, "each rank gets an equal share of the cores");
        for side in ["kart", "torch"] {
            assert!((figure(pair, side, 0, "entropy") - entropy).abs() < 1e-5, "{report}");
            assert!((figure(pair, side, 1, "kl") - kl).abs() < 1e-3 * kl, "{report}");
            // The same policy loss and gradient norm on the first step (the same weights).
            assert!((figure(pair, side, 0, "pg_loss") - pg_loss).abs() < 1e-5, "{report}");
            assert!((figure(pair, side, 0, "grad_norm") - grad_norm).abs() < 1e-4 * grad_norm, "{report}");
        }
        assert!(pair["mfu"]["kart"].as_f64().unwrap() > 0.0, "{report}");
    }
    let [kart, torch] = [0, 1].map(|i| report["scaling_efficiency"][i].as_f64().unwrap());
    assert!(kart > 0.0 && torch > 0.0, "{report}");
}

/// `kart bench train --lora`: kart's adapters against PEFT's on the same base and batch, and
/// against kart's full fine-tuning.
#[test]
fn quick_lora_train_bench_matches_peft_and_holds_less_than_full_fine_tuning() {
    let Some(python) = anchor_python() else { return };
    let _turn = RANKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (stdout, report) = quick_bench(&python, &["train", "--lora", "4"]);
    assert!(stdout.contains("LoRA rank 4 on every projection"), "{stdout}");
    let rows = report["rows"].as_array().unwrap();
    let metrics: Vec<&str> = rows.iter().map(|r| r["metric"].as_str().unwrap()).collect();
    assert_eq!(metrics, ["GRPO step, 1 rank(s) (s)", "LoRA step vs full (s)", "LoRA peak MB/rank vs full"]);
    assert_eq!(rows[2]["met"], true, "the adapters' optimiser state is smaller than the model's: {report}");
    let first = |side: &str, key: &str| report["pairs"][0][side]["steps"][0][key].as_f64().unwrap();
    // B starts at zero on both sides, so the first pass is the base's; A is drawn by each side's
    // own generator, so the gradients (of B, through A) differ.
    for key in ["entropy", "pg_loss"] {
        assert!((first("kart", key) - first("torch", key)).abs() < 1e-5, "{key}: {report}");
    }
    assert!(first("kart", "grad_norm") > 0.0 && first("torch", "grad_norm") > 0.0, "{report}");
    assert!(report["full_fine_tuning"]["steps"].as_array().is_some_and(|s| s.len() == 2), "{report}");
}

#[test]
fn benches_on_cuda_without_a_gpu_say_so() {
    let run = |args: &[&str]| {
        let output = Command::new(binary("kart")).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        stderr
    };
    let stderr = run(&["bench", "train", "--quick", "--device", "cuda"]);
    assert!(stderr.contains("--device cuda --ranks 1: 0 CUDA devices are visible"), "{stderr}");
    let stderr = run(&["bench", "retriever", "--dense", "--passages", "10", "--device", "cuda"]);
    assert!(stderr.contains("--device = cuda: "), "{stderr}");
    // The dense bench's settings are refused without --dense rather than ignored.
    let output =
        Command::new(binary("kart")).args(["bench", "retriever", "--device", "cpu"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--dense"), "{stderr}");
}

#[test]
fn missing_anchor_python_says_how_to_install_it() {
    let output = Command::new(binary("kart"))
        .args(["bench", "model", "--quick", "--python", "/nonexistent/bin/python"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/bin/python") && stderr.contains("bash scripts/setup.sh"),
        "{stderr}"
    );
}

#[test]
fn quick_sync_bench_times_every_method_against_disk() {
    let Some(python) = anchor_python() else { return };
    let (stdout, report) = quick_bench(&python, &["sync"]);
    let rows = report["rows"].as_array().unwrap();
    let metrics: Vec<&str> = rows.iter().map(|row| row["metric"].as_str().unwrap()).collect();
    assert_eq!(metrics, ["http_pull seconds", "sglang_broadcast seconds", "vllm_broadcast seconds"]);
    for key in ["disk_secs", "pull_secs", "broadcast_secs", "vllm_broadcast_secs"] {
        assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
    }
    assert_eq!((report["replicas"].as_i64(), report["backend"].as_str()), (Some(2), Some("gloo")));
    assert!(stdout.contains("vllm_broadcast: ") && stdout.contains("MB/s over gloo"), "{stdout}");
}

/// The standard output of `kart bench rollout --quick` with `args`, which must succeed.
fn quick_rollout_bench(args: &[&str]) -> String {
    let out = Command::new(binary("kart")).args(["bench", "rollout", "--quick"]).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn quick_rollout_bench_reports_each_level() {
    let stdout = quick_rollout_bench(&["--group-size", "2"]);
    assert!(stdout.contains("groups of 2 episodes per question"), "{stdout}");
    let refused =
        Command::new(binary("kart")).args(["bench", "rollout", "--group-size", "0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("--group-size"), "{stderr}");
    // One row per level: concurrency, trajectories, wall, ideal, trajectories/s, overhead, the
    // engine alone's overhead, CPU per trajectory.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 8 && f[0].parse::<usize>().is_ok())
        .collect();
    assert_eq!(rows.iter().map(|r| r[0]).collect::<Vec<_>>(), ["1", "4"], "{stdout}");
    for row in rows {
        let wall: f64 = row[2].parse().unwrap();
        let ideal: f64 = row[3].parse().unwrap();
        assert!(wall >= ideal, "a level cannot beat the ideal: {row:?}");
        assert!(row[5].ends_with('%') && row[6].ends_with('%'), "{row:?}");
        assert!(row[7].parse::<f64>().unwrap() > 0.0, "{row:?}");
    }
    // The same trajectories with the index searched in the worker's process: every one searched
    // (the bench fails otherwise), without the retriever service.
    let stdout = quick_rollout_bench(&["--retriever", "in-process"]);
    assert!(stdout.contains("passages in this process"), "{stdout}");
}

/// `kart bench train --memory`: kart alone in each memory setting, every rank's peak measured
/// (no anchor environment needed), with the ratios against the f32 row.
#[test]
fn quick_memory_bench_measures_every_setting() {
    let _turn = RANKS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let json = std::env::temp_dir().join(format!("kart-bench-memory-{}.json", std::process::id()));
    let output = Command::new(binary("kart"))
        .args(["bench", "train", "--memory", "--quick", "--steps", "1", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let settings: Vec<(String, bool, String, u64)> = rows
        .iter()
        .map(|r| {
            let s = &r["setup"];
            let name = |k: &str| s[k].as_str().unwrap().to_owned();
            (
                name("precision"),
                s["activation_checkpointing"].as_bool().unwrap(),
                name("sharding"),
                s["ranks"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        settings,
        [
            ("f32".into(), false, "none".into(), 1),
            ("f32".into(), true, "none".into(), 1),
            ("f32".into(), true, "gradients".into(), 2),
            ("f32".into(), true, "full".into(), 2),
            ("bf16".into(), false, "none".into(), 1),
            ("bf16".into(), true, "none".into(), 1),
            ("bf16".into(), true, "full".into(), 2),
        ]
    );
    for row in &rows {
        assert!(
            row["peak_bytes_per_rank"].as_u64().unwrap() > 0 && row["seconds"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert!(row["kl"].as_f64().unwrap().is_finite(), "{row}");
        assert!(row["tokens_per_second"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert_eq!(rows[0]["memory_ratio"].as_f64(), Some(1.0));
    // --precision f32 leaves out the bf16 rows.
    let output = Command::new(binary("kart"))
        .args(["bench", "train", "--memory", "--precision", "f32", "--quick", "--steps", "1", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    assert!(rows.len() == 4 && rows.iter().all(|r| r["setup"]["precision"] == "f32"), "{rows:?}");
}

/// `kart bench retriever --dense`: kart's graph and faiss's on the same small set of embeddings,
/// a row per efSearch, recall against the exact scan, and the JSON figures.
#[test]
fn small_dense_bench_compares_the_graph_with_the_exact_scan_and_faiss() {
    let python = kart_tests::python();
    let json = std::env::temp_dir().join(format!("kart-bench-dense-{}.json", std::process::id()));
    let (stdout, report) = report_of(
        Command::new(binary("kart"))
            .args(["bench", "retriever", "--dense", "--passages", "3000", "--queries", "200", "--dim", "64"])
            .args(["--ann-expansion-search", "16,64", "--ann-rerank", "10,50", "--batch", "64", "--python"])
            .arg(&python)
            .arg("--json")
            .arg(&json),
        &json,
    );
    assert!(stdout.contains("target: recall@10 >= 0.95"), "{stdout}");
    assert!(stdout.contains("best QPS at recall@10 >= 0.95: kart "), "{stdout}");
    std::fs::remove_file(&json).unwrap();
    for side in ["kart", "faiss"] {
        let searches = report[side]["searches"].as_array().unwrap();
        let settings: Vec<(u64, u64)> = searches
            .iter()
            .map(|s| (s["rerank"].as_u64().unwrap(), s["expansion_search"].as_u64().unwrap()))
            .collect();
        assert_eq!(settings, [(10, 16), (10, 64), (50, 16), (50, 64)], "{side}: {report}");
        for s in searches {
            // Re-scoring only the 10 asked for leaves the graph's own ranking.
            assert!(s["recall"].as_f64().unwrap() >= 0.85, "{side}: {s}");
            assert!(s["batch_qps"].as_f64().unwrap() > 0.0 && s["single_qps"].as_f64().unwrap() > 0.0);
        }
        assert!(report[side]["index_bytes"].as_u64().unwrap() > 3000 * 64 / 4, "{side}: {report}");
    }
    assert!(report["exact_batch_qps"].as_f64().unwrap() > 0.0);
    assert_eq!(report["exact_on"], "Cpu Float", "the exact scan runs where --device says: {report}");
    assert!(stdout.contains("exact scan (Cpu Float): "), "{stdout}");
    // torch's matmul + topk on the same embeddings finds the same neighbours (f32 on the CPU).
    let torch = &report["torch_exact"];
    assert_eq!(torch["on"], "cpu float32", "{report}");
    assert!(torch["recall"].as_f64().unwrap() >= 0.99, "{report}");
    assert!(torch["batch_qps"].as_f64().unwrap() > 0.0 && torch["single_qps"].as_f64().unwrap() > 0.0);

    // --exact-only: the scan and its anchor, no graph.
    let output = Command::new(binary("kart"))
        .args(["bench", "retriever", "--dense", "--exact-only", "--passages", "2000", "--queries", "50"])
        .args(["--dim", "32", "--python"])
        .arg(&python)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    assert!(report["kart"].is_null() && report["faiss"].is_null(), "{report}");
    assert!(report["torch_exact"]["recall"].as_f64().unwrap() >= 0.99, "{report}");
}

/// `kart bench retriever`: kart's BM25 against Lucene and bm25s on the same small corpus. Lucene
/// analyses and scores as kart does, so every query's top k is Lucene's, or differs only where
/// two scores are equal; the scores themselves agree once Lucene's missing `k1 + 1` is put back.
#[test]
fn small_bm25_bench_ranks_as_lucene_does() {
    let python = kart_tests::python();
    let json = std::env::temp_dir().join(format!("kart-bench-bm25-{}.json", std::process::id()));
    let (stdout, report) = report_of(
        Command::new(binary("kart"))
            .args(["bench", "retriever", "--passages", "20000", "--queries", "500", "--batch", "64"])
            .args(["--vocab", "20000", "--python"])
            .arg(&python)
            .arg("--json")
            .arg(&json),
        &json,
    );
    std::fs::remove_file(&json).unwrap();
    assert!(stdout.contains("top 3 against Lucene's: "), "{stdout}");
    let agreement = &report["agreement"];
    assert_eq!(agreement["queries"], 500, "{report}");
    assert_eq!(agreement["different"], 0, "{agreement}");
    assert!(agreement["identical"].as_u64().unwrap() >= 490, "{agreement}");
    assert!(agreement["max_score_difference"].as_f64().unwrap() < 1e-5, "{agreement}");
    for anchor in ["lucene", "bm25s"] {
        let a = &report[anchor];
        assert!(
            a["single_qps"].as_f64().unwrap() > 0.0 && a["concurrent_qps"].as_f64().unwrap() > 0.0,
            "{a}"
        );
        assert!(
            (a["recall"].as_f64().unwrap() - report["kart"]["recall"].as_f64().unwrap()).abs() < 0.02,
            "{report}"
        );
    }
    assert!(report["lucene"]["index_bytes"].as_u64().unwrap() > 0, "{report}");
    let qps = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"].as_str().unwrap().starts_with("QPS, single"));
    let ratios = &qps.unwrap()["ratios"];
    assert!(ratios[0].as_f64().unwrap() > 0.0 && ratios[1].as_f64().unwrap() > 0.0, "{report}");
}

/// `kart bench retriever --dense --ann-quantization b1`: the compressed, one-bit graph against
/// faiss's IVF-PQ of as many bytes a vector; re-scoring more candidates finds more neighbours.
#[test]
fn small_compressed_dense_bench_compares_the_one_bit_graph_with_faiss_ivfpq() {
    let python = kart_tests::python();
    let json = std::env::temp_dir().join(format!("kart-bench-b1-{}.json", std::process::id()));
    let (stdout, report) = report_of(
        Command::new(binary("kart"))
            .args(["bench", "retriever", "--dense", "--passages", "3000", "--queries", "200", "--dim", "64"])
            .args(["--ann-quantization", "b1", "--ann-expansion-search", "32", "--ann-rerank", "20,300"])
            .args(["--ivf-lists", "16", "--ivf-probes", "2,8", "--batch", "64", "--python"])
            .arg(&python)
            .arg("--json")
            .arg(&json),
        &json,
    );
    std::fs::remove_file(&json).unwrap();
    assert!(stdout.contains("target: recall@10 >= 0.95 at >= 50x"), "{stdout}");
    assert!(report["faiss"].is_null(), "no float HNSW anchor for b1: {report}");
    let recall = |side: &str, i: usize| report[side]["searches"][i]["recall"].as_f64().unwrap();
    assert!(recall("kart", 1) > recall("kart", 0) && recall("kart", 1) >= 0.9, "{report}");
    let ivfpq = report["faiss_ivfpq"]["searches"].as_array().unwrap();
    assert_eq!(ivfpq.len(), 4, "{report}");
    assert!(recall("faiss_ivfpq", 3) >= 0.9, "{report}");
    // 8 bytes of signs a vector beside its links (at most 2 x 32 of 4 bytes at the base layer),
    // where f32 vectors would add 256.
    assert!(report["kart"]["index_bytes"].as_u64().unwrap() < 3000 * (8 + 2 * 32 * 4 + 40), "{report}");
}

/// `kart bench retriever --reuse`: a second run searches the first run's corpus and index without
/// building (its build figures absent, its results the same), and refuses a folder of other
/// settings.
#[test]
fn bm25_bench_reuses_an_index_of_the_same_settings_only() {
    let work = tempfile::tempdir().unwrap();
    let json = work.path().join("report.json");
    let bench = |extra: &[&str]| {
        let mut command = Command::new(binary("kart"));
        command
            .args([
                "bench",
                "retriever",
                "--passages",
                "2000",
                "--queries",
                "50",
                "--vocab",
                "2000",
                "--no-anchor",
            ])
            .arg("--work")
            .arg(work.path().join("run"))
            .arg("--json")
            .arg(&json)
            .args(extra);
        command
    };
    let (_, first) = report_of(&mut bench(&[]), &json);
    assert!(first["kart"]["index_seconds"].as_f64().unwrap() > 0.0, "{first}");
    let rows = first["rows"].as_array().unwrap();
    let qps = rows.iter().find(|r| r["metric"] == "QPS, single queries, sequential (1 thread)").unwrap();
    assert!(qps["met"].is_null(), "a ratio target is not judged without an anchor: {qps}");
    let (stdout, again) = report_of(&mut bench(&["--reuse"]), &json);
    assert!(stdout.contains("index reused (--reuse)"), "{stdout}");
    assert!(again["kart"]["index_seconds"].is_null(), "not measured, not 0: {again}");
    assert_eq!(again["kart"]["recall"], first["kart"]["recall"], "{again}");
    assert_eq!(again["kart"]["index_bytes"], first["kart"]["index_bytes"], "{again}");
    let other = bench(&["--reuse", "--seed", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success() && stderr.contains("--reuse:") && stderr.contains("seed: 1"), "{stderr}");
}
