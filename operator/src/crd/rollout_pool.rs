//! The RolloutPool kind: `kart rollout serve` workers behind a Service, scalable with `kubectl
//! scale` and an HPA, and the SGLang or vLLM servers they call.

use super::pod::PodOverrides;
use super::schema::embedded;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kart_core::config::rollout::RolloutConfig;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A pool of rollout workers.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kart.dev",
    version = "v1alpha1",
    kind = "RolloutPool",
    namespaced,
    shortname = "rp",
    status = "RolloutPoolStatus",
    doc = "A pool of rollout workers (`kart rollout serve`) and, for SGLang or vLLM, their inference servers.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.replicas >= 0", "message": "replicas must be >= 0"},
    {
        "rule": "!has(self.inference) || (has(self.config) && has(self.config.engine) && has(self.config.engine.kind) && (self.config.engine.kind == 'sglang' || self.config.engine.kind == 'vllm'))",
        "message": "spec.inference needs config.engine.kind sglang or vllm"
    },
    {
        "rule": "!has(oldSelf.config) || !has(oldSelf.config.model) || oldSelf.config.model == '' || (has(self.config) && has(self.config.model) && self.config.model == oldSelf.config.model)",
        "message": "config.model is immutable once set"
    }
]))]
pub struct RolloutPoolSpec {
    /// Worker pods (the scale subresource's `.spec.replicas`).
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// The workers' configuration, rendered into the ConfigMap they read. `host` and `port` are
    /// set by the operator; `retriever_url` from `retrieverRef` when unset; the engine's `urls`
    /// from `inference` when empty; `weight_sources`, when open, admits the namespace's trainers
    /// (`http://*-trainer.<namespace>.svc:8002/weights/`) and files under `/var/lib/kart/weights`.
    #[serde(default)]
    #[schemars(schema_with = "embedded::<RolloutConfig>")]
    pub config: RolloutConfig,
    /// A Retriever in the same namespace whose endpoint becomes `config.retriever_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retriever_ref: Option<String>,
    /// Inference servers the operator runs for an `sglang` or `vllm` engine (model volume, GPUs,
    /// arguments); unset when `config.engine.urls` points at servers run elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference: Option<InferenceServer>,
    /// Run no workers (and no inference servers) until a TrainingJob that names this pool is
    /// running: for a pool that serves only TrainingJobs behind a Kueue queue, so that it holds no
    /// GPUs while they wait. Such TrainingJobs are queued against a held pool (phase `Held`);
    /// once Kueue admits one, the pool scales to `replicas` while its trainer starts (the
    /// trainer's rollout requests wait for ready workers up to `rollout.retry_deadline_secs`),
    /// and back to zero when none runs.
    #[serde(default)]
    pub hold_until_admitted: bool,
    /// Overrides of the worker pods.
    #[serde(default)]
    pub pod: PodOverrides,
}

/// An SGLang or vLLM server Deployment and its Service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceServer {
    /// Server pods.
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Extra server arguments (e.g. `--tp-size 2`, `--mem-fraction-static 0.8`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Overrides of the server pods: image (default `lmsysorg/sglang:latest` or
    /// `vllm/vllm-openai:latest`), GPUs, the model volume.
    #[serde(default)]
    pub pod: PodOverrides,
}

fn one() -> i32 {
    1
}

/// Lifecycle of a RolloutPool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPoolPhase {
    /// Nothing reconciled yet.
    #[default]
    Pending,
    /// Pods start.
    Progressing,
    /// All workers (and inference servers) serve.
    Ready,
    /// `holdUntilAdmitted`: no TrainingJob of the pool runs, so neither do its pods.
    Held,
    /// The spec is invalid.
    Failed,
}

/// Observed state of a RolloutPool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPoolStatus {
    /// Lifecycle phase.
    #[serde(default)]
    pub phase: RolloutPoolPhase,
    /// Worker pods (the scale subresource's `.status.replicas`).
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods that pass their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the worker pods (the scale subresource's `.status.selector`, for HPAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The URL the trainer reaches the pool at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `ValidationFailed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
