//! Structural schemas of the embedded worker configs.
//!
//! The worker's config types derive `JsonSchema` for plain JSON Schema. A CRD needs a
//! *structural* schema: every node typed, no `$ref`, no `const`, no `additionalProperties` beside
//! `properties`, and no types or properties inside `oneOf`/`anyOf`. [`embedded`] rewrites the
//! config schemas accordingly:
//! - internally tagged enums (`kind`) become one object with the union of the variants' properties,
//!   the tag an `enum` of the variants' names (the operator deserialises the config into the typed
//!   struct, so a field of the wrong variant is still rejected, as a `ValidationFailed` condition);
//! - documented unit enums (`oneOf` of `const`s) become string `enum`s; `Option`s become
//!   `nullable`;
//! - free-form JSON (`serde_json::Value`), and a union of variants of different types, becomes
//!   `x-kubernetes-preserve-unknown-fields`;
//! - `default`s are dropped: the worker applies its serde defaults when it reads the rendered
//!   config (one definition of them), and some depend on the machine (the sandbox's concurrency).

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

/// The structural schema of config type `T`, for `#[schemars(schema_with = "...")]`.
pub fn embedded<T: JsonSchema>(_: &mut SchemaGenerator) -> Schema {
    let generator = SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    if let Some(o) = value.as_object_mut() {
        o.remove("title");
        o.remove("$schema");
    }
    structural(&mut value);
    Schema::try_from(value).expect("a rewritten schema is an object")
}

/// Rewrites one schema node (and its children) into structural form.
fn structural(node: &mut Value) {
    if node.as_bool().is_some() || node.as_object().is_some_and(|o| o.is_empty()) {
        *node = json!({"x-kubernetes-preserve-unknown-fields": true});
        return;
    }
    let Some(o) = node.as_object_mut() else { return };
    o.remove("default");
    o.remove("examples");
    if o.get("additionalProperties") == Some(&Value::Bool(false)) {
        o.remove("additionalProperties");
    }
    if let Some(c) = o.remove("const") {
        o.insert("enum".into(), json!([c]));
    }
    // `type: [X, "null"]` -> `type: X, nullable: true`.
    if let Some(Value::Array(types)) = o.get("type").cloned() {
        let non_null: Vec<_> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
        if non_null.len() < types.len() {
            o.insert("nullable".into(), Value::Bool(true));
        }
        if let [only] = non_null.as_slice() {
            o.insert("type".into(), only.clone());
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(mut variants)) = o.remove(key) {
            variants.iter_mut().for_each(structural);
            let null = |v: &Value| {
                v.get("type").and_then(Value::as_str) == Some("null")
                    || v.get("enum") == Some(&json!([null]))
                    || v.get("nullable") == Some(&Value::Bool(true)) && v.get("type").is_none()
            };
            if variants.iter().any(null) {
                o.insert("nullable".into(), Value::Bool(true));
                variants.retain(|v| !null(v));
            }
            merge_variants(o, variants);
        }
    }
    if o.contains_key("enum") && !o.contains_key("type") {
        let ty = match o["enum"].as_array().and_then(|e| e.iter().find(|v| !v.is_null())) {
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => "integer",
            Some(Value::Number(_)) => "number",
            Some(Value::Bool(_)) => "boolean",
            _ => "string",
        };
        o.insert("type".into(), ty.into());
    }
    if let Some(Value::Object(props)) = o.get_mut("properties") {
        props.values_mut().for_each(structural);
        o.entry("type").or_insert("object".into());
    }
    if let Some(items) = o.get_mut("items") {
        structural(items);
    }
    if let Some(extra) = o.get_mut("additionalProperties")
        && extra.is_object()
    {
        structural(extra);
    }
    if !o.contains_key("type")
        && !o.contains_key("x-kubernetes-int-or-string")
        && !o.contains_key("x-kubernetes-preserve-unknown-fields")
    {
        o.insert("x-kubernetes-preserve-unknown-fields".into(), Value::Bool(true));
    }
}

/// Folds the (already structural) variants of a `oneOf`/`anyOf` into `o`: a single variant is
/// merged in; several are merged property by property, string enums united.
fn merge_variants(o: &mut Map<String, Value>, variants: Vec<Value>) {
    // Variants of different types (LoRA's `target_modules`: `all-linear` or a list) are left open
    // to any value, and the worker's own parsing of the config checks it.
    let types: Vec<Option<&Value>> = variants.iter().map(|v| v.get("type")).collect();
    if types.windows(2).any(|pair| pair[0] != pair[1]) {
        o.insert("x-kubernetes-preserve-unknown-fields".into(), Value::Bool(true));
        return;
    }
    let mut required: Option<Vec<Value>> = None;
    for variant in variants {
        let Value::Object(mut v) = variant else { continue };
        let variant_required = v.remove("required").and_then(|r| r.as_array().cloned()).unwrap_or_default();
        required = Some(match required {
            None => variant_required,
            Some(r) => r.into_iter().filter(|x| variant_required.contains(x)).collect(),
        });
        if let Some(Value::Array(values)) = v.remove("enum") {
            let all = o.entry("enum").or_insert_with(|| json!([]));
            for value in values {
                let all = all.as_array_mut().expect("enum is an array");
                if !all.contains(&value) {
                    all.push(value);
                }
            }
        }
        if let Some(Value::Object(props)) = v.remove("properties") {
            let all = o.entry("properties").or_insert_with(|| json!({}));
            let all = all.as_object_mut().expect("properties is an object");
            for (name, prop) in props {
                match all.get_mut(&name) {
                    None => {
                        all.insert(name, prop);
                    }
                    Some(existing) => unite_enums(existing, &prop),
                }
            }
        }
        v.remove("description");
        for (k, value) in v {
            o.entry(k).or_insert(value);
        }
    }
    if let Some(required) = required.filter(|r| !r.is_empty()) {
        o.insert("required".into(), Value::Array(required));
    }
}

/// A property several variants define: a tag's `enum`s united; a property the variants define
/// differently (ASearcher's `reward: "f1"` against Search-R1's reward weights) is left open to
/// any value, and the worker's own parsing of the config checks it.
fn unite_enums(existing: &mut Value, other: &Value) {
    if existing == other {
        return;
    }
    if let (Some(Value::Array(a)), Some(Value::Array(b))) = (existing.get_mut("enum"), other.get("enum")) {
        for v in b {
            if !a.contains(v) {
                a.push(v.clone());
            }
        }
        return;
    }
    *existing = json!({"x-kubernetes-preserve-unknown-fields": true});
}

/// A list of objects kept as written (`Volume`s): their full schema would more than double the
/// size of every CRD; the API server validates them in the pods the operator creates.
pub fn object_list(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// An object kept as written (`Affinity`), for the same reason as [`object_list`].
pub fn object(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({"type": "object", "nullable": true, "x-kubernetes-preserve-unknown-fields": true})
}
