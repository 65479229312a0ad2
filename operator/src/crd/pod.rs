//! Per-workload pod overrides, shared by the three kinds.

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
    Toleration, Volume, VolumeMount,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a user may set on the pods of a workload; unset fields keep the operator's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Container image (default: the operator's `--image`, `ghcr.io/kart-dev/kart:<version>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image pull policy (`Always`, `IfNotPresent`, `Never`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Secrets for pulling the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Requests and limits, e.g. `nvidia.com/gpu: 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels the pods must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Scheduling constraints (a core/v1 `Affinity`, kept as written in the CRD's schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::object")]
    pub affinity: Option<Affinity>,
    /// Extra environment variables (after the operator's own, so they win).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra volumes (models, datasets): core/v1 `Volume`s, kept as written in the CRD's schema.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::object_list")]
    pub volumes: Vec<Volume>,
    /// Where the extra volumes are mounted in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// The container's security context, replacing the operator's (the restricted profile:
    /// non-root, a read-only root file system, no privilege escalation, no capabilities, the
    /// runtime's default seccomp profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// The pods' security context, replacing the operator's (`fsGroup` 65532, the kart image's
    /// group, so that the index, checkpoint and weight volumes the pods write are writable); `{}`
    /// leaves it to the cluster (e.g. an OpenShift SCC that assigns the group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::object")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// Service account of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Priority class of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}
