//! `kart local` end to end on a small world: every promised output lands in the output folder and
//! the summary reports the before/after figures.

use kart_tests::binary;
use serde_json::{Value, json};
use std::process::Command;

#[test]
fn help_exposes_world_model_steps_algorithm_seed_and_output() {
    let out = Command::new(binary("kart")).args(["local", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--persons",
        "--rl-questions",
        "--hidden",
        "--layers",
        "--copy-drills",
        "--fact-drills",
        "--warm-steps",
        "--probe-rounds",
        "--dynamic-sampling",
        "--env",
        "--steps",
        "--algorithm",
        "--seed",
        "--out",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn small_run_writes_model_chart_metrics_and_summary() {
    let dir = std::env::temp_dir().join(format!("kart-local-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |extra: &[&str]| {
        Command::new(binary("kart"))
            .args(["local", "--persons", "400", "--rl-questions", "20", "--hidden", "32", "--layers", "1"])
            .args(["--vocab", "600"])
            .args(["--copy-drills", "3", "--fact-drills", "2", "--warm-steps", "6", "--warm-batch", "4"])
            .args(["--fact-drill-every", "2", "--steps", "2", "--prompts", "2", "--n", "2"])
            .args(["--eval-questions", "8", "--seed", "5"])
            // A model this small earns no reward: with dynamic sampling every group would be dropped.
            .args(["--dynamic-sampling", "false"])
            .args(extra)
            .arg("--out")
            .arg(&dir)
            .output()
            .unwrap()
    };
    // The first run reads its 6 x 4 gold trajectories from three draws of the warm-start facts,
    // each with its own index (the second and third under world/draws/); with the default, one
    // per pass over the questions, the 6 + 2 x 1 updates' 32 (extra rounds included) are one draw.
    let first = run(&["--gold-draws", "3"]);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    let questions = |stderr: &str| -> usize {
        let at = stderr.find(" gold trajectories in ").unwrap_or_else(|| panic!("{stderr}"));
        stderr[..at].rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(stderr.contains("in 3 draw(s) of the warm-start facts"), "{stderr}");
    assert!(dir.join("world/draws/2/index").is_dir() && !dir.join("world/draws/3").exists());
    let drawn = questions(&stderr);
    // A second run into the same folder replaces the first one's records, none left behind; it
    // runs one batch ahead of the one trained, with decoupled PPO.
    let output = run(&["--max-staleness", "1"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("after warm start") && stdout.contains("exact match (greedy)"), "{stdout}");
    assert!(stdout.contains("mean reward (sampled, T = 1)"), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("in 1 draw(s) of the warm-start facts"), "{stderr}");
    assert_eq!(questions(&stderr) * 3, drawn, "{stderr}");
    assert!(!dir.join("world/draws").exists(), "the first run's draws are gone");
    // Two fact-drill updates after the copy drills and one after every two of the six gold ones.
    assert!(stderr.contains("14 updates (3 on copy drills, 5 on fact drills)"), "{stderr}");
    // The probe finds a model this small copying nothing: two extra rounds (a quarter of the 6
    // gold updates each, one, and no drills), then it says so plainly.
    assert!(stdout.contains("copy probe") && stdout.contains("FAILED after 2 extra"), "{stdout}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["seed"], 5);
    for side in ["after_warm_start", "after_rl"] {
        for key in
            ["exact_match", "mean_reward", "searches_per_trajectory", "valid_format", "sampled_mean_reward"]
        {
            let v = summary[side][key].as_f64().unwrap_or_else(|| panic!("{side}.{key}: {summary}"));
            assert!(v >= 0.0 && v.is_finite(), "{side}.{key} = {v}");
        }
    }
    assert!(summary["seconds"].as_f64().unwrap() > 0.0);
    // The settings, defaults included, so that the run can be repeated from its summary.
    assert_eq!(summary["settings"]["copy_drills"], 3);
    assert_eq!(summary["settings"]["fact_drills"], 2);
    assert_eq!(summary["settings"]["warm_steps"], 6);
    assert_eq!(summary["settings"]["year_guess_share"], 0.5);
    let probe = &summary["copy_probe"];
    assert_eq!((&probe["passed"], &probe["extra_rounds"]), (&json!(false), &json!(2)), "{probe}");
    assert!(probe["values"].as_u64().unwrap() > 0 && probe["copied"].as_u64().unwrap() == 0, "{probe}");
    // One loss per warm-start update, drills first (fact drills between the gold updates too),
    // the extra rounds' last; the summary's loss is the mean of the last tenth (two of sixteen).
    let losses: Vec<Value> = std::fs::read_to_string(dir.join("warm-start.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let pools: Vec<&str> = losses.iter().map(|l| l["pool"].as_str().unwrap()).collect();
    let gold_phase = ["gold", "gold", "fact-drill"].repeat(3);
    assert_eq!(pools, [["copy-drill"; 3].as_slice(), &["fact-drill"; 2], &gold_phase, &["gold"; 2]].concat());
    assert_eq!(
        losses.iter().map(|l| l["update"].as_u64().unwrap()).collect::<Vec<_>>(),
        (1..=16).collect::<Vec<_>>()
    );
    let last_tenth = (losses[14]["loss"].as_f64().unwrap() + losses[15]["loss"].as_f64().unwrap()) / 2.0;
    assert!((summary["warm_start_loss"].as_f64().unwrap() - last_tenth).abs() < 1e-9, "{summary}");
    assert!(dir.join("model/config.json").is_file() && dir.join("model/tokenizer.json").is_file());
    let png = std::fs::read(dir.join("chart.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_trajectories_rendered(&dir, &summary, &stdout);
    let records: Vec<Value> = std::fs::read_to_string(dir.join("rl/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3, "the evaluation before RL and two steps");
    // Both batches were rolled out on version 0: the second is trained one version behind.
    assert_eq!(records[2]["staleness/max"], 1.0, "{:?}", records[2]);
    assert!(records[1..].iter().all(|r| r["actor/is_weight_mean"].is_number()), "decoupled PPO: {records:?}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train-config.json")).unwrap()).unwrap();
    assert_eq!(
        (&config["rollout"]["max_staleness"], &config["algorithm"]["decoupled"]),
        (&json!(1), &json!(true))
    );
    assert_eq!(config["algorithm"]["filter_groups"], false, "--dynamic-sampling false");
    assert_eq!(config["algorithm"]["kl_loss"], "low_var_kl", "a KL loss to the warm-started policy");
    let rollouts = std::fs::read_to_string(dir.join("rl/rollouts.jsonl")).unwrap().lines().count();
    assert_eq!(rollouts, 2 * 2 * 2, "two steps of two questions times two trajectories");
    for file in
        ["world/corpus.jsonl", "world/train.parquet", "world/test.parquet", "world/warm-start.parquet"]
    {
        assert!(dir.join(file).is_file(), "{file}");
    }
    // `kart eval` of the final model on the held-out split, with the run's settings, reproduces
    // the figures `kart local` reports after RL.
    let eval = Command::new(binary("kart"))
        .args(["eval", "--max-prompts", "8", "--model"])
        .arg(dir.join("model"))
        .arg("--data")
        .arg(dir.join("world/test.parquet"))
        .arg("--config")
        .arg(dir.join("train-config.json"))
        .arg("--out")
        .arg(dir.join("eval.json"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&eval.stdout);
    assert!(eval.status.success(), "{table}\n{}", String::from_utf8_lossy(&eval.stderr));
    assert!(table.contains("EM") && table.contains("searches / question"), "{table}");
    let figures: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("eval.json")).unwrap()).unwrap();
    let after = &summary["after_rl"];
    assert_eq!(figures["all"]["trajectories"], 8);
    for (ours, theirs) in
        [("exact_match", "exact_match"), ("reward", "mean_reward"), ("searches", "searches_per_trajectory")]
    {
        assert_eq!(figures["all"][ours], after[theirs], "{ours}: {figures} vs {after}");
    }
    // Sampled: two trajectories a question, each written out.
    let sampled = Command::new(binary("kart"))
        .args(["eval", "--max-prompts", "3", "--n", "2", "--temperature", "1.0", "--model"])
        .arg(dir.join("model"))
        .arg("--data")
        .arg(dir.join("world/test.parquet"))
        .arg("--config")
        .arg(dir.join("train-config.json"))
        .arg("--trajectories")
        .arg(dir.join("sampled.jsonl"))
        .output()
        .unwrap();
    assert!(sampled.status.success(), "{}", String::from_utf8_lossy(&sampled.stderr));
    let lines: Vec<Value> = std::fs::read_to_string(dir.join("sampled.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6, "3 questions x 2");
    assert!(lines.iter().all(|t| t["token_ids"].as_array().is_some_and(|ids| !ids.is_empty())));
    let greedy_twice = Command::new(binary("kart"))
        .args(["eval", "--n", "2", "--model"])
        .arg(dir.join("model"))
        .arg("--data")
        .arg(dir.join("world/test.parquet"))
        .output()
        .unwrap();
    let refusal = String::from_utf8_lossy(&greedy_twice.stderr);
    assert!(!greedy_twice.status.success() && refusal.contains("--temperature 0"), "{refusal}");
    // `kart infer` prints one question's trajectory span by span, once or for each line read.
    let infer = |extra: &[&str], stdin: &str| {
        let mut child = Command::new(binary("kart"))
            .args(["infer", "--model"])
            .arg(dir.join("model"))
            .arg("--config")
            .arg(dir.join("train-config.json"))
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let once = infer(&["Who founded Muntex Foods?"], "");
    assert!(once.starts_with("── prompt ──\n") && once.contains("Who founded Muntex Foods?"), "{once}");
    assert!(once.contains("── model ──\n") && once.matches("── answer: ").count() == 1, "{once}");
    // Flags instead of the config: the environment and the local index.
    let flagged = Command::new(binary("kart"))
        .args([
            "infer",
            "--env",
            r#"{"kind": "search-r1", "max_turns": 1, "max_response_length": 24}"#,
            "--model",
        ])
        .arg(dir.join("model"))
        .arg("--index")
        .arg(dir.join("world/index"))
        .arg("Who founded Muntex Foods?")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&flagged.stdout);
    assert!(flagged.status.success(), "{}", String::from_utf8_lossy(&flagged.stderr));
    assert!(
        shown.contains("Answer the given question.") && shown.contains("Question: Who founded Muntex Foods?"),
        "{shown}"
    );
    let looped = infer(&["--interactive"], "Where is Dimfan?\n\nWho runs Muntex Press?\n");
    assert_eq!(looped.matches("── answer: ").count(), 2, "one answer per question line: {looped}");
    // transformers' `AutoTokenizer` (a `Qwen2Tokenizer` for this `qwen2` folder) gives the run's
    // model kart's ids on the world's passages, years included, and on the gold's answer form.
    if let Some(python) = kart_testing::python() {
        let script = "import json, sys\nfrom transformers import AutoTokenizer\nt = AutoTokenizer.from_pretrained(sys.argv[1])\nprint(json.dumps([type(t).__name__] + [t(x, add_special_tokens=False)['input_ids'] for x in json.loads(sys.argv[2])]))";
        let corpus = std::fs::read_to_string(dir.join("world/corpus.jsonl")).unwrap();
        let mut texts: Vec<String> = corpus
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["contents"].as_str().unwrap().to_owned())
            .filter(|text| text.chars().any(|c| c.is_ascii_digit()))
            .take(20)
            .collect();
        assert_eq!(texts.len(), 20, "passages with years");
        texts.push("<|im_start|>assistant\n<answer> 1952 </answer><|im_end|> 19520 x1952".into());
        let output = Command::new(python)
            .arg("-c")
            .arg(script)
            .arg(dir.join("model"))
            .arg(serde_json::to_string(&texts).unwrap())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let seen: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(seen[0], "Qwen2Tokenizer");
        let tokenizer = kart_tokenizer::Tokenizer::load(dir.join("model")).unwrap();
        for (text, ids) in texts.iter().zip(&seen[1..]) {
            assert_eq!(*ids, json!(tokenizer.encode(text, false).unwrap()), "{text:?}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kart local` on a tiny world and model, one RL step, with `extra` flags, into `dir`.
fn tiny_run(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(binary("kart"))
        .args(["local", "--persons", "400", "--rl-questions", "20", "--hidden", "32", "--layers", "1"])
        .args(["--vocab", "600", "--copy-drills", "3", "--fact-drills", "2", "--warm-steps", "6"])
        .args(["--warm-batch", "4", "--probe-rounds", "0", "--steps", "1", "--prompts", "2", "--n", "2"])
        .args(["--eval-questions", "4", "--dynamic-sampling", "false"])
        .args(extra)
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn a_lora_run_trains_adapters_on_the_warm_started_model() {
    let dir = std::env::temp_dir().join(format!("kart-local-lora-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let output = tiny_run(&dir, &["--lora", "4"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train-config.json")).unwrap()).unwrap();
    assert_eq!(
        config["lora"],
        json!({"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.0, "target_modules": "all-linear", "use_rslora": false})
    );
    // The model at the end is the adapters, on the warm-started base.
    let adapter: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model/adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!((&adapter["peft_type"], &adapter["r"]), (&json!("LORA"), &json!(4)), "{adapter}");
    assert_eq!(adapter["base_model_name_or_path"], json!(dir.join("warm-start-model")), "{adapter}");
    assert!(dir.join("model/adapter_model.safetensors").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tools_run_trains_through_the_tools_environment() {
    let dir = std::env::temp_dir().join(format!("kart-local-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let output = tiny_run(&dir, &["--env", "tools"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train-config.json")).unwrap()).unwrap();
    let env = &config["rollout"]["env"];
    assert_eq!(
        (&env["kind"], &env["functions"]),
        (&json!("tools"), &json!([{"builtin": "search"}])),
        "{env}"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["settings"]["env"], "tools");
    // The saved model's template renders the search function; its prompts are the questions.
    let template = std::fs::read_to_string(dir.join("model/chat_template.jinja")).unwrap();
    assert!(template.contains("<tool_call>"), "{template}");
    let rollout: Value = serde_json::from_str(
        std::fs::read_to_string(dir.join("rl/rollouts.jsonl")).unwrap().lines().next().unwrap(),
    )
    .unwrap();
    let prompt = rollout["segments"][0]["text"].as_str().unwrap();
    assert!(
        prompt.contains("call the search function") && prompt.contains("\"name\": \"search\""),
        "{prompt}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_world_too_small_for_its_splits_is_refused_naming_the_flags() {
    let dir = std::env::temp_dir().join(format!("kart-local-small-{}", std::process::id()));
    let output = Command::new(binary("kart"))
        .args(["local", "--persons", "200", "--rl-questions", "600", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("--persons 200") && stderr.contains("--rl-questions 600"), "{stderr}");
    assert!(stderr.contains("train_questions = 600"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One held-out question's trajectory before and after RL, rendered for reading, named in
/// `summary.json` and in the last line printed.
fn assert_trajectories_rendered(dir: &std::path::Path, summary: &Value, stdout: &str) {
    let paths = summary["trajectories"].as_array().unwrap_or_else(|| panic!("{summary}"));
    let texts: Vec<String> =
        paths.iter().map(|p| std::fs::read_to_string(p.as_str().unwrap()).unwrap()).collect();
    for (path, text) in paths.iter().zip(&texts) {
        assert!(path.as_str().unwrap().starts_with(dir.to_str().unwrap()), "{path}");
        for part in ["question: ", "gold answer: ", "reward ", "--- model ---"] {
            assert!(text.contains(part), "{path}: no {part:?}:\n{text}");
        }
    }
    assert!(texts[0].contains("before RL") && texts[1].contains("after RL"), "{texts:?}");
    let question = |t: &str| t.lines().find(|l| l.starts_with("question: ")).map(str::to_owned);
    assert_eq!(question(&texts[0]), question(&texts[1]), "the same question twice");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.contains("trajectory-before-rl.txt") && last.contains("trajectory-after-rl.txt"),
        "{stdout}"
    );
}

/// `kart local --quick`: the whole loop on a small world and model (a first look in about two
/// minutes), with the chart and the trajectories; the flags it sets cannot be given with it.
#[test]
fn quick_shows_the_whole_loop_with_its_chart_and_trajectories() {
    let dir = std::env::temp_dir().join(format!("kart-local-quick-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let output = Command::new(binary("kart")).args(["local", "--quick", "--out"]).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let settings = &summary["settings"];
    assert_eq!(
        (&settings["quick"], &settings["hidden"], &settings["steps"]),
        (&json!(true), &json!(64), &json!(6))
    );
    let records = std::fs::read_to_string(dir.join("rl/metrics.jsonl")).unwrap().lines().count();
    assert_eq!(records, 7, "the evaluation before RL and six steps");
    // The copy probe every 500 warm-start updates (of 900), with the update's loss.
    let probes: Vec<(u64, Value)> = std::fs::read_to_string(dir.join("warm-start.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("probe").is_some())
        .map(|l| (l["update"].as_u64().unwrap(), l["probe"].clone()))
        .collect();
    assert_eq!(probes.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [500], "{probes:?}");
    assert!(probes[0].1["values"].as_u64().unwrap() > 0, "{probes:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("copy probe after 500 warm-start updates"));
    let png = std::fs::read(dir.join("chart.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // The PNG's header: 1200 x 800 pixels.
    assert_eq!((&png[16..20], &png[20..24]), (&1200u32.to_be_bytes()[..], &800u32.to_be_bytes()[..]));
    assert!(stdout.contains("after warm start") && stdout.contains("exact match (greedy)"), "{stdout}");
    assert_trajectories_rendered(&dir, &summary, &stdout);
    std::fs::remove_dir_all(&dir).unwrap();

    let refused = Command::new(binary("kart")).args(["local", "--quick", "--hidden", "32"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("--hidden"), "{stderr}");
}
