//! The CRDs: `crds/` matches `kart-operator crds`, every schema is structural, and the CEL rules
//! accept valid specs and reject invalid ones (evaluated offline with kube's `cel` feature).

use kart_operator::crd;
use serde_json::{Value, json};
use std::path::PathBuf;

/// The repository's root, from the package folder cargo names when it runs the test (a target
/// folder shared between clones must not send one clone's test to another's files).
fn repo() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

fn checked_in() -> PathBuf {
    repo().join("crds/kart.dev_crds.yaml")
}

#[test]
fn crds_folder_matches_the_generated_crds() {
    let generated = crd::yaml();
    let stored = std::fs::read_to_string(checked_in()).unwrap_or_default();
    assert!(
        stored == generated,
        "crds/kart.dev_crds.yaml is stale: run `cargo run --release -p kart-operator -- crds > crds/kart.dev_crds.yaml`"
    );
}

fn schema(kind: &str) -> Value {
    let crd = crd::all().into_iter().find(|c| c.spec.names.kind == kind).expect("kind");
    serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
        .unwrap()
}

/// The structural-schema rules of apiextensions.k8s.io/v1, for `node` at `path`.
fn check_structural(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(o) = node.as_object() else {
        errors.push(format!("{path}: not an object"));
        return;
    };
    let typed = o.contains_key("type")
        || o.contains_key("x-kubernetes-int-or-string")
        || o.contains_key("x-kubernetes-preserve-unknown-fields");
    if !typed {
        errors.push(format!("{path}: no type"));
    }
    for key in ["$ref", "const", "oneOf", "anyOf", "allOf", "not", "uniqueItems"] {
        if o.contains_key(key)
            && (key != "oneOf" && key != "anyOf" && key != "allOf" || has_forbidden_in_junctor(&o[key]))
        {
            errors.push(format!("{path}: {key}"));
        }
    }
    if o.contains_key("properties") && o.contains_key("additionalProperties") {
        errors.push(format!("{path}: properties and additionalProperties"));
    }
    if let Some(Value::Object(props)) = o.get("properties") {
        if o.get("type").and_then(Value::as_str) != Some("object") {
            errors.push(format!("{path}: properties without type object"));
        }
        for (k, v) in props {
            check_structural(v, &format!("{path}.{k}"), errors);
        }
    }
    if let Some(items) = o.get("items") {
        check_structural(items, &format!("{path}[]"), errors);
    }
    if let Some(extra @ Value::Object(_)) = o.get("additionalProperties") {
        check_structural(extra, &format!("{path}{{}}"), errors);
    }
}

/// Whether a junctor's subschemas set what only the structural skeleton may set.
fn has_forbidden_in_junctor(junctor: &Value) -> bool {
    junctor.as_array().into_iter().flatten().any(|s| {
        ["type", "description", "default", "additionalProperties", "nullable", "properties"]
            .iter()
            .any(|k| s.get(k).is_some())
    })
}

#[test]
fn every_schema_is_structural() {
    for kind in ["Retriever", "RolloutPool", "TrainingJob"] {
        let mut errors = Vec::new();
        check_structural(&schema(kind), kind, &mut errors);
        assert!(errors.is_empty(), "{kind} is not structural: {errors:#?}");
    }
}

#[test]
fn subresources_and_printer_columns() {
    let crds = crd::all();
    for c in &crds {
        let v = &c.spec.versions[0];
        assert!(
            v.subresources.as_ref().unwrap().status.is_some(),
            "{} has a status subresource",
            c.spec.names.kind
        );
        let columns: Vec<_> =
            v.additional_printer_columns.iter().flatten().map(|c| c.name.as_str()).collect();
        assert!(columns.contains(&"Phase") && columns.contains(&"Age"), "{columns:?}");
    }
    let pool = crds.iter().find(|c| c.spec.names.kind == "RolloutPool").unwrap();
    let scale = pool.spec.versions[0].subresources.as_ref().unwrap().scale.as_ref().unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
    let short: Vec<_> = crds.iter().map(|c| c.spec.names.short_names.clone().unwrap()[0].clone()).collect();
    assert_eq!(short, ["ret", "rp", "tj"]);
    let tj = crds.iter().find(|c| c.spec.names.kind == "TrainingJob").unwrap();
    let columns: Vec<_> =
        tj.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(columns, ["Phase", "Queue", "Ranks", "Step", "Reward", "EvalEM", "Age"]);
}

fn object(kind: &str, spec: Value) -> Value {
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": kind, "metadata": {"name": "x", "namespace": "ml"}, "spec": spec})
}

/// `schema` with its rules in kube-cel's field-name escaping: kube-cel 0.8 escapes every `_` in
/// a property name as `__`, where the API server keeps a single `_` (and escapes only `__`), so
/// `self.config.algorithm.clip_ratio_low` reads `clip__ratio__low` there.
fn for_kube_cel(mut schema: Value) -> Value {
    fn walk(node: &mut Value) {
        match node {
            Value::Object(o) => {
                if let Some(Value::Array(rules)) = o.get_mut("x-kubernetes-validations") {
                    for rule in rules {
                        if let Some(Value::String(r)) = rule.get_mut("rule") {
                            *r = escape_underscores(r);
                        }
                    }
                }
                o.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut schema);
    schema
}

/// `a_b` -> `a__b` inside identifiers (between two alphanumeric characters).
fn escape_underscores(rule: &str) -> String {
    let chars: Vec<char> = rule.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let between =
            i > 0 && i + 1 < chars.len() && chars[i - 1].is_alphanumeric() && chars[i + 1].is_alphanumeric();
        if c == '_' && between {
            out.push_str("__");
        } else {
            out.push(c);
        }
    }
    out
}

/// The messages of the rules `spec` breaks (after `old`, for transition rules).
fn violations(kind: &str, spec: Value, old: Option<Value>) -> Vec<String> {
    let old = old.map(|o| object(kind, o));
    let schema = for_kube_cel(schema(kind));
    match kube::core::cel::Validator::new().validate(&schema, &object(kind, spec), old.as_ref()) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| format!("{} ({:?}: {})", e.message, e.kind, e.rule)).collect(),
    }
}

fn assert_rejected(kind: &str, spec: Value, old: Option<Value>, message: &str) {
    let v = violations(kind, spec, old);
    assert!(v.iter().any(|m| m.contains(message)), "expected `{message}`, got {v:?}");
}

#[test]
fn retriever_rules() {
    let valid = json!({"config": {"method": "bm25", "topk": 5}, "corpus": "/data/c.jsonl"});
    assert_eq!(violations("Retriever", valid, None), Vec::<String>::new());
    assert_eq!(violations("Retriever", json!({"config": {"method": "serper"}}), None), Vec::<String>::new());
    assert_rejected(
        "Retriever",
        json!({"config": {"topk": 0}, "corpus": "/c"}),
        None,
        "topk must be between 1 and 1000",
    );
    assert_rejected(
        "Retriever",
        json!({"config": {"topk": 1001}, "corpus": "/c"}),
        None,
        "topk must be between 1 and 1000",
    );
    assert_rejected("Retriever", json!({"config": {"method": "bm25"}}), None, "needs spec.corpus");
    assert_rejected(
        "Retriever",
        json!({"config": {"method": "dense"}, "corpus": "/c"}),
        None,
        "needs config.encoder.model",
    );
    let dense = json!({"config": {"method": "dense", "encoder": {"model": "/m"}}, "corpus": "/c",
        "index": {"ann": {"connectivity": 16, "quantization": "f16"}}});
    assert_eq!(violations("Retriever", dense.clone(), None), Vec::<String>::new());
    let mut bm25 = dense.clone();
    bm25["config"] = json!({"method": "bm25"});
    assert_rejected("Retriever", bm25, None, "index.ann builds an approximate graph over a dense index");
    let mut prebuilt = dense;
    prebuilt["index"]["prebuilt"] = json!(true);
    assert_rejected("Retriever", prebuilt, None, "index.prebuilt false");
}

#[test]
fn rollout_pool_rules() {
    let valid = json!({"replicas": 2, "config": {"model": "/m", "engine": {"kind": "sglang", "urls": []}}, "inference": {}});
    assert_eq!(violations("RolloutPool", valid.clone(), None), Vec::<String>::new());
    assert_rejected(
        "RolloutPool",
        json!({"replicas": -1, "config": {"model": "/m"}}),
        None,
        "replicas must be >= 0",
    );
    assert_rejected(
        "RolloutPool",
        json!({"config": {"model": "/m", "engine": {"kind": "embedded"}}, "inference": {}}),
        None,
        "spec.inference needs config.engine.kind sglang or vllm",
    );
    let moved = json!({"replicas": 2, "config": {"model": "/other", "engine": {"kind": "sglang", "urls": []}}, "inference": {}});
    assert_rejected("RolloutPool", moved, Some(valid.clone()), "config.model is immutable once set");
    let scaled = json!({"replicas": 5, "config": {"model": "/m", "engine": {"kind": "sglang", "urls": []}}, "inference": {}});
    assert_eq!(violations("RolloutPool", scaled, Some(valid)), Vec::<String>::new());
}

#[test]
fn training_job_rules() {
    let valid = json!({"config": {"model": "/m", "data": {"train": "/t.parquet"}, "algorithm": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}}});
    assert_eq!(violations("TrainingJob", valid.clone(), None), Vec::<String>::new());
    assert_rejected(
        "TrainingJob",
        json!({"config": {"data": {"train": "/t"}}}),
        None,
        "config.model (a Hugging Face folder) is required",
    );
    assert_rejected(
        "TrainingJob",
        json!({"config": {"model": "/m", "algorithm": {"clip_ratio_low": 1.5}}}),
        None,
        "clip_ratio_low must be in (0, 1)",
    );
    assert_rejected(
        "TrainingJob",
        json!({"config": {"model": "/m", "algorithm": {"clip_ratio_high": 0.0}}}),
        None,
        "clip_ratio_high must be positive",
    );
    assert_rejected(
        "TrainingJob",
        json!({"config": {"model": "/m", "algorithm": {"clip_ratio_c": 1.0}}}),
        None,
        "clip_ratio_c must be greater than 1",
    );
    let other_model = json!({"config": {"model": "/other", "data": {"train": "/t.parquet"}}});
    assert_rejected("TrainingJob", other_model, Some(valid.clone()), "config.model is immutable");
    let suspended = json!({"suspend": true, "config": {"model": "/m", "data": {"train": "/t.parquet"}}});
    assert_eq!(violations("TrainingJob", suspended, Some(valid)), Vec::<String>::new());
}

#[test]
fn readme_examples_are_valid_resources() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme.find("## Kubernetes").expect("a Kubernetes section")..];
    let start = section.find("```yaml\n").expect("a YAML example") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").unwrap()];
    let mut kinds = Vec::new();
    for doc in yaml.split("\n---\n") {
        let mut value: Value = serde_saphyr::from_str(doc).unwrap();
        value["metadata"]["namespace"] = json!("ml");
        let kind = value["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "Retriever" => {
                kart_operator::build::retriever::validate(&serde_json::from_value(value).unwrap()).unwrap()
            }
            "RolloutPool" => {
                kart_operator::build::rollout_pool::validate(&serde_json::from_value(value).unwrap()).unwrap()
            }
            "TrainingJob" => {
                kart_operator::build::training_job::validate(&serde_json::from_value(value).unwrap()).unwrap()
            }
            other => panic!("unexpected kind {other}"),
        }
        kinds.push(kind);
    }
    assert_eq!(kinds, ["Retriever", "RolloutPool", "TrainingJob"]);
}
