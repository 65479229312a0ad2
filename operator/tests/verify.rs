//! The exact API requests of one reconciliation, checked with a tower-test mock service (the
//! controller-rs verifier pattern): what is applied, in which order, with which field manager.

use axum::http::{Method, Request, Response, StatusCode};
use kart_operator::build::Settings;
use kart_operator::controller::{self, Context};
use kart_operator::crd::{Retriever, TrainingJob};
use kart_operator::metrics::Metrics;
use kart_operator::status::trainer::HttpStatusSource;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tower_test::mock::{Handle, pair};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn context() -> (Arc<Context>, ApiHandle) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "ml");
    let ctx = Context::new(
        client,
        &controller::Scope::default(),
        Settings { image: "kart:test".into() },
        Arc::new(Metrics::default()),
        Arc::new(HttpStatusSource::new(Duration::from_millis(10))),
        None,
    );
    (Arc::new(ctx), handle)
}

/// Expects the next request to be `method path` (a server-side apply when `apply`), answers
/// `code` with `reply(body)`, and returns the request body.
async fn expect(
    handle: &mut ApiHandle,
    method: Method,
    path: &str,
    apply: bool,
    code: u16,
    reply: impl FnOnce(&Value) -> Value,
) -> Value {
    let (request, send) = handle.next_request().await.expect("a request");
    assert_eq!(
        (request.method(), request.uri().path()),
        (&method, path),
        "unexpected request {}",
        request.uri()
    );
    if apply {
        let query = request.uri().query().unwrap_or_default();
        assert!(query.contains("fieldManager=kart-operator") && query.contains("force=true"), "{query}");
        let content_type = request.headers()["content-type"].to_str().unwrap();
        assert_eq!(content_type, "application/apply-patch+yaml");
    }
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body: Value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    let response = reply(&body);
    send.send_response(
        Response::builder()
            .status(StatusCode::from_u16(code).unwrap())
            .body(Body::from(serde_json::to_vec(&response).unwrap()))
            .unwrap(),
    );
    body
}

fn echo(body: &Value) -> Value {
    body.clone()
}

fn not_found(_: &Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
}

fn resource<K: serde::de::DeserializeOwned>(kind: &str, spec: Value) -> K {
    serde_json::from_value(json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": kind,
        "metadata": {"name": "x", "namespace": "ml", "uid": "u1", "generation": 1},
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn retriever_applies_config_deployment_service_then_status_and_event() {
    let (ctx, mut api) = context();
    let ret: Retriever = resource("Retriever", json!({"config": {"method": "serper"}}));
    let reconcile = tokio::spawn(controller::reconcile(Arc::new(ret), ctx));
    let config =
        expect(&mut api, Method::PATCH, "/api/v1/namespaces/ml/configmaps/x-retriever", true, 200, echo)
            .await;
    assert_eq!(config["metadata"]["ownerReferences"][0]["kind"], "Retriever");
    assert_eq!(config["metadata"]["ownerReferences"][0]["uid"], "u1");
    let deployment = expect(
        &mut api,
        Method::PATCH,
        "/apis/apps/v1/namespaces/ml/deployments/x-retriever",
        true,
        200,
        echo,
    )
    .await;
    assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], "kart:test");
    expect(&mut api, Method::PATCH, "/api/v1/namespaces/ml/services/x-retriever", true, 200, echo).await;
    let status = expect(&mut api, Method::PATCH, "/apis/kart.dev/v1alpha1/namespaces/ml/retrievers/x/status", true, 200, |_| {
        json!({"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever", "metadata": {"name": "x", "namespace": "ml"}, "spec": {}})
    })
    .await;
    assert_eq!(status["status"]["phase"], "Progressing");
    assert_eq!(status["status"]["indexBuilt"], true, "serper needs no index");
    let event =
        expect(&mut api, Method::POST, "/apis/events.k8s.io/v1/namespaces/ml/events", false, 201, echo).await;
    assert_eq!((event["reason"].as_str(), event["type"].as_str()), (Some("Progressing"), Some("Normal")));
    let action = reconcile.await.unwrap().unwrap();
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(300)));
}

#[tokio::test]
async fn training_job_waits_for_a_missing_retriever_without_creating_children() {
    let (ctx, mut api) = context();
    let tj: TrainingJob = resource(
        "TrainingJob",
        json!({"retrieverRef": "wiki", "config": {"model": "/m", "data": {"train": "/t.parquet"}}}),
    );
    // No Job in the operator's caches; the Retriever is not there either (listed, and empty), so
    // it is read from the API.
    ctx.caches.jobs.fill(Vec::new());
    ctx.caches.retrievers.fill(Vec::new());
    let reconcile = tokio::spawn(controller::reconcile(Arc::new(tj), ctx));
    expect(
        &mut api,
        Method::GET,
        "/apis/kart.dev/v1alpha1/namespaces/ml/retrievers/wiki",
        false,
        404,
        not_found,
    )
    .await;
    let status = expect(&mut api, Method::PATCH, "/apis/kart.dev/v1alpha1/namespaces/ml/trainingjobs/x/status", true, 200, |_| {
        json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "x", "namespace": "ml"},
               "spec": {"config": {}}})
    })
    .await;
    assert_eq!(status["status"]["phase"], "WaitingForDependencies");
    let condition = &status["status"]["conditions"][0];
    assert_eq!(
        (condition["type"].as_str(), condition["reason"].as_str()),
        (Some("WaitingForDependencies"), Some("RetrieverNotFound"))
    );
    assert_eq!(condition["observedGeneration"], 1);
    let event =
        expect(&mut api, Method::POST, "/apis/events.k8s.io/v1/namespaces/ml/events", false, 201, echo).await;
    assert_eq!(event["reason"], "RetrieverNotFound");
    reconcile.await.unwrap().unwrap();
}

#[tokio::test]
async fn an_invalid_spec_becomes_a_condition_and_a_warning() {
    let (ctx, mut api) = context();
    let tj: TrainingJob = resource(
        "TrainingJob",
        json!({"config": {"model": "/m", "data": {"train": "/t.parquet"}, "rollout": {"urls": ["http://p"]},
                          "algorithm": {"clip_ratio_low": 1.5}}}),
    );
    let reconcile = tokio::spawn(controller::reconcile(Arc::new(tj), ctx.clone()));
    let status = expect(&mut api, Method::PATCH, "/apis/kart.dev/v1alpha1/namespaces/ml/trainingjobs/x/status", true, 200, |_| {
        json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "x", "namespace": "ml"},
               "spec": {"config": {}}})
    })
    .await;
    let condition = &status["status"]["conditions"][0];
    assert_eq!(
        (condition["type"].as_str(), condition["status"].as_str()),
        (Some("ValidationFailed"), Some("True"))
    );
    assert_eq!(condition["message"], "spec.config.algorithm.clip_ratio_low = 1.5: must be in (0, 1)");
    let event =
        expect(&mut api, Method::POST, "/apis/events.k8s.io/v1/namespaces/ml/events", false, 201, echo).await;
    assert_eq!(
        (event["reason"].as_str(), event["type"].as_str()),
        (Some("ValidationFailed"), Some("Warning"))
    );
    let action = reconcile.await.unwrap().unwrap();
    assert_eq!(action, kube::runtime::controller::Action::await_change(), "no retry loop on an invalid spec");
}

/// A Kubernetes `Status` of a failed request.
fn failure(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
           "message": reason})
}

#[tokio::test]
async fn a_failed_request_is_counted_by_its_reason_and_retried_after_a_growing_backoff() {
    let (ctx, mut api) = context();
    let ret: Arc<Retriever> = Arc::new(resource("Retriever", json!({"config": {"method": "serper"}})));
    let mut delays = Vec::new();
    for (code, reason) in [(409, "Conflict"), (500, "InternalError")] {
        let reconcile = tokio::spawn(controller::reconcile(ret.clone(), ctx.clone()));
        let path = "/api/v1/namespaces/ml/configmaps/x-retriever";
        expect(&mut api, Method::PATCH, path, true, code, |_| failure(code, reason)).await;
        let error = reconcile.await.unwrap().expect_err("the failed apply fails the reconciliation");
        delays.push(controller::error_policy(ret.clone(), &error, ctx.clone()));
    }
    let text = ctx.metrics.render();
    for reason in ["conflict", "server_error"] {
        let series =
            format!("kart_operator_reconcile_errors_total{{controller=\"retriever\",reason=\"{reason}\"}} 1");
        assert!(text.contains(&series), "{series}: {text}");
    }
    let base = ctx.backoff.failed("probe");
    assert_eq!(
        delays,
        [
            kube::runtime::controller::Action::requeue(base),
            kube::runtime::controller::Action::requeue(base * 2)
        ],
        "the second failure in a row waits twice as long"
    );
}

#[tokio::test]
async fn a_training_job_pulling_weights_into_a_vllm_pool_is_refused_naming_the_weight_sync() {
    let (ctx, mut api) = context();
    let tj: TrainingJob = resource(
        "TrainingJob",
        json!({"rolloutPoolRef": "pool", "config": {"model": "/m", "data": {"train": "/t.parquet"}}}),
    );
    // The pool, as the operator's cache holds it.
    ctx.caches.rollout_pools.fill(vec![serde_json::from_value(json!({
        "apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "pool", "namespace": "ml"},
        "spec": {"config": {"model": "/m", "engine": {"kind": "vllm", "urls": [], "model": "m"}}}}))
    .unwrap()]);
    let reconcile = tokio::spawn(controller::reconcile(Arc::new(tj), ctx));
    let status = expect(&mut api, Method::PATCH, "/apis/kart.dev/v1alpha1/namespaces/ml/trainingjobs/x/status", true, 200, |_| {
        json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "x", "namespace": "ml"},
               "spec": {"config": {}}})
    })
    .await;
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["type"], "ValidationFailed");
    let message = condition["message"].as_str().unwrap();
    assert_eq!(
        message,
        "spec.config.weight_sync.kind = http_pull: RolloutPool pool runs the vLLM engine: use vllm_disk or vllm_broadcast"
    );
    let event =
        expect(&mut api, Method::POST, "/apis/events.k8s.io/v1/namespaces/ml/events", false, 201, echo).await;
    assert_eq!(event["type"], "Warning");
    let action = reconcile.await.unwrap().unwrap();
    assert_eq!(action, kube::runtime::controller::Action::await_change());
}
