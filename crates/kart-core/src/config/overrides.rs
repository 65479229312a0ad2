//! Dotted `key=value` overrides on a config, as verl's and Hydra's command lines give them
//! (`kart train --config FILE optim.lr=1e-6 batch.n=8 rollout.env.kind=tir`).
//!
//! The value is read as JSON when it parses as JSON (`8`, `1e-6`, `true`, `null`, `[1, 2]`,
//! `{"kind": "tir"}`), else as a string (`grpo`, `/data/train.parquet`). Missing objects on the
//! way are created; the config type then checks the result, so an unknown key is still an error
//! naming it.

use super::ConfigError;
use serde_json::{Map, Value};

/// Applies `overrides` (`a.b.c=value`) to `config`, in order.
pub fn apply(config: &mut Value, overrides: &[String]) -> Result<(), ConfigError> {
    for item in overrides {
        let Some((path, text)) = item.split_once('=') else {
            return Err(ConfigError::new(
                "override",
                item,
                "expected key=value (a dotted key, e.g. optim.lr=1e-6)",
            ));
        };
        let keys: Vec<&str> = path.split('.').collect();
        if keys.iter().any(|k| k.is_empty()) {
            return Err(ConfigError::new("override", item, "the key has an empty part"));
        }
        let value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
        let (last, parents) = keys.split_last().expect("split yields at least one part");
        let mut at = &mut *config;
        for (depth, key) in parents.iter().enumerate() {
            let object = match at {
                Value::Object(object) => object,
                Value::Null => {
                    *at = Value::Object(Map::new());
                    at.as_object_mut().expect("just made an object")
                }
                _ => {
                    let reason = "sets a key inside a value that is not an object";
                    return Err(ConfigError::new(keys[..depth].join("."), item, reason));
                }
            };
            at = object.entry(*key).or_insert(Value::Null);
        }
        match at {
            Value::Object(object) => {
                object.insert((*last).to_owned(), value);
            }
            Value::Null => *at = Value::Object(Map::from_iter([((*last).to_owned(), value)])),
            _ => {
                let reason = "sets a key inside a value that is not an object";
                return Err(ConfigError::new(parents.join("."), item, reason));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn applied(config: Value, overrides: &[&str]) -> Result<Value, String> {
        let mut config = config;
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        apply(&mut config, &overrides).map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn values_are_json_or_strings_and_paths_are_made() {
        let config = json!({"optim": {"lr": 1e-4, "grad_clip": 1.0}, "model": "/m"});
        let out = applied(
            config,
            &[
                "optim.lr=1e-6",
                "algorithm.advantage=grpo",
                "batch.n=8",
                "eval.every=null",
                "data.train=/d/t=1.parquet",
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"optim": {"lr": 1e-6, "grad_clip": 1.0}, "model": "/m", "algorithm": {"advantage": "grpo"},
                   "batch": {"n": 8}, "eval": {"every": null}, "data": {"train": "/d/t=1.parquet"}})
        );
        let out =
            applied(json!({}), &["rollout.env={\"kind\": \"tir\"}", "rollout.env.max_turns=2"]).unwrap();
        assert_eq!(out, json!({"rollout": {"env": {"kind": "tir", "max_turns": 2}}}));
    }

    #[test]
    fn bad_overrides_name_themselves() {
        let cases = [
            ("lr", "override = lr: expected key=value"),
            ("optim..lr=1", "override = optim..lr=1: the key has an empty part"),
            ("model.name=x", "model = model.name=x: sets a key inside a value that is not an object"),
        ];
        for (item, expected) in cases {
            let err = applied(json!({"model": "/m"}), &[item]).unwrap_err();
            assert!(err.starts_with(expected), "{item}: {err}");
        }
    }
}
