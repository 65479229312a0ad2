//! A config as an experiment tracker's parameters: its JSON flattened to dotted keys
//! (`algorithm.kl_coef`), each leaf's value as text, lists as JSON.

use serde_json::Value;

/// The leaves of `config` by dotted path, sorted by it; nulls (unset options) are left out.
pub fn flatten(config: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(config, String::new(), &mut out);
    out.sort();
    out
}

fn walk(value: &Value, path: String, out: &mut Vec<(String, String)>) {
    match value {
        Value::Null => {}
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                walk(v, path, out);
            }
        }
        Value::String(s) => out.push((path, s.clone())),
        other => out.push((path, other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn leaves_by_dotted_path_lists_as_json_and_no_nulls() {
        let config = json!({
            "model": "/models/qwen", "total_steps": 5, "lora": null, "tracking": {},
            "algorithm": {"kl_coef": 0.001, "overlong": {"buffer": null, "enabled": true}},
            "rollout": {"urls": ["http://a", "http://b"]},
        });
        assert_eq!(
            flatten(&config),
            [
                ("algorithm.kl_coef", "0.001"),
                ("algorithm.overlong.enabled", "true"),
                ("model", "/models/qwen"),
                ("rollout.urls", r#"["http://a","http://b"]"#),
                ("total_steps", "5"),
                ("tracking", "{}"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }
}
