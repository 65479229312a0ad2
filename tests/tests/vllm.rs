//! kart against a real vLLM (its CPU build, `kart_tests::vllm`): the same greedy tokens from
//! transformers, kart's embedded engine and vLLM on the same weights, vLLM's log-probabilities
//! equal to the ones kart recomputes for training (the off-policy correction divides by them),
//! a request meaning the same on both engines (stop token ids, stop strings, `length` ends,
//! seeds, a paused server holding requests until resumed), and `kart eval` and `kart infer`
//! through vLLM giving what they give on the embedded engine.

use kart_core::engine::{Engine, EngineError, EngineOutput};
use kart_core::generation::{FinishReason, Generation, GenerationRequest, SamplingParams};
use kart_model::{CausalLm, EmbeddedEngine};
use kart_rollout::engines::vllm::VllmEngine;
use kart_tests::vllm::{Vllm, score, serving_model};
use kart_tests::{binary, corpus_retriever, fresh_dir};
use kart_tokenizer::Tokenizer;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tch::Device;

/// vLLM's log-probabilities against kart's recomputed ones, both in f32.
const LOGPROB_TOLERANCE: f64 = 1e-4;
/// Where the oracle's top two logits are closer than this, two correct f32 engines may pick
/// different tokens; a case is compared up to the first such step.
const TIE: f64 = 1e-4;

/// One oracle case of the model's `expected.json`.
struct Case {
    input_ids: Vec<u32>,
    greedy: Vec<u32>,
    margins: Vec<f64>,
}

fn cases(model: &Path) -> Vec<Case> {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("expected.json")).unwrap()).unwrap();
    let ids =
        |v: &Value| v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect::<Vec<_>>();
    expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| Case {
            input_ids: ids(&case["input_ids"]),
            greedy: ids(&case["greedy_continuation"]),
            margins: case["greedy_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect(),
        })
        .collect()
}

fn greedy(input_ids: &[u32], max_new_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        input_ids: input_ids.to_vec(),
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        max_new_tokens,
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
    }
}

/// The steps of `case` two engines must agree on: all of them, or those before the first near tie.
fn comparable(case: &Case) -> usize {
    case.margins.iter().position(|&m| m < TIE).unwrap_or(case.greedy.len())
}

/// Every case of `model_dir` through `server`, the embedded engine and (from the oracle)
/// transformers.
fn engines_agree_on(model_dir: &Path, server: &Vllm) {
    let name = &server.served;
    let model_dir = model_dir.to_path_buf();
    let cases = cases(&model_dir);
    let model = CausalLm::load(&model_dir, Device::Cpu).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let vllm = VllmEngine::new(&server.url, &server.served, Duration::from_secs(600));
    let embedded = EmbeddedEngine::spawn(
        CausalLm::load(&model_dir, Device::Cpu).unwrap(),
        Tokenizer::load(&model_dir).unwrap(),
        cases.len(),
        0,
        0,
    );
    // All cases at once: vLLM and the embedded engine batch them, as they do rollouts.
    let (from_vllm, from_embedded) = runtime.block_on(async {
        let vllm = futures::future::join_all(
            cases.iter().map(|c| vllm.generate(greedy(&c.input_ids, c.greedy.len()))),
        );
        let embedded = futures::future::join_all(
            cases.iter().map(|c| embedded.generate(greedy(&c.input_ids, c.greedy.len()))),
        );
        futures::join!(vllm, embedded)
    });
    let mut worst = 0f64;
    for (i, ((case, v), e)) in cases.iter().zip(from_vllm).zip(from_embedded).enumerate() {
        let (v, e) = (v.unwrap().generation, e.unwrap().generation);
        let n = comparable(case);
        assert_eq!(v.finish_reason, FinishReason::Length, "{name} case {i}");
        assert_eq!(v.token_ids[..n], case.greedy[..n], "{name} case {i}: vLLM against transformers");
        assert_eq!(
            e.token_ids[..n],
            case.greedy[..n],
            "{name} case {i}: the embedded engine against transformers"
        );
        let kart = score(&model, &case.input_ids, &v.token_ids).logprobs;
        for (step, (served, ours)) in v.logprobs.iter().zip(&kart).enumerate() {
            let diff = (*served as f64 - *ours).abs();
            assert!(
                diff <= LOGPROB_TOLERANCE,
                "{name} case {i} step {step}: vLLM's log-probability {served} against kart's {ours}"
            );
            worst = worst.max(diff);
        }
    }
    kart_tests::log(&format!(
        "{name}: {} cases, greedy tokens equal, worst log-probability difference {worst:.2e}",
        cases.len()
    ));
}

/// One request to both engines: vLLM's generation and the embedded engine's.
async fn both(vllm: &VllmEngine, embedded: &EmbeddedEngine, request: GenerationRequest) -> [Generation; 2] {
    let (v, e) = futures::join!(vllm.generate(request.clone()), embedded.generate(request));
    [v.unwrap().generation, e.unwrap().generation]
}

/// What kart's requests ask for, on a real vLLM and the embedded engine on the same weights:
/// a stop token id and a stop string end the generation at the token that completes them (kept,
/// `stop`), `max_new_tokens` ends it (`length`), a seed makes sampling repeatable (and the
/// log-probabilities at temperature 1 are kart's), and a paused server holds a request until it
/// is resumed.
fn requests_mean_the_same_on(model_dir: &Path, server: &Vllm) {
    let cases = cases(model_dir);
    let tokenizer = Tokenizer::load(model_dir).unwrap();
    let model = CausalLm::load(model_dir, Device::Cpu).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let vllm = VllmEngine::new(&server.url, &server.served, Duration::from_secs(600));
    let embedded =
        EmbeddedEngine::spawn(CausalLm::load(model_dir, Device::Cpu).unwrap(), tokenizer.clone(), 8, 0, 0);
    let case = cases.iter().max_by_key(|c| comparable(c)).unwrap();
    let (prompt, greedy_ids) = (&case.input_ids, &case.greedy[..comparable(case)]);
    assert!(greedy_ids.len() >= 8, "a case with 8 comparable steps: {}", greedy_ids.len());
    runtime.block_on(async {
        // A stop token id: the first token not seen before it, from the third on.
        let k = (2..greedy_ids.len()).find(|&k| !greedy_ids[..k].contains(&greedy_ids[k])).unwrap();
        let request =
            GenerationRequest { stop_token_ids: vec![greedy_ids[k]], ..greedy(prompt, greedy_ids.len()) };
        for (engine, g) in ["vllm", "embedded"].iter().zip(both(&vllm, &embedded, request).await) {
            assert_eq!(g.token_ids, greedy_ids[..=k], "{engine}: stop token id {}", greedy_ids[k]);
            assert_eq!(g.finish_reason, FinishReason::Stop, "{engine}: stop token id");
        }

        // A stop string: the text of the first token that is a word not in the text before it.
        let text = |ids: &[u32]| tokenizer.decode(ids, false).unwrap();
        let word = |k: usize| {
            let word = text(&greedy_ids[k..=k]).trim().to_string();
            let fits = word.len() >= 2 && word.chars().all(|c| c.is_ascii_alphanumeric());
            (fits && !text(&greedy_ids[..k]).contains(&word)).then_some((k, word))
        };
        let (k, stop) = (1..greedy_ids.len()).find_map(word).expect("a word among the greedy tokens");
        let request = GenerationRequest { stop: vec![stop.clone()], ..greedy(prompt, greedy_ids.len()) };
        for (engine, g) in ["vllm", "embedded"].iter().zip(both(&vllm, &embedded, request).await) {
            assert_eq!(g.token_ids, greedy_ids[..=k], "{engine}: stop string {stop:?}");
            assert_eq!(g.finish_reason, FinishReason::Stop, "{engine}: stop string {stop:?}");
        }

        // `length`: fewer tokens than the generation would take.
        for (engine, g) in ["vllm", "embedded"].iter().zip(both(&vllm, &embedded, greedy(prompt, 3)).await) {
            assert_eq!(
                (g.token_ids.as_slice(), g.finish_reason),
                (&greedy_ids[..3], FinishReason::Length),
                "{engine}"
            );
        }

        // Seeds: the same seed samples the same tokens, another seed others; vLLM's
        // log-probabilities at temperature 1 are kart's.
        let sampled = |seed: u64| {
            let requests = cases.iter().take(4).map(move |c| GenerationRequest {
                sampling: SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() },
                ..greedy(&c.input_ids, 16)
            });
            futures::future::join_all(requests.map(|r| vllm.generate(r)))
        };
        let ids = |outputs: &[Result<EngineOutput, EngineError>]| {
            outputs.iter().map(|o| o.as_ref().unwrap().generation.token_ids.clone()).collect::<Vec<_>>()
        };
        let (first, again, other) = (sampled(7).await, sampled(7).await, sampled(8).await);
        assert_eq!(ids(&first), ids(&again), "seed 7 twice");
        assert_ne!(ids(&first), ids(&other), "seeds 7 and 8");
        for (c, output) in cases.iter().zip(&first) {
            let g = &output.as_ref().unwrap().generation;
            for (served, ours) in g.logprobs.iter().zip(score(&model, &c.input_ids, &g.token_ids).logprobs) {
                let diff = (*served as f64 - ours).abs();
                assert!(diff <= LOGPROB_TOLERANCE, "sampled at T=1: vLLM's {served} against kart's {ours}");
            }
        }

        // Paused (once the requests in flight finished), the server holds a new request; resumed,
        // it answers it.
        let control = VllmEngine::control(&server.url, Duration::from_secs(600));
        control.pause().await.unwrap();
        let request = vllm.generate(greedy(prompt, greedy_ids.len()));
        tokio::pin!(request);
        // An observation window, not a wait for a server: a slow machine only makes it likelier
        // that the request is still pending, which is what a paused server must show.
        let held = tokio::time::timeout(Duration::from_secs(3), &mut request).await;
        assert!(held.is_err(), "a paused vLLM answered: {held:?}");
        control.resume().await.unwrap();
        let resumed = request.await.unwrap().generation;
        assert_eq!(resumed.token_ids, greedy_ids, "the held request, once resumed");
    });
    kart_tests::log(&format!("{}: stop ids, stop strings, length, seeds, pause and resume", server.served));
}

/// `kart` with `args` on `model` and the retriever at `retriever`: its stdout, or its stderr when
/// it fails.
fn kart(args: &[&str], model: &Path, retriever: &str) -> Result<String, String> {
    let done = Command::new(binary("kart"))
        .args(args)
        .arg("--model")
        .arg(model)
        .args(["--retriever", retriever, "--env", r#"{"kind": "search-r1", "max_turns": 2}"#])
        .output()
        .unwrap();
    match done.status.success() {
        true => Ok(String::from_utf8_lossy(&done.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&done.stderr).into_owned()),
    }
}

/// `kart eval` and `kart infer` (greedy, searching a real retriever) through `server` and through
/// the embedded engine: the same trajectories, figures and printed turns.
fn eval_and_infer_agree(model: &Path, server: &Vllm) {
    let dir = fresh_dir("kart-vllm-eval");
    let corpus = [
        serde_json::json!({"id": "0", "contents": "\"Hamlet\"\nHamlet is a tragedy written by William Shakespeare."}),
        serde_json::json!({"id": "1", "contents": "\"Lima\"\nLima is the capital of Peru."}),
    ];
    std::fs::write(dir.join("corpus.jsonl"), corpus.iter().map(|r| format!("{r}\n")).collect::<String>())
        .unwrap();
    let (_retriever, retriever) = corpus_retriever(&dir);
    let questions = dir.join("questions.jsonl");
    let rows = [
        serde_json::json!({"id": "h", "question": "Who wrote Hamlet?", "answer": "William Shakespeare", "data_source": "nq"}),
        serde_json::json!({"id": "p", "question": "What is the capital of Peru?", "answer": "Lima", "data_source": "nq"}),
    ];
    std::fs::write(&questions, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let vllm = ["--engine", "vllm", "--engine-url", &server.url, "--served-model", &server.served];
    let mut outputs = Vec::new();
    for (engine, flags) in [("embedded", &[][..]), ("vllm", &vllm[..])] {
        let (out, trajectories) = (dir.join(format!("{engine}.json")), dir.join(format!("{engine}.jsonl")));
        let eval = ["eval", "--data", questions.to_str().unwrap(), "--out", out.to_str().unwrap()];
        let args = [&eval[..], &["--trajectories", trajectories.to_str().unwrap()], flags].concat();
        kart(&args, model, &retriever).unwrap_or_else(|e| panic!("{engine}: {e}"));
        let figures: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let mut written: Vec<Value> = std::fs::read_to_string(&trajectories)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(written.len(), 2, "{engine}");
        // Written as they finish.
        written.sort_by_key(|t| t["prompt_id"].to_string());
        let infer = [&["infer", "Who wrote Hamlet?"][..], flags].concat();
        let shown = kart(&infer, model, &retriever).unwrap_or_else(|e| panic!("{engine}: {e}"));
        outputs.push((figures, written, shown));
    }
    let (embedded, vllm) = (&outputs[0], &outputs[1]);
    assert_eq!(embedded.0["all"], vllm.0["all"], "the figures");
    for (e, v) in embedded.1.iter().zip(&vllm.1) {
        for field in ["prompt_id", "token_ids", "loss_mask", "reward", "status"] {
            assert_eq!(e[field], v[field], "a trajectory's {field}");
        }
        let logprobs = |t: &Value| {
            t["logprobs"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect::<Vec<_>>()
        };
        for (a, b) in logprobs(e).iter().zip(logprobs(v)) {
            assert!((a - b).abs() <= LOGPROB_TOLERANCE, "a trajectory's logprobs: {a} and {b}");
        }
    }
    assert_eq!(embedded.2, vllm.2, "kart infer's turns");
    // vLLM serves the model under its name: another name reaches nothing (vLLM's 404).
    let other = [
        "infer",
        "Who wrote Hamlet?",
        "--engine",
        "vllm",
        "--engine-url",
        &server.url,
        "--served-model",
        "other",
    ];
    let shown = kart(&other, model, &retriever).unwrap();
    assert!(shown.contains("── answer: (none) · 0 turns, 0 tool calls, aborted ──"), "{shown}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qwen2_on_vllm_agrees_with_kart_and_transformers_in_generation_requests_eval_and_infer() {
    let model = serving_model("serve-qwen2");
    let server = Vllm::start(&model, &[]);
    engines_agree_on(&model, &server);
    requests_mean_the_same_on(&model, &server);
    eval_and_infer_agree(&model, &server);
}

#[test]
fn llama_on_vllm_agrees_with_kart_and_transformers_in_generation() {
    let model = serving_model("serve-llama");
    engines_agree_on(&model, &Vllm::start(&model, &[]));
}

#[test]
fn the_model_bench_times_generation_on_vllm_too() {
    let json = fresh_dir("kart-bench-vllm").join("report.json");
    let vllm_python = kart_tests::vllm::python();
    let (stdout, report) = kart_tests::report_of(
        Command::new(binary("kart"))
            .args(["bench", "model", "--quick", "--json"])
            .arg(&json)
            .arg("--vllm")
            .arg(&vllm_python),
        &json,
    );
    let vllm = &report["vllm"];
    assert!(vllm["version"].as_str().is_some_and(|v| v.starts_with("0.32")), "{vllm}");
    let rows = vllm["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 4], "{vllm}");
    for row in rows {
        for key in ["kart", "vllm", "ratio"] {
            assert!(row[key].as_f64().unwrap() > 0.0, "{row}");
        }
        assert!(row["identical_greedy"].as_u64().unwrap() <= row["batch"].as_u64().unwrap(), "{row}");
    }
    assert!(stdout.contains("generation against vLLM 0.32"), "{stdout}");
    kart_tests::log(&format!("kart bench model --quick against vLLM: {vllm}"));
}
