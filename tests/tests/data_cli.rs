//! `kart data`: FlashRAG questions to the Search-R1 parquet `nq_search.py` writes (as pyarrow
//! reads it, with the prompt of the conformance vectors) and to ASearcher's JSON lines (as
//! ASearcher's readers take them), verl math rows to AReaL's TIR rows, merges, each read back by
//! `kart train`'s loader.

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

/// `kart data …` with `args`, its stderr when it fails.
fn kart_data(args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let done = Command::new(binary("kart")).arg("data").args(args).output().unwrap();
    match done.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&done.stderr).into_owned()),
    }
}

/// The schema pyarrow's JSON reader infers for `file`, its fields joined by ", ".
fn json_schema(python: &std::path::Path, file: &std::path::Path) -> String {
    let script = "import sys, pyarrow.json as pj\nt = pj.read_json(sys.argv[1])\nprint(', '.join(f'{f.name}: {f.type}' for f in t.schema))";
    let output = Command::new(python).arg("-c").arg(script).arg(file).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn lines(file: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn flashrag_questions_become_asearcher_rows_and_merge_with_unique_ids() {
    let dir = fresh_dir("kart-data-asearcher");
    let input = dir.join("dev.jsonl");
    let rows = [
        json!({"id": "dev_0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare", "W. Shakespeare"]}),
        json!({"id": 1, "question": "Where is Ferhax?", "golden_answers": "Trinvov"}),
    ];
    std::fs::write(&input, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let (hotpot, nq) = (dir.join("hotpotqa.jsonl"), dir.join("nq.jsonl"));
    for (source, out) in [("hotpotqa", &hotpot), ("nq", &nq)] {
        let args = ["asearcher", "--source", source, "--input"].map(std::ffi::OsStr::new);
        kart_data(&[&args[..], &[input.as_os_str(), "--out".as_ref(), out.as_os_str()]].concat()).unwrap();
    }
    // ASearcher-Base-35k's keys in its order, the question as written (the template adds the rest).
    let written = lines(&hotpot);
    assert_eq!(
        serde_json::to_string(&written[0]).unwrap(),
        r#"{"question":"who wrote hamlet","answer":["Shakespeare","W. Shakespeare"],"source":"hotpotqa","qid":"dev_0"}"#
    );
    assert_eq!(written[1]["answer"], json!(["Trinvov"]));
    assert_eq!(written[1]["qid"], json!("1"));
    let read = Dataset::load(&hotpot, DataFormat::Auto, false, 0).unwrap();
    let seen: Vec<_> =
        read.prompts.iter().map(|p| (&p.id[..], &p.data_source[..], p.prompt.as_deref())).collect();
    assert_eq!(
        seen,
        [("dev_0", "hotpotqa", Some("who wrote hamlet")), ("1", "hotpotqa", Some("Where is Ferhax?"))]
    );

    // ASearcher's own readers: the workflow's id lookup, `load_metadata`'s and the evaluation's.
    if let Some(python) = kart_testing::python() {
        let script = r#"
import json, sys
data = [json.loads(l) for l in open(sys.argv[1])]
for d in data:
    qid = None
    for key in ["query_id", "id", "qid"]:
        qid = d.get(key, None)
        if qid is not None:
            break
    assert qid is not None, d
    idx = str(d["idx"]) if "idx" in d else str(d["qid"]) if "qid" in d else str(d["id"])
    assert str(qid) == idx, d
    gt = d["answer"]
    assert isinstance(gt, list) and all(isinstance(a, str) for a in gt), d
    assert isinstance(d["question"], str), d
print(len(data))
"#;
        let output = Command::new(&python).arg("-c").arg(script).arg(&hotpot).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "2");
        // The column types as pyarrow reads the file (as `datasets.load_dataset("json")` does).
        assert_eq!(
            json_schema(&python, &hotpot),
            "question: string, answer: list<item: string>, source: string, qid: string"
        );
    }

    // Merged: the second file's ids are taken, so they get suffixes; kart's groups stay apart.
    let merged = dir.join("merged.jsonl");
    kart_data(&["merge".as_ref(), "--out".as_ref(), merged.as_os_str(), hotpot.as_os_str(), nq.as_os_str()])
        .unwrap();
    let qids: Vec<Value> = lines(&merged).iter().map(|r| r["qid"].clone()).collect();
    assert_eq!(qids, [json!("dev_0"), json!("1"), json!("dev_0#1"), json!("1#1")]);
    let read = Dataset::load(&merged, DataFormat::Auto, false, 0).unwrap();
    let sources: Vec<_> = read.prompts.iter().map(|p| (&p.id[..], &p.data_source[..])).collect();
    assert_eq!(sources, [("dev_0", "hotpotqa"), ("1", "hotpotqa"), ("dev_0#1", "nq"), ("1#1", "nq")]);

    // Files of two formats are not merged, and nothing is written.
    let tir = dir.join("tir.jsonl");
    std::fs::write(&tir, "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1\"}], \"answer\": \"2\"}\n")
        .unwrap();
    let refused = dir.join("refused.jsonl");
    let stderr = kart_data(&[
        "merge".as_ref(),
        "--out".as_ref(),
        refused.as_os_str(),
        hotpot.as_os_str(),
        tir.as_os_str(),
    ])
    .unwrap_err();
    assert!(stderr.contains("tir.jsonl") && stderr.contains("Tir rows"), "{stderr}");
    assert!(!refused.exists());
}

#[test]
fn verl_math_rows_become_the_tir_rows_areal_trains_on() {
    let dir = fresh_dir("kart-data-tir");
    let prompt = |q: &str| json!([{"role": "user", "content": q}]);
    // verl's GSM8K preprocessing writes a number-like string; a bare number is accepted too.
    let rows = [
        json!({"data_source": "openai/gsm8k", "prompt": prompt("What is 15 + 27?"), "ability": "math",
               "reward_model": {"style": "rule", "ground_truth": "42"}, "extra_info": {"split": "train", "index": 0}}),
        json!({"data_source": "openai/gsm8k", "prompt": prompt("What is 2 * 3?"), "ability": "math",
               "reward_model": {"style": "rule", "ground_truth": 6}, "extra_info": {"split": "train", "index": 1}}),
    ];
    let input = dir.join("gsm8k.jsonl");
    std::fs::write(&input, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let out = dir.join("tir.jsonl");
    kart_data(&["tir".as_ref(), "--input".as_ref(), input.as_os_str(), "--out".as_ref(), out.as_os_str()])
        .unwrap();
    let written = lines(&out);
    // As `torl_data.py` maps a row: the other columns first, then `messages` and `answer`.
    assert_eq!(
        serde_json::to_string(&written[0]).unwrap(),
        r#"{"data_source":"openai/gsm8k","ability":"math","extra_info":{"split":"train","index":0},"messages":[{"role":"user","content":"What is 15 + 27?"}],"answer":"\\boxed{42}"}"#
    );
    assert_eq!(written[1]["answer"], "\\boxed{6}");
    let read = Dataset::load(&out, DataFormat::Auto, false, 0).unwrap();
    assert_eq!(read.prompts[1].ground_truth, ["\\boxed{6}"]);
    assert_eq!(read.prompts[1].data_source, "openai/gsm8k");
    // kart's math reward reads the boxed gold as AReaL's parser does.
    assert_eq!(kart_core::reward::math::score("so \\boxed{6}", &read.prompts[1].ground_truth[0]), 1.0);

    // ToRL's own container: parquet as pyarrow writes it.
    if let Some(python) = kart_testing::python() {
        assert_eq!(
            json_schema(&python, &out),
            "data_source: string, ability: string, extra_info: struct<split: string, index: int64>, \
             messages: list<item: struct<role: string, content: string>>, answer: string"
        );
        let parquet = dir.join("torl.parquet");
        let script = r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
rows = [{"data_source": "torl", "prompt": [{"content": "Find x if 2x = 10.", "role": "user"}], "ability": "math",
         "reward_model": {"ground_truth": "5", "style": "rule"}, "extra_info": {"index": 3, "split": "train"}}]
pq.write_table(pa.Table.from_pylist(rows), sys.argv[1])
"#;
        let output = Command::new(python).arg("-c").arg(script).arg(&parquet).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let from_parquet = dir.join("torl.jsonl");
        kart_data(&[
            "tir".as_ref(),
            "--input".as_ref(),
            parquet.as_os_str(),
            "--out".as_ref(),
            from_parquet.as_os_str(),
        ])
        .unwrap();
        assert_eq!(
            lines(&from_parquet)[0],
            json!({"data_source": "torl", "ability": "math", "extra_info": {"index": 3, "split": "train"},
                   "messages": [{"content": "Find x if 2x = 10.", "role": "user"}], "answer": "\\boxed{5}"})
        );
    }

    // A Search-R1 row (a list of targets) is not a math row: named by row and field, nothing written.
    let search = dir.join("search.jsonl");
    let row = json!({"data_source": "nq", "prompt": prompt("Who?"), "reward_model": {"ground_truth": {"target": ["x"]}}});
    std::fs::write(&search, format!("{}\n{row}\n", rows[0])).unwrap();
    let refused = dir.join("refused.jsonl");
    let stderr = kart_data(&[
        "tir".as_ref(),
        "--input".as_ref(),
        search.as_os_str(),
        "--out".as_ref(),
        refused.as_os_str(),
    ])
    .unwrap_err();
    assert!(
        stderr.contains(
            "row 1 (0-based): reward_model.ground_truth: expected a string or a number, got an object"
        ),
        "{stderr}"
    );
    assert!(!refused.exists());
}
