//! The request bodies of the rollout worker (`POST /rollout`, `POST /weights`) and the retriever
//! (`POST /retrieve`, `POST /access`), decoded from any JSON as the services do: a rejection names
//! `body` or a path into the body, and a failed check names a field.
#![no_main]

use kart_core::wire::{AccessRequest, InvalidField, RetrieveLimits, RetrieveRequest, RolloutRequest, WeightSource};
use kart_http::from_json;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Small limits, so the fuzzer reaches them.
const LIMITS: RetrieveLimits = RetrieveLimits { default_topk: 3, max_queries: 8, max_results: 20 };

fuzz_target!(|body: &[u8]| {
    let Ok(body) = serde_json::from_slice::<Value>(body) else { return };
    decode(&body, RolloutRequest::validate);
    decode(&body, WeightSource::validate);
    match RetrieveRequest::parse(&body, &LIMITS) {
        Ok(request) => {
            assert!(request.queries.len() <= LIMITS.max_queries);
            let k = request.topk.unwrap_or(LIMITS.default_topk);
            assert!(k >= 1 && request.queries.len() * k <= LIMITS.max_results, "{request:?}");
        }
        Err(invalid) => assert!(names_a_member(&body, &invalid.field), "{invalid:?} for {body}"),
    }
    if let Err(invalid) = AccessRequest::parse(&body) {
        assert!(names_a_member(&body, &invalid.field), "{invalid:?} for {body}");
    }
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

/// Whether `field` is `body` or a path that starts at one of the body's members, or names a
/// member the request should have had (a missing `queries`).
fn names_a_member(body: &Value, field: &str) -> bool {
    match body {
        _ if field == "body" => true,
        Value::Object(members) => {
            ["queries", "urls"].contains(&field)
                || members.keys().any(|key| {
                    field
                        .strip_prefix(key.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
                })
        }
        Value::Array(_) => field.starts_with('['),
        _ => false,
    }
}
