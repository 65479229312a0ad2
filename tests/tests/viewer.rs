//! The trajectory viewer in a real browser: `kart local --quick` trains a search agent (its RL
//! writes `rl/rollouts.jsonl`), `kart view` serves the run, and Debian's headless Chromium,
//! driven through chromedriver (tests/viewer/browse.py), loads the page without a console error,
//! narrows the list by step, tool and reward, shows a trajectory whose text is its tokens
//! decoded by the model's own tokenizer, and a GRPO group side by side. The screenshots are kept
//! in `<target>/test-artifacts/viewer/`.

use kart_tests::{Child, binary, free_port, fresh_dir, python, repo_root, wait_ready};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn the_viewer_shows_a_run_s_trajectories_in_a_browser() {
    let dir = fresh_dir("kart-viewer");
    let run = dir.join("local");
    let output = Command::new(binary("kart")).args(["local", "--quick", "--out"]).arg(&run).output().unwrap();
    assert!(output.status.success(), "kart local --quick: {}", String::from_utf8_lossy(&output.stderr));

    // A folder without rollouts is refused, naming the file and why.
    let refused = Command::new(binary("kart")).arg("view").arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("rollouts.jsonl") && stderr.contains("dump_rollouts"), "{stderr}");

    let port = free_port();
    let mut viewer = Child(
        Command::new(binary("kart"))
            .args(["view", "--port", &port.to_string()])
            .arg(run.join("rl"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{base}/healthz"), &mut viewer, Duration::from_secs(300));

    let artifacts = binary("kart").parent().unwrap().parent().unwrap().join("test-artifacts/viewer");
    let _ = std::fs::remove_dir_all(&artifacts);
    std::fs::create_dir_all(&artifacts).unwrap();
    let browsed = Command::new(python())
        .arg(repo_root().join("tests/viewer/browse.py"))
        .arg(format!("{base}/ui/"))
        .arg(run.join("model/tokenizer.json"))
        .arg(&artifacts)
        .output()
        .unwrap();
    assert!(
        browsed.status.success(),
        "browse.py: {}\n{}",
        String::from_utf8_lossy(&browsed.stdout),
        String::from_utf8_lossy(&browsed.stderr)
    );
    let report: Value = serde_json::from_slice(&browsed.stdout).unwrap();
    kart_tests::log(&format!("viewer: {report}"));

    // No console message above INFO (a failed request, a script error, a warning).
    let console: Vec<&Value> =
        report["console"].as_array().unwrap().iter().filter(|e| e["level"] != "INFO").collect();
    assert!(console.is_empty(), "console: {console:?}");

    // `--quick` trains 6 steps of 8 prompts x 4 trajectories.
    let steps: Vec<u64> = report["steps"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "{report}");
    let total = report["total"].as_u64().unwrap();
    assert_eq!(total, 6 * 8 * 4);
    assert_eq!(report["first_page"], 100, "a page of the list");
    // Filters narrow the list, and what they keep is what they ask for.
    let by_step = &report["step_filter"];
    assert_eq!(by_step["total"], 32);
    assert_eq!(by_step["steps_listed"], serde_json::json!([6]));
    let tools = report["tools"].as_array().unwrap();
    assert_eq!(tools, &[Value::from("search")], "the search agent's one tool: {report}");
    let by_tool = &report["tool_filter"];
    assert!(by_tool["total"].as_u64().unwrap() <= 32);
    assert!(
        by_tool["tools_listed"].as_array().unwrap().iter().all(|t| t.as_str().unwrap().contains("search"))
    );
    let by_reward = &report["reward_filter"];
    let min = by_reward["min"].as_f64().unwrap();
    let kept = by_reward["rewards_listed"].as_array().unwrap();
    assert!(!kept.is_empty() && kept.iter().all(|r| r.as_f64().unwrap() >= min), "{by_reward}");
    if report["reward_range"][0].as_f64() < Some(min) {
        assert!(by_reward["total"].as_u64().unwrap() < total, "{by_reward}");
    }
    assert_eq!(report["cleared_total"], total);

    // The trajectory reads as the tokens it was, the model's turns set apart as carrying loss.
    let detail = &report["detail"];
    assert_eq!(detail["text_equals_decoded"], true, "{detail}");
    let roles: Vec<&str> = detail["roles"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert_eq!(roles[0], "prompt");
    assert!(roles.contains(&"model"), "{roles:?}");
    assert!(
        detail["model_classes"].as_array().unwrap().iter().all(|c| c.as_str().unwrap().contains("model"))
    );
    assert!(detail["meta"].as_str().unwrap().contains("tokens with loss"), "{detail}");

    // Its group, side by side: the prompt's four trajectories of that step.
    assert_eq!(report["group"]["columns"], 4, "{}", report["group"]);
    for shot in ["steps-and-list.png", "filtered.png", "trajectory.png", "group.png"] {
        let bytes = std::fs::read(artifacts.join(shot)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000, "{shot}: {} bytes", bytes.len());
    }
    drop(viewer);
    std::fs::remove_dir_all(&dir).unwrap();
}
