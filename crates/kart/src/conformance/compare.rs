//! Comparison of computed values against a conformance case's `expect` fields, reporting the first
//! difference, and typed access to a case's input fields.

use serde_json::Value;
use std::fmt;

/// Why a case did not pass: the first difference found, or an input field that is missing or of the
/// wrong type.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch(pub String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Mismatch {}

/// Compares `actual` with `expect`: strings byte for byte, booleans and nulls exactly, numbers within
/// `tol` (absolute), arrays element by element, objects key by key (keys of `expect` only).
/// `path` names the compared field in the report, e.g. `expect.qa_em`.
pub fn compare(path: &str, expect: &Value, actual: &Value, tol: f64) -> Result<(), Mismatch> {
    match (expect, actual) {
        (Value::Number(e), Value::Number(a)) => {
            let (e, a) = (e.as_f64().unwrap_or(f64::NAN), a.as_f64().unwrap_or(f64::NAN));
            if (e - a).abs() <= tol || (e.is_nan() && a.is_nan()) {
                Ok(())
            } else {
                Err(Mismatch(format!(
                    "{path}: expected {e}, got {a} (|diff| {:.3e} > {tol:e})",
                    (e - a).abs()
                )))
            }
        }
        (Value::String(e), Value::String(a)) => {
            if e == a {
                Ok(())
            } else {
                Err(Mismatch(format!("{path}: {}", string_difference(e, a))))
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                return Err(Mismatch(format!("{path}: expected {} elements, got {}", e.len(), a.len())));
            }
            e.iter()
                .zip(a)
                .enumerate()
                .try_for_each(|(i, (e, a))| compare(&format!("{path}[{i}]"), e, a, tol))
        }
        (Value::Object(e), Value::Object(a)) => e.iter().try_for_each(|(k, e)| match a.get(k) {
            Some(a) => compare(&format!("{path}.{k}"), e, a, tol),
            None => Err(Mismatch(format!("{path}.{k}: missing from the computed result"))),
        }),
        (e, a) if e == a => Ok(()),
        (e, a) => Err(Mismatch(format!("{path}: expected {}, got {}", short(e), short(a)))),
    }
}

/// Describes where two different strings first differ, with a little context on each side.
pub fn string_difference(expect: &str, actual: &str) -> String {
    let at = expect
        .char_indices()
        .zip(actual.chars())
        .find(|((_, e), a)| e != a)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| expect.len().min(actual.len()));
    let window = |s: &str| -> String {
        let start = s.char_indices().map(|(i, _)| i).filter(|&i| i <= at).rev().nth(20).unwrap_or(0);
        s[start.min(s.len())..].chars().take(60).collect()
    };
    format!(
        "strings differ at byte {at} (expected {} bytes, got {}): expected …{:?}…, got …{:?}…",
        expect.len(),
        actual.len(),
        window(expect),
        window(actual)
    )
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 { format!("{}…", s.chars().take(120).collect::<String>()) } else { s }
}

/// The field `name` of a case, or a [`Mismatch`] naming it.
pub fn field<'a>(case: &'a Value, name: &str) -> Result<&'a Value, Mismatch> {
    case.get(name).ok_or_else(|| Mismatch(format!("input field `{name}` is missing")))
}

/// The string field `name` of a case.
pub fn str_field<'a>(case: &'a Value, name: &str) -> Result<&'a str, Mismatch> {
    field(case, name)?
        .as_str()
        .ok_or_else(|| Mismatch(format!("input field `{name}` is not a string: {}", short(&case[name]))))
}

/// The numeric field `name` of a case.
pub fn f64_field(case: &Value, name: &str) -> Result<f64, Mismatch> {
    field(case, name)?
        .as_f64()
        .ok_or_else(|| Mismatch(format!("input field `{name}` is not a number: {}", short(&case[name]))))
}

/// Deserialises the field `name` of a case into `T`.
pub fn typed_field<T: serde::de::DeserializeOwned>(case: &Value, name: &str) -> Result<T, Mismatch> {
    T::deserialize(field(case, name)?)
        .map_err(|e| Mismatch(format!("input field `{name}` has the wrong shape: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_within_tolerance_pass_and_outside_fail() {
        assert!(compare("x", &json!(1.0), &json!(1.0 + 1e-10), 1e-9).is_ok());
        let err = compare("x", &json!(1.0), &json!(1.1), 1e-9).unwrap_err();
        assert!(err.0.starts_with("x: expected 1, got 1.1"), "{err}");
    }

    #[test]
    fn integer_and_float_forms_compare_equal() {
        assert!(compare("x", &json!(0), &json!(0.0), 0.0).is_ok());
    }

    #[test]
    fn nested_difference_names_its_path() {
        let err = compare("expect", &json!({"a": [1, 2]}), &json!({"a": [1, 3]}), 1e-9).unwrap_err();
        assert!(err.0.starts_with("expect.a[1]:"), "{err}");
        let err = compare("expect", &json!({"a": 1}), &json!({}), 1e-9).unwrap_err();
        assert!(err.0.contains("expect.a: missing"), "{err}");
    }

    #[test]
    fn string_difference_points_at_first_differing_byte() {
        let err = compare("s", &json!("hello world"), &json!("hello wOrld"), 0.0).unwrap_err();
        assert!(err.0.contains("differ at byte 7"), "{err}");
        let err = compare("s", &json!("abc"), &json!("ab"), 0.0).unwrap_err();
        assert!(err.0.contains("differ at byte 2"), "{err}");
    }

    #[test]
    fn null_and_bool_compare_exactly() {
        assert!(compare("x", &json!(null), &json!(null), 0.0).is_ok());
        assert!(compare("x", &json!(null), &json!("a"), 0.0).is_err());
        assert!(compare("x", &json!(true), &json!(false), 0.0).is_err());
    }
}
