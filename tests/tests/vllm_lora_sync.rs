//! `kart train` of LoRA adapters keeping real vLLM servers (vLLM's CPU build,
//! `kart_tests::vllm_sync`) on its policy with `vllm_disk` by publishing the adapters alone: each
//! version is a PEFT folder of kilobytes that every replica loads in place over the base it
//! keeps (`/v1/load_lora_adapter`), the tokens carry the version, the workers' requests name the
//! adapter, and after the last step each replica samples the trained policy: its
//! log-probabilities are those kart computes on the base with the last adapters, not the base's.
//!
//! The servers run the container of the operator's inference Deployment for a RolloutPool whose
//! `inference.args` enable LoRA (`--enable-lora`, the rank), with the environment the operator
//! gives every vLLM server (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`). `kart bench sync --lora` then
//! measures its publishes against the whole model's on the same servers.

use kart_core::config::lora::POLICY_ADAPTER;
use kart_model::CausalLm;
use kart_rollout::engines::vllm::VllmEngine;
use kart_tests::vllm::serving_model;
use kart_tests::vllm_sync::{STEPS, train_through_vllm};
use kart_tokenizer::Tokenizer;
use serde_json::json;
use std::time::Duration;
use tch::Device;

#[test]
fn every_vllm_replica_samples_the_trained_adapters_after_each_step() {
    let model = serving_model("serve-qwen2");
    let lora = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"];
    let run = train_through_vllm("kart-vllm-lora", &model, &lora, |config| {
        // A random model's rewards are all 0, so GRPO's advantages are too: an entropy bonus
        // moves the adapters (B starts at zero), and a large scaling and step size move the
        // policy well past the tolerance in three steps.
        config["lora"] = json!({"r": 4, "lora_alpha": 32, "target_modules": "all-linear"});
        config["algorithm"] = json!({"entropy_coef": 0.1});
        config["optim"] = json!({"lr": 5e-3});
    });
    // Each version a PEFT folder: the adapters, not the model.
    let last = run.weights.join(format!("v{STEPS}"));
    let mut files: Vec<String> =
        std::fs::read_dir(&last).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["adapter_config.json", "adapter_model.safetensors"]);
    let adapter_bytes = std::fs::metadata(last.join("adapter_model.safetensors")).unwrap().len();
    let model_bytes = std::fs::metadata(model.join("model.safetensors")).unwrap().len();
    kart_tests::log(&format!(
        "vllm_disk with LoRA: {adapter_bytes} bytes a publish against the model's {model_bytes}"
    ));
    assert!(adapter_bytes * 4 < model_bytes, "{adapter_bytes} against {model_bytes}");

    let base = CausalLm::load(&model, Device::Cpu).unwrap();
    let mut trained = CausalLm::load(&model, Device::Cpu).unwrap();
    trained.load_lora(&last).unwrap();
    let tokenizer = Tokenizer::load(&model).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for replica in &run.replicas {
        let served = VllmEngine::new(&replica.url, &replica.served, Duration::from_secs(600));
        let models = runtime.block_on(served.models()).unwrap();
        assert!(models.iter().any(|m| m == POLICY_ADAPTER), "{}: {models:?}", replica.url);
        run.check_served(replica, &tokenizer, &trained, &base);
    }

    // `kart bench sync --lora` on the same servers: adapters against the whole model, each
    // publish until both replicas serve it.
    let json = run.dir.join("bench-sync-lora.json");
    let urls = run.replicas.iter().map(|r| r.url.clone()).collect::<Vec<_>>().join(",");
    let (stdout, report) = kart_tests::report_of(
        std::process::Command::new(kart_tests::binary("kart"))
            .args(["bench", "sync", "--quick", "--lora", "4", "--vllm-urls", &urls, "--model-dir"])
            .arg(&model)
            .arg("--python")
            .arg(kart_tests::python())
            .arg("--json")
            .arg(&json),
        &json,
    );
    kart_tests::log(&format!("kart bench sync --quick --lora 4: {report}"));
    assert_eq!(report["replicas"].as_u64(), Some(2), "{report}");
    let (adapters, whole) =
        (report["adapter_bytes"].as_u64().unwrap(), report["model_bytes"].as_u64().unwrap());
    assert!(adapters > 0 && adapters * 4 < whole, "{report}");
    for key in ["adapter_secs", "model_secs"] {
        assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
    }
    assert!(stdout.contains("vllm_disk adapters seconds"), "{stdout}");
    run.finish();
}
