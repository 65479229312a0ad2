//! The retriever's request bodies: Search-R1's `/retrieve` (`QueryRequest`: queries, topk,
//! return_scores) and kart's `/access` (urls), decoded from any JSON with each bad field named.

use super::InvalidField;
use crate::config::retriever::MAX_TOPK;
use serde_json::Value;

/// The fields of a `/retrieve` request.
const RETRIEVE_FIELDS: [&str; 3] = ["queries", "topk", "return_scores"];

/// How much one `/retrieve` request may ask for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrieveLimits {
    /// Results per query when `topk` is absent or null.
    pub default_topk: usize,
    /// Most queries.
    pub max_queries: usize,
    /// Most results (queries x topk).
    pub max_results: usize,
}

/// A `/retrieve` request.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrieveRequest {
    pub queries: Vec<String>,
    /// Results per query; `None`: the server's default.
    pub topk: Option<usize>,
    /// Whether results carry scores (`{"document", "score"}`) or are bare documents.
    pub return_scores: bool,
}

impl RetrieveRequest {
    /// Decodes `body` within `limits`; unknown fields are refused by name.
    pub fn parse(body: &Value, limits: &RetrieveLimits) -> Result<Self, InvalidField> {
        let obj = body.as_object().ok_or_else(|| InvalidField::new("body", "expected a JSON object"))?;
        if let Some(unknown) = obj.keys().find(|k| !RETRIEVE_FIELDS.contains(&k.as_str())) {
            return Err(InvalidField::new(
                unknown.as_str(),
                format!("unknown field; a request has {}", RETRIEVE_FIELDS.join(", ")),
            ));
        }
        let queries = strings(obj.get("queries"), "queries")?;
        if queries.len() > limits.max_queries {
            return Err(InvalidField::new(
                "queries",
                format!("{} queries; at most {} per request", queries.len(), limits.max_queries),
            ));
        }
        // Search-R1's server reads a missing, null or 0 `topk` as its default (`if not request.topk`).
        let topk = match obj.get("topk") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(0) => None,
                Some(k) if k <= MAX_TOPK as u64 => Some(k as usize),
                _ => {
                    return Err(InvalidField::new(
                        "topk",
                        format!("expected an integer from 0 (the default) to {MAX_TOPK} or null, got {v}"),
                    ));
                }
            },
        };
        let return_scores = match obj.get("return_scores") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(InvalidField::new("return_scores", format!("expected a boolean, got {v}")));
            }
        };
        let k = topk.unwrap_or(limits.default_topk);
        let results = queries.len().saturating_mul(k);
        if results > limits.max_results {
            // The field the request set: its topk, or its queries at the default topk.
            let (field, default) = if topk.is_some() { ("topk", "") } else { ("queries", " (the default)") };
            return Err(InvalidField::new(
                field,
                format!(
                    "{} queries x topk {k}{default} = {results} results; at most {} (max_results) per request",
                    queries.len(),
                    limits.max_results
                ),
            ));
        }
        Ok(RetrieveRequest { queries, topk, return_scores })
    }
}

/// An `/access` request: the pages to fetch.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessRequest {
    pub urls: Vec<String>,
}

impl AccessRequest {
    /// Decodes `body`; members other than `urls` are ignored.
    pub fn parse(body: &Value) -> Result<Self, InvalidField> {
        let obj = body.as_object().ok_or_else(|| InvalidField::new("body", "expected a JSON object"))?;
        Ok(AccessRequest { urls: strings(obj.get("urls"), "urls")? })
    }
}

/// The list of strings at `field`.
fn strings(value: Option<&Value>, field: &str) -> Result<Vec<String>, InvalidField> {
    match value {
        None => Err(InvalidField::new(field, "missing: expected a list of strings")),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str().map(str::to_owned).ok_or_else(|| {
                    InvalidField::new(format!("{field}[{i}]"), format!("expected a string, got {item}"))
                })
            })
            .collect(),
        Some(other) => Err(InvalidField::new(field, format!("expected a list of strings, got {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<RetrieveRequest, InvalidField> {
        RetrieveRequest::parse(&v, &RetrieveLimits { default_topk: 3, max_queries: 100, max_results: 250 })
    }

    #[test]
    fn search_r1_request_parses() {
        let r = parse(json!({"queries": ["a", "b"], "topk": 3, "return_scores": true})).unwrap();
        assert_eq!(
            r,
            RetrieveRequest { queries: vec!["a".into(), "b".into()], topk: Some(3), return_scores: true }
        );
        let r = parse(json!({"queries": [], "topk": null})).unwrap();
        assert_eq!((r.topk, r.return_scores), (None, false));
        let r = parse(json!({"queries": ["a"], "topk": 0})).unwrap();
        assert_eq!(r.topk, None, "0 is the server's default, as Search-R1's server reads it");
    }

    #[test]
    fn bad_fields_are_named() {
        let field = |v: Value| parse(v).unwrap_err().field;
        assert_eq!(field(json!({})), "queries");
        assert_eq!(field(json!({"queries": "a"})), "queries");
        assert_eq!(field(json!({"queries": ["a", 3]})), "queries[1]");
        assert_eq!(field(json!({"queries": ["a"], "topk": -1})), "topk");
        assert_eq!(field(json!({"queries": ["a"], "topk": 1001})), "topk");
        assert_eq!(field(json!({"queries": ["a"], "topk": 2.5})), "topk");
        assert_eq!(field(json!({"queries": ["a"], "return_scores": "yes"})), "return_scores");
        assert_eq!(field(json!([1, 2])), "body");
        assert_eq!(field(json!({"queries": vec!["q"; 101]})), "queries");
    }

    #[test]
    fn unknown_fields_and_too_many_results_are_refused() {
        let error = parse(json!({"queries": ["a"], "topK": 50})).unwrap_err();
        assert_eq!(error.field, "topK");
        assert!(error.reason.contains("queries, topk, return_scores"), "{}", error.reason);
        // 100 queries x topk 3 (the default) = 300 results > 250: the queries are named, the
        // request having no topk.
        let error = parse(json!({"queries": vec!["q"; 100]})).unwrap_err();
        assert_eq!(error.field, "queries");
        let reason = "100 queries x topk 3 (the default) = 300 results; at most 250";
        assert!(error.reason.contains(reason), "{}", error.reason);
        let error = parse(json!({"queries": vec!["q"; 50], "topk": 6})).unwrap_err();
        assert_eq!(error.field, "topk");
        assert!(error.reason.contains("50 queries x topk 6 = 300 results"), "{}", error.reason);
        assert!(parse(json!({"queries": vec!["q"; 50], "topk": 5})).is_ok());
    }

    #[test]
    fn access_requests_name_their_bad_urls() {
        let urls = AccessRequest::parse(&json!({"urls": ["https://a.example/"]})).unwrap().urls;
        assert_eq!(urls, ["https://a.example/"]);
        let field = |v: Value| AccessRequest::parse(&v).unwrap_err().field;
        assert_eq!(field(json!({})), "urls");
        assert_eq!(field(json!({"urls": "https://a.example/"})), "urls");
        assert_eq!(field(json!({"urls": ["https://a.example/", null]})), "urls[1]");
        assert_eq!(field(json!("urls")), "body");
    }
}
