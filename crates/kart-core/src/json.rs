//! JSON values in error messages.

use serde_json::Value;

/// The JSON type of `value` with its article ("an array", "a string", "null"), for error
/// messages naming what was found instead of what was expected.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
