//! The Retriever kind: a `kart retriever serve` Deployment behind a Service, its index built once
//! by a Job.

use super::pod::PodOverrides;
use super::schema::embedded;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kart_core::config::retriever::{AnnConfig, RetrieverConfig};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A retriever service (Search-R1's `/retrieve` API).
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kart.dev",
    version = "v1alpha1",
    kind = "Retriever",
    namespaced,
    shortname = "ret",
    status = "RetrieverStatus",
    doc = "A retriever service: `kart retriever serve` behind a Service, with its index built by a Job.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Documents","type":"integer","jsonPath":".status.documentsIndexed"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.config) || !has(self.config.topk) || (self.config.topk >= 1 && self.config.topk <= 1000)",
        "message": "config.topk must be between 1 and 1000"
    },
    {
        "rule": "!has(self.config) || !has(self.config.method) || self.config.method == 'serper' || has(self.corpus) || (has(self.index) && has(self.index.prebuilt) && self.index.prebuilt)",
        "message": "a bm25 or dense retriever needs spec.corpus to build its index (or index.prebuilt: true)"
    },
    {
        "rule": "!has(self.index) || !has(self.index.ann) || (has(self.config) && has(self.config.method) && self.config.method == 'dense' && !(has(self.index.prebuilt) && self.index.prebuilt))",
        "message": "index.ann builds an approximate graph over a dense index the Job builds: config.method must be dense and index.prebuilt false"
    },
    {
        "rule": "!has(self.config) || !has(self.config.method) || self.config.method != 'dense' || (has(self.config.encoder) && has(self.config.encoder.model))",
        "message": "a dense retriever needs config.encoder.model"
    }
]))]
pub struct RetrieverSpec {
    /// The retriever's configuration, rendered into the ConfigMap the pods read. `index`, `host`
    /// and `port` are set by the operator.
    #[serde(default)]
    #[schemars(schema_with = "embedded::<RetrieverConfig>")]
    pub config: RetrieverConfig,
    /// The corpus file (Search-R1 JSON lines, optionally gzipped) the index-build Job reads, as
    /// the pods see it (mount it with `pod.volumes` and `pod.volumeMounts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus: Option<String>,
    /// The index volume.
    #[serde(default)]
    pub index: IndexVolume,
    /// Serving pods.
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Overrides of the serving pods and the index-build Job's pod.
    #[serde(default)]
    pub pod: PodOverrides,
}

/// Where the index lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexVolume {
    /// An existing PersistentVolumeClaim; when unset the operator creates `<name>-retriever-index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_claim: Option<String>,
    /// Size of the claim the operator creates.
    #[serde(default = "default_index_size")]
    pub size: String,
    /// Storage class of the claim the operator creates (the cluster default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Access modes of the claim the operator creates (`ReadOnlyMany`-capable storage lets
    /// replicas on several nodes share it).
    #[serde(default = "default_access_modes")]
    pub access_modes: Vec<String>,
    /// The claim already holds an index: no index-build Job runs.
    #[serde(default)]
    pub prebuilt: bool,
    /// A dense index's approximate graph (HNSW), built by the index-build Job after the
    /// embeddings (`kart retriever index --ann hnsw`) and searched instead of the exact scan, with
    /// `config.ann_expansion_search` and `config.ann_rerank`; for corpora a flat scan cannot serve.
    /// Read when the Job runs: an index already built keeps what it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<AnnConfig>")]
    pub ann: Option<AnnConfig>,
}

impl Default for IndexVolume {
    fn default() -> Self {
        IndexVolume {
            existing_claim: None,
            size: default_index_size(),
            storage_class_name: None,
            access_modes: default_access_modes(),
            prebuilt: false,
            ann: None,
        }
    }
}

fn one() -> i32 {
    1
}

fn default_index_size() -> String {
    "10Gi".into()
}

fn default_access_modes() -> Vec<String> {
    vec!["ReadWriteOnce".into()]
}

/// Lifecycle of a Retriever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RetrieverPhase {
    /// Nothing reconciled yet.
    #[default]
    Pending,
    /// The index-build Job runs.
    Indexing,
    /// Pods start.
    Progressing,
    /// All replicas serve.
    Ready,
    /// The index-build Job failed, or the spec is invalid.
    Failed,
}

/// Observed state of a Retriever.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetrieverStatus {
    /// Lifecycle phase.
    #[serde(default)]
    pub phase: RetrieverPhase,
    /// The index-build Job succeeded (or the index was prebuilt or is not needed); the Job is not
    /// run again.
    #[serde(default)]
    pub index_built: bool,
    /// Passages in the index, as the index-build Job reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents_indexed: Option<u64>,
    /// Serving pods.
    #[serde(default)]
    pub replicas: i32,
    /// Serving pods that pass their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The URL clients reach the retriever at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `ValidationFailed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
