use super::*;
use flate2::Compression;
use flate2::write::GzEncoder;
use kart_core::chat::ChatMessage;
use serde_json::json;
use std::io::Write;
use std::process::Command;

fn user(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", content)]
}

fn write_lines(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn search_r1_row(source: &str, index: i64, question: &str, target: Value) -> Value {
    json!({
        "data_source": source,
        "prompt": [{"content": question, "role": "user"}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": target}, "style": "rule"},
        "extra_info": {"index": index, "split": "train"},
    })
}

#[test]
fn search_r1_parquet_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.parquet");
    let prompts = vec![
        Task {
            id: "ignored".into(),
            messages: Some(vec![
                ChatMessage::new("system", "Answer."),
                ChatMessage::new("user", "Who wrote Hamlet?"),
            ]),
            prompt: None,
            ground_truth: vec!["Shakespeare".into(), "William Shakespeare".into()],
            data_source: "nq".into(),
            tools: None,
        },
        Task {
            id: "ignored too".into(),
            messages: None,
            prompt: Some("Capital of Peru?".into()),
            ground_truth: vec!["Lima".into()],
            data_source: "synthetic".into(),
            tools: None,
        },
    ];
    let questions = vec!["Who wrote Hamlet".to_owned(), "Capital of Peru".to_owned()];
    write_search_r1(&path, &prompts, &questions, "fact-reasoning", "train").unwrap();
    assert!(
        write_search_r1(&path, &prompts, &questions[..1], "qa", "train").is_err(),
        "a question per prompt"
    );
    let read = Dataset::load(&path, DataFormat::Auto, false, 0).unwrap();
    assert_eq!(read.skipped, 0);
    assert_eq!(read.prompts[0], Task { id: "nq/0".into(), ..prompts[0].clone() });
    assert_eq!(
        read.prompts[1],
        Task {
            id: "synthetic/1".into(),
            messages: Some(user("Capital of Peru?")),
            prompt: None,
            ..prompts[1].clone()
        }
    );
    let nothing = Task { messages: None, prompt: None, ..prompts[0].clone() };
    let e = write_search_r1(&path, &[prompts[0].clone(), nothing], &questions, "qa", "train").unwrap_err();
    assert!(
        e.to_string().ends_with("row 1 (0-based): messages: a prompt needs `messages` or `prompt`"),
        "{e}"
    );
}

#[test]
fn merged_sources_reusing_indices_get_distinct_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_lines(
        dir.path(),
        "merged.jsonl",
        &[
            search_r1_row("nq", 0, "q0", json!(["a"])),
            search_r1_row("nq", 1, "q1", json!(["b"])),
            search_r1_row("hotpotqa", 0, "h0", json!("c")),
            search_r1_row("hotpotqa", 1, "h1", json!(["d"])),
            search_r1_row("nq", 0, "q0 again", json!(["e"])),
            search_r1_row("nq", 0, "q0 thrice", json!(["f"])),
        ],
    );
    let read = Dataset::load(&path, DataFormat::Auto, false, 0).unwrap();
    let ids: Vec<&str> = read.prompts.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["nq/0", "nq/1", "hotpotqa/0", "hotpotqa/1", "nq/0#1", "nq/0#2"]);
    assert_eq!(read.prompts[2].ground_truth, ["c"]);
    let mut ids = Ids::default();
    assert_eq!(ids.unique("x#1".into()), "x#1");
    assert_eq!(ids.unique("x".into()), "x");
    assert_eq!(ids.unique("x".into()), "x#2");
}

#[test]
fn asearcher_gzip_and_tir_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("asearcher.jsonl.gz");
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    for row in [
        json!({"id": "a-1", "question": "Q1", "answer": "A1", "source": "hotpotqa"}),
        json!({"id": 7, "question": "Q2", "answers": ["A2", "B2"]}),
        json!({"question": "Q3", "answer": "A3"}),
    ] {
        writeln!(gz, "{row}").unwrap();
    }
    std::fs::write(&path, gz.finish().unwrap()).unwrap();
    let read = Dataset::load(&path, DataFormat::Auto, false, 0).unwrap();
    let got: Vec<_> =
        read.prompts.iter().map(|p| (p.id.as_str(), p.prompt.as_deref(), p.ground_truth.len())).collect();
    assert_eq!(got, [("a-1", Some("Q1"), 1), ("7", Some("Q2"), 2), ("asearcher/2", Some("Q3"), 1)]);
    assert!(read.prompts.iter().all(|p| p.messages.is_none()));
    // ASearcher's `source` names the data source; rows without one are `asearcher`'s.
    let sources: Vec<_> = read.prompts.iter().map(|p| p.data_source.as_str()).collect();
    assert_eq!(sources, ["hotpotqa", "asearcher", "asearcher"]);

    let path = write_lines(
        dir.path(),
        "tir.jsonl",
        &[
            json!({"messages": [{"role": "user", "content": "1+1?"}], "answer": 2}),
            json!({"problem": "2*3?", "answer": "6", "data_source": "math"}),
        ],
    );
    let read = Dataset::load(&path, DataFormat::Auto, false, 0).unwrap();
    assert_eq!(
        read.prompts[0],
        Task {
            id: "tir/0".into(),
            messages: Some(user("1+1?")),
            prompt: None,
            ground_truth: vec!["2".into()],
            data_source: "tir".into(),
            tools: None,
        }
    );
    assert_eq!((read.prompts[1].id.as_str(), read.prompts[1].prompt.as_deref()), ("math/1", Some("2*3?")));
}

#[test]
fn bad_rows_fail_naming_file_row_and_field_or_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let good = json!({"id": 1, "question": "Q", "answer": "A"});
    let path = dir.path().join("qa.jsonl");
    let lines = [
        good.to_string(),
        "".into(),
        r#"{"id": 2, "question": "Q"}"#.into(),
        "{not json".into(),
        good.to_string(),
    ];
    std::fs::write(&path, lines.join("\n")).unwrap();
    let e = Dataset::load(&path, DataFormat::Asearcher, false, 0).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{}: row 2 (0-based): answer: missing (a row needs `answer` or `answers`)", path.display())
    );
    let read = Dataset::load(&path, DataFormat::Asearcher, true, 0).unwrap();
    assert_eq!(read.skipped, 2);
    // The repeated id 1 (row 4) is kept apart from row 0.
    assert_eq!(read.prompts.iter().map(|p| &p.id[..]).collect::<Vec<_>>(), ["1", "1#1"]);

    // A Search-R1 parquet file whose column has the wrong shape.
    let parquet = dir.path().join("bad.parquet");
    write_search_r1(
        &parquet,
        &[Task {
            id: String::new(),
            messages: None,
            prompt: Some("Q".into()),
            ground_truth: vec!["A".into()],
            data_source: "nq".into(),
            tools: None,
        }],
        &["Q".to_owned()],
        "qa",
        "test",
    )
    .unwrap();
    let e = Dataset::load(&parquet, DataFormat::Tir, false, 0).unwrap_err();
    assert!(
        e.to_string().ends_with("row 0 (0-based): answer: missing (a row needs `answer` or `answers`)"),
        "{e}"
    );
    let e = Dataset::load(&parquet, DataFormat::Tir, true, 0).unwrap_err();
    assert!(matches!(e, DataError::Empty { skipped: 1, .. }), "{e}");
    let e = Dataset::load(&dir.path().join("missing.parquet"), DataFormat::Auto, false, 0).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }), "{e}");
}

#[test]
fn max_prompts_truncates_and_config_selects_files() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<Value> = (0..5).map(|i| json!({"question": format!("Q{i}"), "answer": "A"})).collect();
    let train = write_lines(dir.path(), "train.jsonl", &rows);
    let config =
        DataConfig { train: train.clone(), test: Some(train), max_prompts: 3, ..DataConfig::default() };
    let read = Dataset::train(&config).unwrap();
    assert_eq!(
        read.prompts.iter().map(|p| p.prompt.as_deref().unwrap()).collect::<Vec<_>>(),
        ["Q0", "Q1", "Q2"]
    );
    assert_eq!(Dataset::test(&config, 0).unwrap().unwrap().prompts.len(), 5);
    assert_eq!(Dataset::test(&DataConfig { test: None, ..config }, 0).unwrap(), None);
}

#[test]
fn prompts_serialise_as_rollout_tasks() {
    let p = Task {
        id: "nq/3".into(),
        messages: None,
        prompt: Some("Q".into()),
        ground_truth: vec!["A".into()],
        data_source: "nq".into(),
        tools: None,
    };
    assert_eq!(
        serde_json::to_value(&p).unwrap(),
        json!({"id": "nq/3", "prompt": "Q", "ground_truth": ["A"], "data_source": "nq"})
    );
    let p = Task { messages: Some(user("Q")), prompt: None, ..p };
    assert_eq!(serde_json::to_value(&p).unwrap()["messages"], json!([{"role": "user", "content": "Q"}]));
}

/// Search-R1's data scripts write parquet with pandas/pyarrow (`nq_search.py`, then
/// `qa_search_train_merge.py` concatenating sources whose `extra_info.index` restart at 0); kart
/// reads those files, and pyarrow reads the files kart writes.
#[test]
fn parquet_interoperates_with_pandas_and_pyarrow() {
    let Some(python) = kart_testing::python() else {
        println!("skipped: no project venv (run scripts/setup.sh, or set KART_VENV)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let upstream = dir.path().join("upstream.parquet");
    let ours = dir.path().join("ours.parquet");
    write_search_r1(
        &ours,
        &[
            Task {
                id: String::new(),
                messages: Some(user("Who?")),
                prompt: None,
                ground_truth: vec!["Ann".into(), "Anne".into()],
                data_source: "nq".into(),
                tools: None,
            },
            Task {
                id: String::new(),
                messages: None,
                prompt: Some("Where?".into()),
                ground_truth: vec!["Oslo".into()],
                data_source: "hotpotqa".into(),
                tools: None,
            },
        ],
        &["who?".to_owned(), "where?".to_owned()],
        "fact-reasoning",
        "test",
    )
    .unwrap();
    let script = r#"
import json, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq

def source(name, rows, split):
    out = []
    for idx, (question, answers) in enumerate(rows):
        out.append({
            "id": f"{split}_{idx}", "question": question, "golden_answers": answers,
            "data_source": name,
            "prompt": [{"role": "user", "content": f"Answer: {question}?"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": np.array(answers, dtype=object)}},
            "extra_info": {"split": split, "index": idx},
        })
    return out

# As `datasets` writes them: pyarrow's inference over the rows (`string`, struct fields in
# insertion order).
merged = source("nq", [("who wrote hamlet", ["Shakespeare"]), ("capital of peru", ["Lima", "Lima, Peru"])], "train")
merged += source("hotpotqa", [("which is older", ["the oak"])], "train")
for row in merged:
    row["reward_model"]["ground_truth"]["target"] = list(row["reward_model"]["ground_truth"]["target"])
pq.write_table(pa.Table.from_pylist(merged), sys.argv[1])

table = pq.read_table(sys.argv[2])
upstream = pq.read_table(sys.argv[1])
joined = pa.concat_tables([upstream.select(table.column_names), table])
print(json.dumps({"schema": str(table.schema.remove_metadata()), "rows": table.to_pylist(),
                  "upstream_columns": upstream.column_names, "joined": joined.num_rows}))
"#;
    let out = Command::new(&python).arg("-c").arg(script).arg(&upstream).arg(&ours).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let read = Dataset::load(&upstream, DataFormat::Auto, false, 0).unwrap();
    let got: Vec<_> = read
        .prompts
        .iter()
        .map(|p| (p.id.as_str(), p.messages.as_ref().unwrap()[0].content.as_str(), p.ground_truth.join("|")))
        .collect();
    assert_eq!(
        got,
        [
            ("nq/0", "Answer: who wrote hamlet?", "Shakespeare".to_owned()),
            ("nq/1", "Answer: capital of peru?", "Lima|Lima, Peru".to_owned()),
            ("hotpotqa/0", "Answer: which is older?", "the oak".to_owned()),
        ]
    );

    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let schema = seen["schema"].as_str().unwrap();
    // nq_search.py's columns and struct field orders, so pyarrow joins kart's file to upstream's.
    let columns: Vec<&str> = schema.lines().collect();
    assert_eq!(
        columns,
        [
            "id: string",
            "question: string",
            "golden_answers: list<element: string>",
            "  child 0, element: string",
            "data_source: string",
            "prompt: list<element: struct<role: string, content: string>>",
            "  child 0, element: struct<role: string, content: string>",
            "      child 0, role: string",
            "      child 1, content: string",
            "ability: string",
            "reward_model: struct<style: string, ground_truth: struct<target: list<element: string>>>",
            "  child 0, style: string",
            "  child 1, ground_truth: struct<target: list<element: string>>",
            "      child 0, target: list<element: string>",
            "          child 0, element: string",
            "extra_info: struct<split: string, index: int64>",
            "  child 0, split: string",
            "  child 1, index: int64",
        ],
        "{schema}"
    );
    assert_eq!(
        seen["upstream_columns"],
        json!(
            columns
                .iter()
                .filter(|c| !c.starts_with(' '))
                .map(|c| c.split(':').next().unwrap())
                .collect::<Vec<_>>()
        )
    );
    assert_eq!(seen["joined"], 5, "pyarrow.concat_tables joins the two files");
    assert_eq!(
        seen["rows"][1],
        json!({
            "id": "",
            "question": "where?",
            "golden_answers": ["Oslo"],
            "data_source": "hotpotqa",
            "prompt": [{"role": "user", "content": "Where?"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Oslo"]}},
            "extra_info": {"split": "test", "index": 1},
        })
    );
    assert_eq!(seen["rows"][0]["reward_model"]["ground_truth"]["target"], json!(["Ann", "Anne"]));
}

#[test]
fn a_tools_column_offers_functions_as_a_list_or_json_text() {
    let dir = tempfile::tempdir().unwrap();
    let weather =
        json!({"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}});
    let mut row = search_r1_row("nq", 0, "Weather in Paris?", json!(["sunny"]));
    row["tools"] = json!([weather]);
    let mut as_text = json!({"question": "Q", "answer": "A"});
    as_text["tools"] = json!(json!([{"name": "calculator"}]).to_string());
    let read = |name: &str, row: &Value| {
        let path = write_lines(dir.path(), name, std::slice::from_ref(row));
        Dataset::load(&path, DataFormat::Auto, false, 0).map(|d| d.prompts[0].tools.clone())
    };
    assert_eq!(read("s.jsonl", &row).unwrap(), Some(vec![weather]));
    assert_eq!(read("q.jsonl", &as_text).unwrap(), Some(vec![json!({"name": "calculator"})]));
    let e = read("bad.jsonl", &json!({"question": "Q", "answer": "A", "tools": [{"type": "function"}]}));
    assert!(
        e.unwrap_err()
            .to_string()
            .ends_with("tools[0].function.name: missing (a function schema needs a name)")
    );
    let e = read("bad2.jsonl", &json!({"question": "Q", "answer": "A", "tools": "[{"}));
    assert!(e.unwrap_err().to_string().contains("tools: not a JSON list of functions"));
}
