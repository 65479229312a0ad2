//! `kart conformance` as a user runs it: on the shared upstream vectors, and on bad input.

use kart_tests::{binary, shared_dir};
use std::process::Command;

fn kart_conformance(args: &[&std::path::Path]) -> (i32, String, String) {
    let out = Command::new(binary("kart")).arg("conformance").args(args).output().expect("run kart");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_shared_vector_passes() {
    let dir = shared_dir().join("conformance");
    let (code, stdout, stderr) = kart_conformance(&[&dir]);
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(code, 0, "kart conformance failed:\n{stdout}\n{stderr}");
    assert!(last.ends_with(" passed, 0 failed"), "closing line: {last}");
    let passed: usize = last.split(' ').next().unwrap().parse().unwrap();
    assert!(passed >= 5000, "expected every case of the five files to run, got {passed}");
}

#[test]
fn failing_case_is_printed_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("kart-conf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.jsonl");
    std::fs::write(
        &file,
        "{\"kind\": \"normalize\", \"input\": \"The Cat\", \"expect\": \"cat\"}\n\
         {\"kind\": \"normalize\", \"input\": \"The Cat\", \"expect\": \"the cat\"}\n",
    )
    .unwrap();
    let (code, stdout, _) = kart_conformance(&[&file]);
    assert_eq!(code, 1);
    assert!(stdout.contains("bad.jsonl:2"), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("1 passed, 1 failed"));
}

#[test]
fn unrecognised_file_names_file_and_line() {
    let dir = std::env::temp_dir().join(format!("kart-conf-cli-u-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("other.jsonl");
    std::fs::write(&file, "{\"question\": \"q\", \"answer\": \"a\"}\n").unwrap();
    let (code, _, stderr) = kart_conformance(&[&file]);
    assert_eq!(code, 1);
    assert!(stderr.contains("other.jsonl:1: not a recognised conformance case"), "{stderr}");
}

#[test]
fn tool_calling_conversations_render_as_transformers_renders_them() {
    let fixtures = shared_dir().join("fixtures/chat-templates");
    let (code, stdout, stderr) = kart_conformance(&[&fixtures.join("tools-chatml.jsonl")]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().last(), Some("40 passed, 0 failed"));

    // A rendering one character off is caught, with the template found beside the copy.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures.join("tools-chatml.jinja"), dir.path().join("tools-chatml.jinja")).unwrap();
    let first = std::fs::read_to_string(fixtures.join("tools-chatml.jsonl")).unwrap();
    let mut case: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    case["rendered"] = case["rendered"].as_str().unwrap().replacen("<|im_end|>\n", "<|im_end|>", 1).into();
    let file = dir.path().join("off.jsonl");
    std::fs::write(&file, format!("{case}\n")).unwrap();
    let (code, stdout, _) = kart_conformance(&[&file]);
    assert_eq!(code, 1);
    assert!(stdout.contains("off.jsonl:1 [chat-template/render]"), "{stdout}");
}
