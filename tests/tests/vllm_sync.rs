//! `kart train` keeping real vLLM servers (vLLM's CPU build, `kart_tests::vllm`) on its weights
//! with `vllm_disk` (`kart_tests::vllm_sync`): every replica reloads every version in place and
//! reports it, the tokens carry it (no step trains on stale tokens), and after the last step each
//! replica serves the trained model: its log-probabilities are those kart computes on the last
//! published weights, and its greedy tokens those of kart's embedded engine up to the first near
//! tie of the trained model's logits.
//!
//! The model is the Llama fixture, whose LM head is its own: vLLM's CPU build reloads a model
//! whose head is tied to its embeddings (the Qwen2 fixture, Qwen2.5 up to 3B) with the head left
//! on the weights it started with. The head's oneDNN handle packs the weight once, and the
//! in-place reload repacks only layers it loaded weights into, which a tied head is not: after
//! three steps vLLM's log-probabilities were those of the trained body under the initial head
//! (-3.29665 against kart's -3.29782 on the same token; transformers on that mix: -3.29665).

use kart_core::engine::Engine;
use kart_model::{CausalLm, EmbeddedEngine};
use kart_tests::vllm::{score, serving_model};
use kart_tests::vllm_sync::{STEPS, greedy, train_through_vllm};
use kart_tokenizer::Tokenizer;
use serde_json::json;
use tch::Device;

/// Where the top two logits are closer than this, two correct f32 engines may pick different
/// tokens (the trained weights have no oracle's margins): tokens are compared up to that step.
const TIE: f64 = 1e-4;

#[test]
fn every_vllm_replica_serves_the_trained_weights_after_each_step() {
    let model = serving_model("serve-llama");
    let run = train_through_vllm("kart-vllm-disk", &model, &[], |config| {
        // A random model's rewards are all 0, so GRPO's advantages are too: an entropy bonus and
        // a large step size move the weights well past the tolerance in three steps.
        config["algorithm"] = json!({"entropy_coef": 0.1});
        config["optim"] = json!({"lr": 1e-3});
    });
    let last = run.weights.join(format!("v{STEPS}"));
    let initial = CausalLm::load(&model, Device::Cpu).unwrap();
    let trained = CausalLm::load(&last, Device::Cpu).unwrap();
    let tokenizer = Tokenizer::load(&model).unwrap();
    let embedded = EmbeddedEngine::spawn(
        CausalLm::load(&last, Device::Cpu).unwrap(),
        Tokenizer::load(&last).unwrap(),
        4,
        STEPS as i64,
        0,
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for replica in &run.replicas {
        for (ids, from_vllm) in run.check_served(replica, &tokenizer, &trained, &initial) {
            let from_kart = runtime.block_on(embedded.generate(greedy(&ids))).unwrap().generation;
            let gaps = score(&trained, &ids, &from_kart.token_ids).gaps;
            let n = gaps.iter().position(|&gap| gap < TIE).unwrap_or(from_kart.token_ids.len());
            assert_eq!(
                from_vllm.token_ids[..n],
                from_kart.token_ids[..n],
                "{}: greedy tokens on the trained weights (top-two logit gaps {gaps:?})",
                replica.url
            );
        }
    }
    run.finish();
}
