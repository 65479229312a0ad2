//! `kart retriever index` + `kart retriever serve` as Search-R1's training code uses them.

use kart_core::agent::search_r1::{RetrievalResult, passages_to_string};
use kart_tests::{Child, binary, free_port, wait_ready};
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `kart retriever serve` on loopback with `args`, once ready: the server and its base URL.
fn serve(args: &[&std::ffi::OsStr]) -> (Child, String) {
    let port = free_port();
    let mut server = Child(
        Command::new(binary("kart"))
            .args(["retriever", "serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{base}/readyz"), &mut server, Duration::from_secs(300));
    (server, base)
}

fn corpus(dir: &std::path::Path) -> std::path::PathBuf {
    let rows = [
        json!({"id": "0", "contents": "\"Eiffel Tower\"\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
               "url": "https://en.wikipedia.org/wiki/Eiffel_Tower", "wikipedia_id": 9232}),
        json!({"id": "1", "contents": "\"Colosseum\"\nThe Colosseum is an ancient amphitheatre in the centre of Rome."}),
        json!({"id": 2, "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."}),
        json!({"id": "3", "contents": "\"Mount Everest\"\nMount Everest is Earth's highest mountain above sea level."}),
        json!({"id": "4", "contents": "\"Nile\"\nThe Nile is a major north-flowing river in northeastern Africa."}),
    ];
    let path = dir.join("corpus.jsonl");
    std::fs::write(&path, rows.iter().map(|r| r.to_string() + "\n").collect::<String>()).unwrap();
    path
}

#[test]
fn search_r1_client_payload_works_unchanged() {
    let dir = std::env::temp_dir().join(format!("kart-retriever-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let index = dir.join("index");
    let report = dir.join("termination-log");
    let status = Command::new(binary("kart"))
        .args(["retriever", "index", "--method", "bm25", "--corpus"])
        .arg(corpus(&dir))
        .arg("--out")
        .arg(&index)
        .env("KART_STATUS_FILE", &report)
        .status()
        .unwrap();
    assert!(status.success());
    // The report the operator reads into the Retriever's status.
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report, json!({"documents": 5, "method": "bm25"}));

    // ASearcher's local pages, keyed by url.
    let pages = dir.join("pages.jsonl");
    let page = json!({"url": "https://en.wikipedia.org/w/index.php?title=Eiffel%20Tower",
                      "contents": "The Eiffel Tower is a lattice tower.", "title": "Eiffel Tower"});
    std::fs::write(&pages, format!("{page}\n")).unwrap();
    let (_server, base) =
        serve(&["--index".as_ref(), index.as_os_str(), "--pages".as_ref(), pages.as_os_str()]);

    // Exactly what Search-R1's generation.py `_batch_search` posts, then `_passages2string`.
    let client = kart_tests::http();
    let payload = json!({"queries": ["who wrote hamlet", "tallest mountain on earth"], "topk": 3, "return_scores": true});
    let response: Value =
        client.post(format!("{base}/retrieve")).json(&payload).send().unwrap().json().unwrap();
    let results: Vec<Vec<RetrievalResult>> = serde_json::from_value(response["result"].clone()).unwrap();
    assert_eq!(results.len(), 2);
    let first = passages_to_string(&results[0]);
    assert!(
        first.starts_with("Doc 1(Title: \"Hamlet\") Hamlet is a tragedy written by William Shakespeare.\n"),
        "{first}"
    );
    assert!(passages_to_string(&results[1]).starts_with("Doc 1(Title: \"Mount Everest\")"));
    assert!(results[0].len() <= 3 && results[0][0].score > 0.0);

    // The no-search turn of Search-R1 posts an empty list.
    let empty: Value = client
        .post(format!("{base}/retrieve"))
        .json(&json!({"queries": [], "topk": 3, "return_scores": true}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(empty, json!({"result": []}));

    // ASearcher's client: documents without scores, each row's own `url` read beside `contents`.
    let asearcher: Value = client
        .post(format!("{base}/retrieve"))
        .json(&json!({"queries": ["Eiffel Tower Paris"], "topk": 1, "return_scores": false}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let doc = &asearcher["result"][0][0];
    assert_eq!(
        (
            &doc["url"],
            &doc["wikipedia_id"],
            doc["contents"].as_str().map(|c| c.starts_with("\"Eiffel Tower\""))
        ),
        (&json!("https://en.wikipedia.org/wiki/Eiffel_Tower"), &json!(9232), Some(true)),
        "{asearcher}"
    );

    // ASearcher's client reads `contents` of each `/access` result, a missing page being null;
    // kart's own reads `page`.
    let urls =
        ["https://en.wikipedia.org/w/index.php/Eiffel%20Tower", "https://en.wikipedia.org/wiki/Nowhere"];
    let access: Value =
        client.post(format!("{base}/access")).json(&json!({"urls": urls})).send().unwrap().json().unwrap();
    let mut expected = page.clone();
    expected["page"] = page["contents"].clone();
    assert_eq!(access, json!({"result": [expected, null]}));

    // `topk: 0` is the server's default, as Search-R1's server reads it.
    let default: Value = client
        .post(format!("{base}/retrieve"))
        .json(&json!({"queries": ["Hamlet Everest Nile Colosseum"], "topk": 0}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(default["result"][0].as_array().unwrap().len(), 3, "4 match, 3 by default: {default}");

    // Bad input: a 4xx naming the field, and the server keeps serving.
    let bad =
        client.post(format!("{base}/retrieve")).json(&json!({"queries": ["x"], "topk": -1})).send().unwrap();
    assert_eq!(bad.status().as_u16(), 422);
    assert_eq!(bad.json::<Value>().unwrap()["error"]["field"], "topk");
    let metrics = client.get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    assert!(metrics.contains("kart_retriever_queries_total"), "{metrics}");
    assert!(metrics.contains("kart_retriever_documents 5"), "{metrics}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kart retriever index --method dense --ann hnsw`: the embeddings, then the approximate graph
/// over them, served through the same `/retrieve`; run again, the embeddings are reused.
#[test]
fn a_dense_index_with_an_approximate_graph_serves_the_same_api() {
    let Some(model) = kart_testing::minilm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index");
    let build = || {
        Command::new(binary("kart"))
            .args(["retriever", "index", "--method", "dense", "--ann", "hnsw", "--ann-quantization", "i8"])
            .arg("--corpus")
            .arg(corpus(dir.path()))
            .arg("--encoder")
            .arg(&model)
            .arg("--out")
            .arg(&index)
            .output()
            .unwrap()
    };
    let first = build();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(index.join("kart-index.json")).unwrap()).unwrap();
    assert_eq!(manifest["ann"], json!({"connectivity": 32, "expansion_add": 128, "quantization": "i8"}));
    assert!(index.join("ann.usearch").exists());
    let again = build();
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("reusing the embeddings"), "{again:?}");

    let dense = ["--method", "dense", "--ann-expansion-search", "16", "--index"].map(std::ffi::OsStr::new);
    let (_server, base) = serve(&[&dense[..], &[index.as_os_str()]].concat());
    let payload =
        json!({"queries": ["who wrote hamlet", "longest river in africa"], "topk": 2, "return_scores": true});
    let response: Value =
        kart_tests::http().post(format!("{base}/retrieve")).json(&payload).send().unwrap().json().unwrap();
    let results: Vec<Vec<RetrievalResult>> = serde_json::from_value(response["result"].clone()).unwrap();
    assert!(passages_to_string(&results[0]).starts_with("Doc 1(Title: \"Hamlet\")"), "{response}");
    assert!(passages_to_string(&results[1]).starts_with("Doc 1(Title: \"Nile\")"), "{response}");
    assert!(results.iter().all(|r| r.len() == 2 && r[0].score >= r[1].score));

    // A graph is built over embeddings: with BM25 the flag is refused by name.
    let bm25 = Command::new(binary("kart"))
        .args(["retriever", "index", "--method", "bm25", "--ann", "hnsw", "--corpus"])
        .arg(corpus(dir.path()))
        .arg("--out")
        .arg(dir.path().join("bm25"))
        .output()
        .unwrap();
    assert!(!bm25.status.success());
    assert!(String::from_utf8_lossy(&bm25.stderr).contains("--ann"), "{bm25:?}");
}
