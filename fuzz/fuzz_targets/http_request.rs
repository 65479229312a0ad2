//! The request bodies of the rollout worker (`POST /rollout`, `POST /weights`), decoded from any
//! JSON as the services do (`kart_http::from_json`, then the type's own checks): a rejection names
//! `body` or a path into the body, and a failed check names a field.
#![no_main]

use kart_core::wire::{InvalidField, RolloutRequest, WeightSource};
use kart_http::from_json;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let Ok(body) = serde_json::from_slice::<Value>(body) else { return };
    decode(&body, RolloutRequest::validate);
    decode(&body, WeightSource::validate);
});

/// Decodes `body` as `T` and checks it with `validate`.
fn decode<T: DeserializeOwned>(body: &Value, validate: fn(&T) -> Result<(), InvalidField>) {
    match from_json::<T>(body.clone()) {
        Ok(request) => {
            if let Err(invalid) = validate(&request) {
                assert!(!invalid.field.is_empty(), "{invalid:?}");
            }
        }
        Err(error) => assert!(names_a_member(body, &error.field), "{error:?} for {body}"),
    }
}

/// Whether `field` is `body` or a path that starts at one of the body's members.
fn names_a_member(body: &Value, field: &str) -> bool {
    match body {
        _ if field == "body" => true,
        Value::Object(members) => members.keys().any(|key| {
            field
                .strip_prefix(key.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        }),
        Value::Array(_) => field.starts_with('['),
        _ => false,
    }
}
