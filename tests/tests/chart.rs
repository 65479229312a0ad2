//! The Helm chart, Grafana dashboards, Prometheus rules and example resources of `charts/` and
//! `deploy/`: rendered and linted with Helm's own library, validated against the Kubernetes and CRD
//! schemas and the worker's config types, their PromQL parsed by promtool, every metric they use
//! checked against what running kart processes export (the operator among them, reconciling
//! against a real control plane), and the processes scraped by a real Prometheus server that also
//! evaluates the alerting rules and answers every dashboard panel's queries with data.

use kart_core::config::retriever::RetrieverConfig;
use kart_core::config::rollout::RolloutConfig;
use kart_core::config::train::TrainConfig;
use kart_operator::build::training_job::render_config;
use kart_operator::crd::TrainingJob;
use kart_tests::control_plane::{API_SECONDS, ControlPlane, Node};
use kart_tests::operator::Operator;
use kart_tests::{Child, binary, eventually, free_port, http, python, repo_root, shared_dir, wait_ready};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs a script of `tests/chart/` with the project venv's Python, failing with its output.
fn run_script(script: &str) -> Output {
    let root = repo_root();
    let output = Command::new(python())
        .arg(root.join("tests/chart").join(script))
        .arg(&root)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh)", python().display()));
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn chart_renders_lints_and_validates_for_each_option() {
    let output = run_script("chart.py");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(report.contains("defaults: ") && report.contains("everything, watched namespaces: "), "{report}");
}

#[test]
fn examples_match_the_crds_and_the_worker_configs() {
    let resources: Vec<Value> = serde_json::from_slice(&run_script("examples.py").stdout).unwrap();
    let label = |r: &Value| format!("{} {} {}", r["file"], r["kind"], r["name"]);
    let config = |r: &Value| -> Value {
        assert!(r["spec"]["config"].is_object(), "{}: no spec.config", label(r));
        r["spec"]["config"].clone()
    };
    let pool = |file: &Value, name: &Value| {
        let pool =
            resources.iter().find(|p| p["file"] == *file && p["kind"] == "RolloutPool" && p["name"] == *name);
        serde_json::from_value::<RolloutConfig>(config(pool.expect("the referenced RolloutPool"))).unwrap()
    };
    let mut kinds = BTreeSet::new();
    for r in &resources {
        let name = label(r);
        let fail = |e: &dyn std::fmt::Display| -> ! { panic!("{name}: spec.config: {e}") };
        match r["kind"].as_str().unwrap() {
            "Retriever" => {
                let _: RetrieverConfig = serde_json::from_value(config(r)).unwrap_or_else(|e| fail(&e));
            }
            "RolloutPool" => {
                let _: RolloutConfig = serde_json::from_value(config(r)).unwrap_or_else(|e| fail(&e));
            }
            "TrainingJob" => {
                let _: TrainConfig = serde_json::from_value(config(r)).unwrap_or_else(|e| fail(&e));
                // The config as the operator renders it from the resource (URLs filled in).
                let job = json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob",
                                 "metadata": {"name": r["name"]}, "spec": r["spec"]});
                let job: TrainingJob = serde_json::from_value(job).unwrap_or_else(|e| fail(&e));
                let train = render_config(&job);
                train.validate().unwrap_or_else(|e| fail(&e));
                let pool_name = &r["spec"]["rolloutPoolRef"];
                // The environment the trainer requests is the one its pool is configured for.
                assert_eq!(
                    train.rollout.env,
                    pool(&r["file"], pool_name).env,
                    "{name}: rollout.env differs from its RolloutPool's"
                );
            }
            other => panic!("{name}: unexpected kind {other}"),
        }
        kinds.insert(r["kind"].as_str().unwrap().to_string());
    }
    assert_eq!(kinds.len(), 3, "{kinds:?}");
}

/// Every dashboard's queries, by dashboard file and panel title.
fn dashboard_queries() -> Vec<(String, String, String)> {
    let mut queries = Vec::new();
    let dir = repo_root().join("deploy/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files.iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
        let board: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        for panel in board["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_else(|| panic!("{file}: a target without expr"));
                queries.push((file.clone(), panel["title"].as_str().unwrap().to_string(), expr.to_string()));
            }
        }
        for variable in board["templating"]["list"].as_array().unwrap() {
            if let Some(query) = variable["query"]["query"].as_str() {
                queries.push((file.clone(), format!("variable {}", variable["name"]), query.to_string()));
            }
        }
    }
    assert_eq!(files.len(), 4, "Training, Agent, Retriever and Operator dashboards: {files:?}");
    queries
}

/// A Grafana query as plain PromQL: interval variables become `5m`, others (label matchers) `.*`.
fn as_promql(expr: &str) -> String {
    let intervals = regex::Regex::new(r"\$__(rate_interval|interval|range)").unwrap();
    let variables = regex::Regex::new(r"\$\{?[a-z_]+\}?").unwrap();
    variables.replace_all(&intervals.replace_all(expr, "5m"), ".*").to_string()
}

fn promtool() -> Command {
    Command::new("promtool")
}

#[test]
fn promql_of_dashboards_and_rules_parses() {
    let dir = temp_dir("promql");
    let rules: Vec<Value> = dashboard_queries()
        .iter()
        .filter(|(_, panel, _)| !panel.starts_with("variable "))
        .enumerate()
        .map(|(i, (file, panel, expr))| {
            json!({"record": format!("dashboard_query_{i}"), "expr": as_promql(expr), "labels": {"file": file, "panel": panel}})
        })
        .collect();
    assert!(rules.len() >= 40, "{} dashboard queries", rules.len());
    let file = dir.join("dashboards.rules.json");
    std::fs::write(&file, json!({"groups": [{"name": "dashboards", "rules": rules}]}).to_string()).unwrap();
    for path in [file, repo_root().join("deploy/prometheus/rules.yaml")] {
        let out =
            promtool().args(["check", "rules"]).arg(&path).output().expect("promtool (run scripts/setup.sh)");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("SUCCESS"), "{}: {text}", path.display());
    }
    // promtool really parses: a broken query fails.
    let broken = dir.join("broken.rules.json");
    std::fs::write(
        &broken,
        json!({"groups": [{"name": "x", "rules": [{"record": "x", "expr": "sum(rate(kart_x[5m])"}]}]})
            .to_string(),
    )
    .unwrap();
    assert!(!promtool().args(["check", "rules"]).arg(&broken).output().unwrap().status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn alerts_fire_on_their_series_and_only_after_their_for() {
    let tests = repo_root().join("tests/chart/alerts.test.yaml");
    let out =
        promtool().args(["test", "rules"]).arg(&tests).output().expect("promtool (run scripts/setup.sh)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("SUCCESS"), "{text}");
    // Every alert of the rule file has a unit test.
    let rules = std::fs::read_to_string(repo_root().join("deploy/prometheus/rules.yaml")).unwrap();
    let cases = std::fs::read_to_string(&tests).unwrap();
    let alert = regex::Regex::new(r"alert(?:name)?: (Kart[A-Za-z]+)").unwrap();
    let names =
        |text: &str| -> BTreeSet<String> { alert.captures_iter(text).map(|c| c[1].to_string()).collect() };
    assert_eq!(names(&rules), names(&cases), "alerts without a unit test (or tests of no alert)");
}

/// Metric names a query or rule file uses (`_bucket`, `_sum` and `_count` series included as such).
fn metric_names(text: &str) -> BTreeSet<String> {
    let pattern = regex::Regex::new(r"\bkart_[a-z0-9_]+").unwrap();
    pattern.find_iter(text).map(|m| m.as_str().to_string()).collect()
}

/// Families a `/metrics` page declares (`# TYPE name type`), with their types.
fn families(page: &str) -> BTreeMap<String, String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// Whether `name` is a series of one of `families` (a histogram's `_bucket`, `_sum`, `_count`).
fn exported(name: &str, families: &BTreeMap<String, String>) -> bool {
    families.contains_key(name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix).and_then(|base| families.get(base)).is_some_and(|k| k == "histogram")
        })
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kart-chart-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Running kart processes on loopback, with traffic that exercises their metrics.
struct Kart {
    _children: Vec<Child>,
    /// The operator and the control plane it reconciles against.
    _operator: (Operator, ControlPlane),
    /// Each scraped process: its name and `/metrics` URL.
    targets: Vec<(&'static str, String)>,
}

fn spawn(command: &mut Command) -> Child {
    Child(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?}: {e}")),
    )
}

fn start_kart(dir: &Path) -> Kart {
    let kart = binary("kart");
    let corpus = dir.join("corpus.jsonl");
    let rows = [
        json!({"id": "0", "contents": "\"Hamlet\"\nHamlet is a tragedy written by William Shakespeare."}),
        json!({"id": "1", "contents": "\"Nile\"\nThe Nile is a major north-flowing river in Africa."}),
        json!({"id": "2", "contents": "\"Everest\"\nMount Everest is Earth's highest mountain."}),
    ];
    std::fs::write(&corpus, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let index = dir.join("index");
    let started = Instant::now();
    let status = Command::new(&kart)
        .args(["retriever", "index", "--method", "bm25", "--corpus"])
        .arg(&corpus)
        .arg("--out")
        .arg(&index)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    kart_tests::log_if_slow("indexing the chart test's corpus", started);

    let (retriever_port, sglang_port, rollout_port) = (free_port(), free_port(), free_port());
    let retriever_url = format!("http://127.0.0.1:{retriever_port}");
    let sglang_url = format!("http://127.0.0.1:{sglang_port}");
    let rollout_url = format!("http://127.0.0.1:{rollout_port}");
    // The page read below is of a loopback server, an internal address pages are not read from
    // unless allowed.
    let retriever_config = dir.join("retriever.json");
    std::fs::write(&retriever_config, json!({"online": {"allow_internal": ["127.0.0.1"]}}).to_string())
        .unwrap();
    let mut retriever = spawn(
        Command::new(&kart)
            .args(["retriever", "serve", "--config"])
            .arg(&retriever_config)
            .args(["--host", "127.0.0.1", "--port", &retriever_port.to_string(), "--index"])
            .arg(&index),
    );
    let model = shared_dir().join("fixtures/models/tiny-qwen2");
    let mut sglang = spawn(
        Command::new(python())
            .arg(repo_root().join("scripts/standins/sglang.py"))
            .arg(&model)
            .arg(sglang_port.to_string()),
    );
    let config = dir.join("rollout.json");
    let rollout_config = json!({
        "host": "127.0.0.1", "port": rollout_port, "model": model,
        "engine": {"kind": "sglang", "urls": [sglang_url]}, "retriever_url": retriever_url,
    });
    std::fs::write(&config, rollout_config.to_string()).unwrap();
    let mut rollout = spawn(Command::new(&kart).args(["rollout", "serve", "--config"]).arg(&config));
    // A worker with the embedded engine, whose weights are pushed once.
    let embedded_port = free_port();
    let embedded_url = format!("http://127.0.0.1:{embedded_port}");
    let embedded_config = dir.join("rollout-embedded.json");
    let config_json = json!({
        "host": "127.0.0.1", "port": embedded_port, "model": model,
        "engine": {"kind": "embedded"}, "retriever_url": retriever_url,
    });
    std::fs::write(&embedded_config, config_json.to_string()).unwrap();
    let mut embedded =
        spawn(Command::new(&kart).args(["rollout", "serve", "--config"]).arg(&embedded_config));
    let deadline = Duration::from_secs(300);
    wait_ready(&format!("{retriever_url}/readyz"), &mut retriever, deadline);
    wait_ready(&format!("{sglang_url}/health"), &mut sglang, deadline);
    wait_ready(&format!("{rollout_url}/readyz"), &mut rollout, deadline);
    wait_ready(&format!("{embedded_url}/readyz"), &mut embedded, deadline);

    let client = http();
    let traffic = Instant::now();
    let post = |url: String, body: Value| client.post(url).json(&body).send().unwrap();
    assert!(
        post(format!("{retriever_url}/retrieve"), json!({"queries": ["hamlet"], "topk": 2}))
            .status()
            .is_success()
    );
    assert_eq!(
        post(format!("{retriever_url}/retrieve"), json!({"queries": ["x"], "topk": -1})).status(),
        422
    );
    let page = post(format!("{retriever_url}/access"), json!({"urls": [format!("{sglang_url}/health")]}));
    assert!(page.status().is_success());
    let prompts: Vec<Value> = (0..2)
        .map(|i| json!({"id": format!("q{i}"), "prompt": "Who wrote Hamlet?", "ground_truth": ["William Shakespeare"], "data_source": "nq"}))
        .collect();
    let groups = post(format!("{rollout_url}/rollout"), json!({"prompts": prompts, "n": 2})).text().unwrap();
    let groups: Vec<Value> = groups.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(groups.len(), 2);
    assert!(groups.iter().all(|g| g["trajectories"][0]["reward"] == 1.0), "{groups:?}");
    let pushed = post(format!("{embedded_url}/weights"), json!({"version": 1, "path": model}));
    assert!(pushed.status().is_success(), "{}", pushed.text().unwrap());
    kart_tests::log_if_slow("the searches, rollouts and weight push of the chart test", traffic);

    // A trainer with its in-process pool on the fixture model, scraped once it has stepped.
    let trainer_port = free_port();
    let trainer_url = format!("http://127.0.0.1:{trainer_port}");
    let question = json!({"id": "q0", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}], "answer": "William Shakespeare"});
    std::fs::write(dir.join("questions.jsonl"), format!("{question}\n")).unwrap();
    let train_config = json!({
        "model": model, "output_dir": dir.join("train"), "total_steps": 1_000_000,
        "data": {"train": dir.join("questions.jsonl"), "test": dir.join("questions.jsonl")},
        "batch": {"prompts": 1, "n": 2, "mini_batch_prompts": 1, "micro_batch_size": 2},
        "rollout": {"retriever_url": retriever_url, "env": {"kind": "search-r1", "max_response_length": 8}},
        "checkpoint": {"every": 0}, "eval": {"every": 0, "sampled_n": 1}, "host": "127.0.0.1",
        "port": trainer_port,
    });
    std::fs::write(dir.join("train.json"), train_config.to_string()).unwrap();
    let mut trainer = spawn(Command::new(&kart).args(["train", "--config"]).arg(dir.join("train.json")));
    wait_ready(&format!("{trainer_url}/readyz"), &mut trainer, Duration::from_secs(300));
    eventually(600, "the trainer's first step", String::new, || {
        let status: Value = client.get(format!("{trainer_url}/status")).send().ok()?.json().ok()?;
        (status["step"].as_u64()? >= 1).then_some(())
    });

    let operator = start_operator(dir);
    let operator_url = format!("{}/metrics", operator.0.url);
    Kart {
        _children: vec![retriever, sglang, rollout, embedded, trainer],
        _operator: operator,
        targets: vec![
            ("retriever", format!("{retriever_url}/metrics")),
            ("rollout", format!("{rollout_url}/metrics")),
            ("rollout-embedded", format!("{embedded_url}/metrics")),
            ("trainer", format!("{trainer_url}/metrics")),
            ("operator", operator_url),
        ],
    }
}

/// `kart-operator` against a real control plane, once it has reconciled a Retriever (failing:
/// a ResourceQuota of no ConfigMaps makes the API server refuse its config, so the error counter
/// has a series) and a TrainingJob waiting for that Retriever.
fn start_operator(dir: &Path) -> (Operator, ControlPlane) {
    let cp = ControlPlane::up(&dir.join("control-plane"), Node::Absent).unwrap();
    cp.install_crds().unwrap();
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-configmaps", "namespace": "ml"},
         "spec": {"hard": {"count/configmaps": "0"}}},
        {"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever", "metadata": {"name": "web", "namespace": "ml"},
         "spec": {"config": {"method": "serper"}}},
        {"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "run", "namespace": "ml"},
         "spec": {"retrieverRef": "web",
                  "config": {"model": "/models/qwen", "data": {"train": "/data/train.parquet"}, "total_steps": 5}}},
    ]});
    let path = dir.join("objects.json");
    std::fs::write(&path, objects.to_string()).unwrap();
    cp.run_kubectl(&["apply", "-f", &path.display().to_string()]).unwrap();
    let args = ["--namespace", "ml", "--lease-namespace", "ml", "--status-poll-seconds", "10"];
    let operator =
        Operator::start(&cp.kubeconfig, "kart-operator-0", &dir.join("operator.log"), &args).unwrap();
    let client = http();
    let url = format!("{}/metrics", operator.url);
    eventually(API_SECONDS, "the operator's metrics of both reconcilers", String::new, || {
        let page = client.get(&url).send().ok()?.text().ok()?;
        let seen = [
            r#"kart_operator_reconcile_errors_total{controller="retriever",reason="api"}"#,
            r#"kart_operator_training_jobs{phase="WaitingForDependencies"} 1"#,
        ];
        seen.iter().all(|s| page.contains(s)).then_some(())
    });
    (operator, cp)
}

#[test]
fn dashboards_and_alerts_use_only_metrics_kart_exports() {
    let dir = temp_dir("metrics");
    let kart = start_kart(&dir);
    let client = http();
    let mut all = BTreeMap::new();
    for (name, url) in &kart.targets {
        let page = client.get(url).send().unwrap().text().unwrap();
        let found = families(&page);
        assert!(!found.is_empty(), "{name}: no metrics at {url}");
        all.extend(found);
    }

    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, panel, expr) in dashboard_queries() {
        for name in metric_names(&expr) {
            used.entry(name).or_default().insert(format!("{file}: {panel}"));
        }
    }
    let rules = std::fs::read_to_string(repo_root().join("deploy/prometheus/rules.yaml")).unwrap();
    for name in metric_names(&rules) {
        used.entry(name).or_default().insert("deploy/prometheus/rules.yaml".into());
    }
    let missing: Vec<_> = used.iter().filter(|(name, _)| !exported(name, &all)).collect();
    assert!(missing.is_empty(), "dashboards and alerts use metrics no kart process exports: {missing:#?}");
    // Every retriever, rollout and operator metric of the metrics table is in the scrape (the
    // traffic of start_kart reaches them all), so the check above saw every metric of those
    // processes.
    let readme = std::fs::read_to_string(repo_root().join("docs/src/reference/metrics.md")).unwrap();
    let documented =
        regex::Regex::new(r"(?m)^\| `(kart_(?:retriever|rollout|operator)_[a-z0-9_]+)`").unwrap();
    let unseen: Vec<_> = documented
        .captures_iter(&readme)
        .map(|c| c[1].to_string())
        .filter(|n| !all.contains_key(n))
        .collect();
    assert!(unseen.is_empty(), "not in the scrape: {unseen:?}; make start_kart exercise them");
    let used_exported = used.keys().filter(|n| exported(n, &all)).count();
    assert!(used_exported >= 15, "only {used_exported} used metrics were checked against a scrape");
    drop(kart);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The result of `query`, or `None` while Prometheus does not answer (a poll asks again).
fn prometheus_query(client: &reqwest::blocking::Client, base: &str, query: &str) -> Option<Vec<Value>> {
    let url = reqwest::Url::parse_with_params(&format!("{base}/api/v1/query"), [("query", query)]).unwrap();
    let answer: Value = client.get(url).send().ok()?.json().ok()?;
    assert_eq!(answer["status"], "success", "{query}: {answer}");
    Some(answer["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// A dashboard: its query variables in order (name, `label_values` query, `allValue`) and its
/// panels (title, target expressions).
struct Board {
    file: String,
    variables: Vec<(String, String, String)>,
    panels: Vec<(String, Vec<String>)>,
}

fn boards() -> Vec<Board> {
    let dir = repo_root().join("deploy/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let board: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let variables = board["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| {
                    let query = v["query"]["query"].as_str()?;
                    let all = v["allValue"].as_str().unwrap_or(".*");
                    Some((v["name"].as_str().unwrap().to_string(), query.to_string(), all.to_string()))
                })
                .collect();
            let panels = board["panels"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|p| {
                    let exprs: Vec<String> = p["targets"]
                        .as_array()?
                        .iter()
                        .map(|t| t["expr"].as_str().unwrap().to_string())
                        .collect();
                    Some((p["title"].as_str().unwrap().to_string(), exprs))
                })
                .collect();
            Board { file: path.file_name().unwrap().to_string_lossy().into(), variables, panels }
        })
        .collect()
}

/// How a dashboard's variables are set: `All` (their `allValue`) or each one's first value.
#[derive(Debug, Clone, Copy)]
enum Choice {
    All,
    First,
}

/// The variables' values for `choice`, each `label_values(SELECTOR, LABEL)` query asked of
/// Prometheus's label values API as Grafana asks it (the earlier variables substituted).
fn variables(
    client: &reqwest::blocking::Client,
    base: &str,
    board: &Board,
    choice: Choice,
) -> BTreeMap<String, String> {
    let pattern = regex::Regex::new(r"^label_values\((.*),\s*([A-Za-z_]+)\)$").unwrap();
    let mut values = BTreeMap::new();
    for (name, query, all) in &board.variables {
        let query = grafana_substitute(query, &values);
        let parts =
            pattern.captures(&query).unwrap_or_else(|| panic!("{}: variable {name}: {query}", board.file));
        let url = format!("{base}/api/v1/label/{}/values", &parts[2]);
        let url = reqwest::Url::parse_with_params(&url, [("match[]", &parts[1])]).unwrap();
        let found: Vec<String> =
            eventually(300, &format!("{}: values of ${name}", board.file), String::new, || {
                let answer: Value = client.get(url.clone()).send().ok()?.json().ok()?;
                let found: Vec<String> = answer["data"]
                    .as_array()?
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect();
                (!found.is_empty()).then_some(found)
            });
        let value = match choice {
            Choice::All => all.clone(),
            Choice::First => found[0].clone(),
        };
        values.insert(name.clone(), value);
    }
    values
}

/// `expr` with Grafana's variables in place: the dashboard's own from `values`, and the interval
/// variables as Grafana sets them for a 5-minute range scraped every 15 s.
fn grafana_substitute(expr: &str, values: &BTreeMap<String, String>) -> String {
    let mut out =
        expr.replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("$__range", "5m");
    for (name, value) in values {
        out = out.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
    }
    out
}

#[test]
fn prometheus_scrapes_kart_evaluates_the_alerts_and_fills_every_panel() {
    let dir = temp_dir("prometheus");
    let kart = start_kart(&dir);
    let scrape_configs: Vec<Value> = kart
        .targets
        .iter()
        .map(|(name, url)| {
            let url = reqwest::Url::parse(url).unwrap();
            // The labels the chart's PodMonitors and ServiceMonitor give a pod's series in a
            // cluster: its namespace, and its custom resource as the instance.
            let namespace = if *name == "operator" { "kart-system" } else { "ml" };
            let labels = json!({"namespace": namespace, "app_kubernetes_io_instance": format!("test-{name}")});
            json!({"job_name": format!("kart-{name}"), "metrics_path": url.path(),
                   "static_configs": [{"targets": [format!("127.0.0.1:{}", url.port().unwrap())], "labels": labels}]})
        })
        .collect();
    let config = json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [repo_root().join("deploy/prometheus/rules.yaml")],
        "scrape_configs": scrape_configs,
    });
    std::fs::write(dir.join("prometheus.json"), config.to_string()).unwrap();
    let port = free_port();
    let mut prometheus = spawn(
        Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.json").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}")),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{base}/-/ready"), &mut prometheus, Duration::from_secs(300));

    let client = http();
    let seconds = 300;
    // A retriever metric, a rollout metric and a training metric, as scraped.
    let documents = eventually(seconds, "kart_retriever_documents scraped", String::new, || {
        prometheus_query(&client, &base, r#"kart_retriever_documents{job="kart-retriever"}"#)?.pop()
    });
    assert_eq!(documents["value"][1], "3", "{documents}");
    let searches = eventually(seconds, "kart_rollout_tool_calls_total scraped", String::new, || {
        prometheus_query(
            &client,
            &base,
            r#"sum(kart_rollout_tool_calls_total{tool="search", outcome="ok"})"#,
        )?
        .pop()
    });
    assert_eq!(searches["value"][1], "4", "{searches}");
    let steps = eventually(seconds, "kart_trainer_step scraped", String::new, || {
        prometheus_query(&client, &base, r#"kart_trainer_step{job="kart-trainer"} >= 1"#)?.pop()
    });
    assert!(steps["value"][1].as_str().unwrap().parse::<f64>().unwrap() >= 1.0, "{steps}");
    // And the operator's.
    let waiting = eventually(seconds, "kart_operator_training_jobs scraped", String::new, || {
        let query = r#"kart_operator_training_jobs{job="kart-operator", phase="WaitingForDependencies"}"#;
        prometheus_query(&client, &base, query)?.pop()
    });
    assert_eq!(waiting["value"][1], "1", "{waiting}");

    // Every alerting rule loads and evaluates without error against the scraped series.
    let rules: Vec<Value> = eventually(seconds, "every rule evaluated", String::new, || {
        let answer: Value = client.get(format!("{base}/api/v1/rules")).send().ok()?.json().ok()?;
        let rules: Vec<Value> = answer["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.iter().all(|r| r["health"] != "unknown");
        (!rules.is_empty() && evaluated).then_some(rules)
    });
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
        assert_eq!(rule["type"], "alerting", "{rule}");
    }
    assert!(rules.len() >= 5, "{rules:?}");

    // Every panel of every dashboard has data, its variables chosen as a user chooses them: all
    // of them, or the first value of each.
    let mut pending = Vec::new();
    for board in boards() {
        for choice in [Choice::All, Choice::First] {
            let values = variables(&client, &base, &board, choice);
            for (panel, exprs) in &board.panels {
                for query in exprs.iter().map(|e| grafana_substitute(e, &values)) {
                    pending.push((format!("{}: panel {panel:?} ({choice:?}): {query}", board.file), query));
                }
            }
        }
    }
    let checked = pending.len();
    assert!(checked >= 120, "{checked} panel queries");
    // Asked again until each has data (the rates need two scrapes in their window), then every
    // query still without is named.
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        pending.retain(|(_, query)| prometheus_query(&client, &base, query).is_none_or(|r| r.is_empty()));
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let missing: Vec<&String> = pending.iter().map(|(what, _)| what).collect();
    assert!(missing.is_empty(), "panels without data after {seconds} s: {missing:#?}");
    drop(prometheus);
    drop(kart);
    std::fs::remove_dir_all(&dir).unwrap();
}
