//! `kart data search-r1`: FlashRAG questions to the Search-R1 parquet `nq_search.py` writes, as
//! pyarrow reads it, with the prompt of the conformance vectors, and read back by `kart train`'s
//! loader.

use kart_core::config::train::DataFormat;
use kart_tests::{binary, fresh_dir, shared_dir};
use kart_train::data::Dataset;
use serde_json::{Value, json};
use std::io::Write;
use std::process::Command;

/// The conformance vectors' `prompt` cases: raw question, expected prompt.
fn prompt_cases() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(shared_dir().join("conformance/search-r1/protocol.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "prompt")
        .map(|v| (v["question"].as_str().unwrap().to_owned(), v["expect"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn flashrag_questions_become_the_parquet_nq_search_writes() {
    let dir = fresh_dir("kart-data-search-r1");
    let cases = prompt_cases();
    assert!(cases.len() >= 20);
    let cases = &cases[..20];
    let input = dir.join("train.jsonl.gz");
    let mut gz =
        flate2::write::GzEncoder::new(std::fs::File::create(&input).unwrap(), flate2::Compression::fast());
    for (i, (question, _)) in cases.iter().enumerate() {
        let id = if i == 1 { json!(7) } else { json!(format!("train_{i}")) };
        writeln!(gz, "{}", json!({"id": id, "question": question, "golden_answers": [format!("a{i}"), "b"]}))
            .unwrap();
    }
    gz.finish().unwrap();
    let out = dir.join("train.parquet");
    let run = |input: &std::path::Path, out: &std::path::Path| {
        Command::new(binary("kart"))
            .args(["data", "search-r1", "--source", "nq", "--split", "train", "--input"])
            .arg(input)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let done = run(&input, &out);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));

    // kart's own loader: the prompts and golden answers, grouped by `nq/{index}`.
    let read = Dataset::load(&out, DataFormat::Auto, false, 0).unwrap();
    assert_eq!(read.prompts.len(), 20);
    for (i, (p, (_, expected))) in read.prompts.iter().zip(cases).enumerate() {
        assert_eq!(p.id, format!("nq/{i}"));
        assert_eq!(p.messages.as_ref().unwrap()[0].content, *expected, "the conformance prompt");
        assert_eq!(p.ground_truth, [format!("a{i}"), "b".into()]);
    }

    // As pyarrow reads it.
    if let Some(python) = kart_testing::python() {
        let script = "import json, sys, pyarrow.parquet as pq\nt = pq.read_table(sys.argv[1])\nprint(json.dumps({'columns': t.column_names, 'rows': t.slice(0, 2).to_pylist()}))";
        let output = Command::new(python).arg("-c").arg(script).arg(&out).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
        let columns = [
            "id",
            "question",
            "golden_answers",
            "data_source",
            "prompt",
            "ability",
            "reward_model",
            "extra_info",
        ];
        assert_eq!(seen["columns"], json!(columns));
        let question = cases[1].0.trim();
        let question = if question.ends_with('?') { question.to_owned() } else { format!("{question}?") };
        assert_eq!(
            seen["rows"][1],
            json!({"id": "7", "question": question, "golden_answers": ["a1", "b"], "data_source": "nq",
                   "prompt": [{"role": "user", "content": cases[1].1}], "ability": "fact-reasoning",
                   "reward_model": {"style": "rule", "ground_truth": {"target": ["a1", "b"]}},
                   "extra_info": {"split": "train", "index": 1}})
        );
    }

    // Merged with a second NQ file and a HotpotQA file: every column kept, keys unique.
    let more = dir.join("more.jsonl");
    std::fs::write(&more, "{\"id\": \"m0\", \"question\": \"Who?\", \"golden_answers\": [\"x\"]}\n").unwrap();
    let convert = |input: &std::path::Path, source: &str, out: &std::path::Path| {
        let done = Command::new(binary("kart"))
            .args(["data", "search-r1", "--split", "train", "--source", source, "--input"])
            .arg(input)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap();
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    };
    convert(&more, "nq", &dir.join("nq2.parquet"));
    convert(&more, "hotpotqa", &dir.join("hotpotqa.parquet"));
    let merged = dir.join("merged.parquet");
    let done = Command::new(binary("kart"))
        .args(["data", "merge", "--out"])
        .arg(&merged)
        .arg(&out)
        .arg(dir.join("nq2.parquet"))
        .arg(dir.join("hotpotqa.parquet"))
        .output()
        .unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let read = Dataset::load(&merged, DataFormat::Auto, false, 0).unwrap();
    let ids: Vec<&str> = read.prompts.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids.len(), 22);
    assert_eq!(
        (ids[19], ids[20], ids[21]),
        ("nq/19", "nq/20", "hotpotqa/0"),
        "the second NQ file goes on from 20"
    );
    assert_eq!(read.prompts[20].ground_truth, ["x"]);
    let refused = Command::new(binary("kart"))
        .args(["data", "merge", "--out"])
        .arg(dir.join("x.parquet"))
        .arg(&out)
        .arg(&input)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("train.jsonl.gz"),
        "a JSON-lines input is refused naming it: {stderr}"
    );

    // A bad row names its line and field, and writes nothing.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": \"q0\", \"question\": \"Who?\", \"golden_answers\": [\"x\"]}\n{\"id\": \"q1\", \"question\": \"Why?\"}\n").unwrap();
    let refused = run(&bad, &dir.join("bad.parquet"));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("row 1 (0-based): golden_answers: expected a list of strings, got nothing"),
        "{stderr}"
    );
    assert!(!dir.join("bad.parquet").exists());
}
