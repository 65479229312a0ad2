//! The custom resources (`kart.dev/v1alpha1`) and their CustomResourceDefinitions.
//!
//! - [`retriever`], [`rollout_pool`], [`training_job`]: the three kinds;
//! - [`pod`]: the pod overrides they share; [`condition`]: status conditions;
//! - [`kueue`]: the parts of Kueue's API a queued TrainingJob uses;
//! - `schema`: structural schemas of the embedded worker configs.

pub mod condition;
pub mod kueue;
pub mod pod;
pub mod retriever;
pub mod rollout_pool;
pub mod schema;
pub mod training_job;

pub use retriever::{Retriever, RetrieverSpec, RetrieverStatus};
pub use rollout_pool::{RolloutPool, RolloutPoolSpec, RolloutPoolStatus};
pub use training_job::{TrainingJob, TrainingJobSpec, TrainingJobStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

/// Every CRD of the operator.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![Retriever::crd(), RolloutPool::crd(), TrainingJob::crd()];
    for crd in &mut crds {
        drop_config_default(crd);
        for version in &mut crd.spec.versions {
            if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
                drop_unknown_formats(schema);
            }
        }
    }
    crds
}

/// The `format`s the API server knows (k8s.io/apiextensions-apiserver's validation); it warns on
/// every apply of a CRD with any other.
const KUBERNETES_FORMATS: &[&str] =
    &["int32", "int64", "float", "double", "byte", "date", "date-time", "duration"];

/// Drops the formats the API server does not know from `schema` and everything below it: schemars
/// marks unsigned integers `uint`, `uint16`, `uint32` or `uint64` (their `minimum: 0` stays).
fn drop_unknown_formats(schema: &mut JSONSchemaProps) {
    if schema.format.as_deref().is_some_and(|f| !KUBERNETES_FORMATS.contains(&f)) {
        schema.format = None;
    }
    let below = schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .chain(schema.all_of.iter_mut().flatten())
        .chain(schema.any_of.iter_mut().flatten())
        .chain(schema.one_of.iter_mut().flatten())
        .chain(schema.not.as_deref_mut())
        .chain(match &mut schema.items {
            Some(JSONSchemaPropsOrArray::Schema(item)) => vec![item.as_mut()],
            Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().collect(),
            None => Vec::new(),
        })
        .chain(match &mut schema.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(value)) => Some(value.as_mut()),
            _ => None,
        });
    for child in below {
        drop_unknown_formats(child);
    }
}

/// Drops the default of `spec.config`: the worker's serde defaults apply when it reads the
/// rendered config (one definition of them), and some depend on the machine that generates the
/// schema (the Python sandbox's concurrency).
fn drop_config_default(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        let config = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("config"));
        if let Some(config) = config {
            config.default = None;
        }
    }
}

/// The CRDs as one multi-document YAML stream (what `kart-operator crds` prints and `crds/`
/// holds). Object keys are sorted, so the output does not depend on whether `serde_json` keeps
/// insertion order (a feature other crates of a build may turn on).
pub fn yaml() -> String {
    all()
        .iter()
        .map(|crd| {
            let value = sorted(serde_json::to_value(crd).expect("a CRD serialises to JSON"));
            let yaml = serde_saphyr::to_string(&value).expect("a CRD serialises to YAML");
            format!("---\n{yaml}")
        })
        .collect()
}

/// `value` with the keys of every object in sorted order.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
