//! Hugging Face interoperability, checked against Python transformers in the project venv: model
//! folders kart saves load there and give kart's logits, and a tokenizer kart trains tokenizes,
//! decodes and renders its chat template as transformers does.
//!
//! Without the venv or its transformers, each test says why and returns early; `bash
//! scripts/setup.sh` installs them (CI does).

use std::path::{Path, PathBuf};
use std::process::Command;

use kart_core::chat::ChatMessage;
use kart_model::{CausalLm, ModelConfig, QwenSizes, save_pretrained};
use kart_tests::{repo_root, shared_dir};
use kart_tokenizer::{CHATML, ChatTemplate, Tokenizer};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

/// Loads a folder with transformers and reports what it computes. Arguments: a job file
/// (`model`, `input_ids`, `logits` output path, optional `texts` and `messages`) and the JSON
/// output path (token ids of each text, their decoding, the rendered chat template).
const TRANSFORMERS_SIDE: &str = r#"
import json, sys
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

job = json.load(open(sys.argv[1]))
model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).eval()
with torch.inference_mode():
    logits = model(input_ids=torch.tensor(job["input_ids"])).logits
save_file({"logits": logits.contiguous()}, job["logits"])
out = {
    "config_eos_token_id": model.config.eos_token_id,
    "config_pad_token_id": model.config.pad_token_id,
    "generation_eos_token_id": model.generation_config.eos_token_id,
    "generation_pad_token_id": model.generation_config.pad_token_id,
}
if job.get("texts"):
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    out["ids"] = [tokenizer.encode(text, add_special_tokens=False) for text in job["texts"]]
    out["decoded"] = [tokenizer.decode(ids) for ids in out["ids"]]
    out["chat"] = tokenizer.apply_chat_template(job["messages"], tokenize=False, add_generation_prompt=True)
json.dump(out, open(sys.argv[2], "w"))
"#;

/// Texts the trained tokenizer must split as transformers does: special tokens, words it saw,
/// bytes it never saw, runs of spaces and newlines, digits (Qwen2 splits each alone), whole
/// words added whole (years, alone and inside longer numbers and words), CJK, contractions, and
/// text NFC changes.
const TEXTS: [&str; 7] = [
    "<|im_start|>user\nWhich river flows through Zürich?<|im_end|>\n",
    "北京 😀  two  spaces\tand a tab",
    "the agent reads the page<|endoftext|>",
    "Founded in 1952, it had 12,345 staff by 2024.\n\n\n  Page 7 of 10",
    "東京タワーは1958年に完成した。  It's   the tower's year",
    "Cafe\u{301} and café\r\n\tend",
    "born in 1952 (1952), not 19520 or x1952; <answer> 1999 </answer>",
];

/// The venv's Python when it can import torch and transformers; otherwise prints why not.
fn python() -> Option<PathBuf> {
    let python = repo_root().join(".venv/bin/python");
    let works = Command::new(&python)
        .args(["-c", "import torch, transformers"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !works {
        eprintln!(
            "skipping: {} cannot import torch and transformers (bash scripts/setup.sh installs them)",
            python.display()
        );
    }
    works.then_some(python)
}

/// A scratch folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kart-interop-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What transformers computes for the folder `model`: logits of `input_ids`, and for each text
/// its token ids and their decoding, and the chat template rendered for `messages`.
fn transformers(
    python: &Path,
    work: &Path,
    model: &Path,
    input_ids: &[Vec<i64>],
    texts: &[&str],
    messages: &[ChatMessage],
) -> (Tensor, Value) {
    let (job_path, out_path, logits_path) =
        (work.join("job.json"), work.join("out.json"), work.join("logits.safetensors"));
    let job = json!({
        "model": model,
        "input_ids": input_ids,
        "logits": logits_path,
        "texts": texts,
        "messages": messages,
    });
    std::fs::write(&job_path, job.to_string()).unwrap();
    let output =
        Command::new(python).arg("-c").arg(TRANSFORMERS_SIDE).arg(&job_path).arg(&out_path).output().unwrap();
    assert!(output.status.success(), "transformers failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let logits = Tensor::read_safetensors(&logits_path).unwrap().remove(0).1;
    let out = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    (logits, out)
}

/// kart's logits `(B, T, vocab)` of unpadded rows of token ids.
fn kart_logits(model: &CausalLm, input_ids: &[Vec<i64>]) -> Tensor {
    let (rows, len) = (input_ids.len() as i64, input_ids[0].len() as i64);
    let ids = Tensor::from_slice(&input_ids.concat()).view([rows, len]);
    let positions = Tensor::arange(len, (Kind::Int64, Device::Cpu)).expand([rows, len], false);
    tch::no_grad(|| model.lm_head(&model.forward(&ids, &positions, None, None)))
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

#[test]
fn perturbed_fixtures_saved_by_kart_give_transformers_the_same_logits() {
    let Some(python) = python() else { return };
    let input_ids = vec![vec![5, 9, 17, 33, 2, 8, 100, 200, 365], vec![40, 41, 42, 43, 44, 45, 46, 47, 48]];
    for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
        let fixture = shared_dir().join("fixtures/models").join(name);
        let model = CausalLm::load(&fixture, Device::Cpu).unwrap();
        // New weights, so that transformers can only match by reading what kart wrote.
        tch::no_grad(|| {
            for (_, mut tensor) in model.named_tensors() {
                tensor += tensor.randn_like() * 0.01;
            }
        });
        let work = Scratch::new(name);
        let dir = work.0.join("model");
        save_pretrained(&dir, model.config(), &model.named_tensors(), Some(&fixture), Kind::Float).unwrap();

        let (expected, _) = transformers(&python, &work.0, &dir, &input_ids, &[], &[]);
        let diff = max_diff(&kart_logits(&model, &input_ids), &expected);
        assert!(diff < 1e-4, "{name}: logits differ by {diff}");
    }
}

#[test]
fn random_qwen2_with_a_trained_tokenizer_loads_in_transformers() {
    let Some(python) = python() else { return };
    let sizes = QwenSizes {
        vocab_size: 512,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 128,
        tie_word_embeddings: false,
        initializer_range: 0.02,
    };
    let corpus = ["the agent reads the page and answers", "which river flows through the city", "a b c"];
    let tokenizer = Tokenizer::train_byte_level_bpe(
        corpus.iter().cycle().take(200).copied(),
        400,
        &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "<|im_end|>",
        "<|endoftext|>",
    )
    .unwrap()
    .with_added_words(&[" 1952", " 1999"])
    .unwrap();
    // An added word is one token wherever it occurs, and digits elsewhere.
    let count = |text: &str| tokenizer.encode(text, false).unwrap().len();
    assert_eq!((count(" 1952"), count(" 19520"), count("1952"), count(" 1953")), (1, 2, 4, 5));
    let (eos, pad) = (tokenizer.eos_token_id(), tokenizer.pad_token_id());
    let config = ModelConfig::qwen2(sizes).unwrap().with_special_tokens(eos, pad);
    let model = CausalLm::random(config.clone(), Device::Cpu, 3).unwrap();
    let work = Scratch::new("random-qwen2");
    let dir = work.0.join("model");
    save_pretrained(&dir, &config, &model.named_tensors(), None, Kind::Float).unwrap();
    tokenizer.save(&dir, Some(CHATML)).unwrap();

    let messages =
        [ChatMessage::new("system", "Answer briefly."), ChatMessage::new("user", "Where is Zürich?")];
    let prompt = ChatTemplate::load(&dir).unwrap().unwrap().render(&messages, true, Value::Null).unwrap();
    let ids: Vec<i64> = tokenizer.encode(&prompt, false).unwrap().into_iter().map(i64::from).collect();
    let (expected, out) = transformers(&python, &work.0, &dir, std::slice::from_ref(&ids), &TEXTS, &messages);

    assert_eq!(out["chat"], prompt.as_str());
    // Generation loops find the tokenizer's end and padding tokens in the model's configs.
    let (eos, pad) = (json!(eos.unwrap()), json!(pad.unwrap()));
    assert_eq!((&out["config_eos_token_id"], &out["config_pad_token_id"]), (&eos, &pad), "{out}");
    assert_eq!((&out["generation_eos_token_id"], &out["generation_pad_token_id"]), (&eos, &pad), "{out}");
    for (i, text) in TEXTS.iter().enumerate() {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(out["ids"][i], json!(ids), "{text:?}");
        assert_eq!(out["decoded"][i], tokenizer.decode(&ids, false).unwrap(), "{text:?} (NFC-normalised)");
    }
    let diff = max_diff(&kart_logits(&model, &[ids]), &expected);
    assert!(diff < 1e-4, "logits differ by {diff}");
}
