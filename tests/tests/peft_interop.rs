//! LoRA interoperability with the `peft` package in the project venv, on the fixture models: peft
//! loads the adapter kart writes and computes kart's logits and, after one backward pass, kart's
//! adapter gradients; kart loads the adapter peft writes and computes peft's logits, and so does
//! the plain model `kart convert merge-lora` makes of it.

use std::path::Path;
use std::process::Command;

use kart_core::config::lora::{AllLinear, LoraConfig, Projection, TargetModules};
use kart_model::CausalLm;
use kart_model::transformer::seeded_normal;
use kart_tests::{binary, fresh_dir, python, shared_dir};
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// peft's side. Arguments: a job file. `make` builds a peft adapter of the job's settings with
/// random `A` and `B` (seeded) and saves it; `load` loads kart's. Either way it writes the
/// logits of `input_ids` and, for `load`, the gradient of [`loss`]'s formula at each adapter
/// tensor, named as in the saved adapter.
const PEFT_SIDE: &str = r#"
import json, sys
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from peft import LoraConfig, PeftModel, get_peft_model

job = json.load(open(sys.argv[1]))
torch.manual_seed(job["seed"])
base = AutoModelForCausalLM.from_pretrained(job["base"], dtype=torch.float32)
if job["mode"] == "make":
    config = LoraConfig(r=job["r"], lora_alpha=job["alpha"], target_modules=job["targets"],
                        use_rslora=job["rslora"], init_lora_weights=False)
    model = get_peft_model(base, config)
    model.save_pretrained(job["adapter"])
else:
    model = PeftModel.from_pretrained(base, job["adapter"], is_trainable=True)
model.eval()
ids = torch.tensor(job["input_ids"])
logits = model(input_ids=ids).logits
out = {"logits": logits.detach().contiguous()}
if job["mode"] == "load":
    logp = logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])
    (-logp.mean()).backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            out["grad:" + name.replace(".default", "")] = p.grad.contiguous()
save_file(out, job["out"])
"#;

const INPUT_IDS: [[i64; 9]; 2] = [[5, 9, 17, 33, 2, 8, 100, 200, 300], [40, 41, 42, 43, 44, 45, 46, 47, 48]];

/// Runs peft's side on `job` and returns what it wrote.
fn peft(work: &Path, job: serde_json::Value) -> Vec<(String, Tensor)> {
    let python = python();
    let ok = Command::new(&python).args(["-c", "import peft"]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "{} cannot import peft: bash scripts/setup.sh installs it", python.display());
    let (job_path, out) = (work.join("job.json"), work.join("peft.safetensors"));
    let mut job = job;
    job["out"] = json!(out);
    job["input_ids"] = json!(INPUT_IDS);
    std::fs::write(&job_path, job.to_string()).unwrap();
    let output = Command::new(&python).arg("-c").arg(PEFT_SIDE).arg(&job_path).output().unwrap();
    assert!(output.status.success(), "peft failed:\n{}", String::from_utf8_lossy(&output.stderr));
    Tensor::read_safetensors(&out).unwrap()
}

fn ids() -> Tensor {
    Tensor::from_slice(&INPUT_IDS.concat()).view([2, 9])
}

/// kart's logits of [`INPUT_IDS`], recording gradients.
fn logits(model: &CausalLm) -> Tensor {
    let positions = Tensor::arange(9, (Kind::Int64, Device::Cpu)).expand([2, 9], false);
    model.lm_head(&model.forward(&ids(), &positions, None, None))
}

/// The mean negative log-likelihood of each next token, as peft's side computes it.
fn loss(logits: &Tensor) -> Tensor {
    let targets = ids().narrow(1, 1, 8).unsqueeze(-1);
    let logp = logits.narrow(1, 0, 8).log_softmax(-1, Kind::Float).gather(-1, &targets, false);
    -logp.mean(Kind::Float)
}

fn get<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not written")).1
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

#[test]
fn peft_loads_karts_adapters_with_the_same_logits_and_gradients() {
    let configs = [
        LoraConfig {
            r: 4,
            lora_alpha: 8.0,
            target_modules: TargetModules::AllLinear(AllLinear::AllLinear),
            ..Default::default()
        },
        LoraConfig { r: 8, lora_alpha: 16.0, use_rslora: true, ..Default::default() },
        LoraConfig {
            r: 2,
            lora_alpha: 4.0,
            target_modules: TargetModules::Named(vec![
                Projection::OProj,
                Projection::UpProj,
                Projection::DownProj,
            ]),
            ..Default::default()
        },
    ];
    for (name, config) in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"].into_iter().zip(configs) {
        let fixture = shared_dir().join("fixtures/models").join(name);
        let mut model = CausalLm::load(&fixture, Device::Cpu).unwrap();
        model.attach_lora(&config, 7).unwrap();
        // Trained-looking adapters: `B` away from zero, so they change the logits.
        let adapters = model.lora().unwrap().named_tensors();
        tch::no_grad(|| {
            for (i, (_, t)) in adapters.iter().enumerate() {
                let noise = seeded_normal(i as u64, t.numel(), 0.05);
                let _ = t.shallow_clone().g_add_(&Tensor::from_slice(&noise).view(t.size().as_slice()));
            }
        });
        let work = fresh_dir(&format!("kart-peft-{name}"));
        let adapter = work.join("adapter");
        model.lora().unwrap().save(&adapter, &fixture.to_string_lossy()).unwrap();

        let logits = logits(&model);
        loss(&logits).backward();
        let theirs = peft(&work, json!({"mode": "load", "seed": 0, "base": fixture, "adapter": adapter}));
        let diff = max_diff(&logits.detach(), get(&theirs, "logits"));
        assert!(diff < 1e-5, "{name}: logits differ by {diff}");
        assert_eq!(theirs.len() - 1, adapters.len(), "{name}: peft trains what kart trains");
        for (tensor, t) in &adapters {
            let diff = max_diff(&t.grad(), get(&theirs, &format!("grad:{tensor}")));
            assert!(diff < 1e-5, "{name}: the gradient of {tensor} differs by {diff}");
        }
        let _ = std::fs::remove_dir_all(&work);
    }
}

#[test]
fn kart_loads_pefts_adapters_with_the_same_logits() {
    for (name, targets, rslora) in [
        ("tiny-qwen2", json!(["q_proj", "k_proj", "v_proj", "gate_proj"]), false),
        ("tiny-qwen3", json!("all-linear"), true),
        ("tiny-llama", json!(["down_proj", "o_proj"]), false),
    ] {
        let fixture = shared_dir().join("fixtures/models").join(name);
        let work = fresh_dir(&format!("kart-peft-made-{name}"));
        let adapter = work.join("adapter");
        let job = json!({"mode": "make", "seed": 3, "base": fixture, "adapter": adapter,
                         "r": 4, "alpha": 12, "targets": targets, "rslora": rslora});
        let theirs = peft(&work, job);
        let mut model = CausalLm::load(&fixture, Device::Cpu).unwrap();
        model.load_lora(&adapter).unwrap();
        let expected_targets = match targets.as_str() {
            Some(_) => 7,
            None => targets.as_array().unwrap().len(),
        };
        assert_eq!(
            model.lora().unwrap().targets().len(),
            expected_targets * model.config().num_hidden_layers
        );
        let diff = max_diff(&tch::no_grad(|| logits(&model)), get(&theirs, "logits"));
        assert!(diff < 1e-5, "{name}: logits differ by {diff}");
        // The base alone differs: the adapter is what matched.
        let base = tch::no_grad(|| logits(&CausalLm::load(&fixture, Device::Cpu).unwrap()));
        assert!(max_diff(&base, get(&theirs, "logits")) > 1e-4, "{name}: the adapter changes nothing");
        // Merged into a plain folder by `kart convert merge-lora`, it computes the same.
        let merged = work.join("merged");
        let output = Command::new(binary("kart"))
            .args(["convert", "merge-lora", "--base"])
            .arg(&fixture)
            .arg("--adapter")
            .arg(&adapter)
            .arg("--out")
            .arg(&merged)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let merged = CausalLm::load(&merged, Device::Cpu).unwrap();
        assert!(merged.lora().is_none());
        let diff = max_diff(&tch::no_grad(|| logits(&merged)), get(&theirs, "logits"));
        assert!(diff < 1e-5, "{name}: the merged model's logits differ by {diff}");
        let _ = std::fs::remove_dir_all(&work);
    }
}
