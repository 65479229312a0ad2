//! The real controllers against the stateful fake API server, until stable: dependency ordering,
//! status, Events, retries after injected 409s and 500s, an operator restart in the middle,
//! failed attempts resumed, `kubectl scale`, deletion cascades, and a finished job whose child is
//! deleted (not recreated).

use axum::http::Method;
use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kart_operator::build::Settings;
use kart_operator::controller::{self, Context, Scope};
use kart_operator::crd::{Retriever, RolloutPool, TrainingJob};
use kart_operator::metrics::Metrics;
use kart_operator::status::trainer::{FetchError, StatusSource, TrainerReport};
use kart_operator::testing::fake_apiserver::FakeApiServer;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NS: &str = "ml";

/// The trainer's report, as the test sets it.
#[derive(Default)]
struct FakeTrainer(Mutex<TrainerReport>);

impl StatusSource for FakeTrainer {
    fn fetch<'a>(
        &'a self,
        _url: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<TrainerReport, FetchError>> + Send + 'a>> {
        let report = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(report) })
    }
}

/// A running operator.
struct Operator {
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    fn start(server: &FakeApiServer, trainer: Arc<FakeTrainer>) -> Operator {
        let metrics = Arc::new(Metrics::default());
        let mut ctx = Context::new(server.client(NS), Settings::default(), metrics.clone(), trainer, None);
        ctx.poll = Duration::from_millis(100);
        let (stop, rx) = tokio::sync::watch::channel(false);
        let shutdown = async move {
            let mut rx = rx;
            let _ = rx.wait_for(|s| *s).await;
        }
        .boxed()
        .shared();
        let scope = Scope { namespaces: vec![NS.into()] };
        let tasks = controller::all(Arc::new(ctx), &scope, shutdown);
        let task = tokio::spawn(async move {
            futures::future::join_all(tasks).await;
        });
        Operator { metrics, stop, task }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("graceful shutdown").unwrap();
    }
}

/// Marks every Deployment's pods ready, as a Deployment controller and kubelets would.
fn simulate_deployments(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Deployment> = Api::namespaced(client, NS);
        loop {
            for d in api.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
                let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let ready = d.status.as_ref().and_then(|s| s.ready_replicas);
                if ready != Some(want) {
                    let status = json!({"status": {"replicas": want, "readyReplicas": want, "availableReplicas": want}});
                    let name = d.metadata.name.clone().unwrap();
                    let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Polls `check` until it returns `Some`, failing after 20 s with `what`.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create<K>(client: &Client, body: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Clone
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(body).unwrap();
    Api::<K>::namespaced(client.clone(), NS).create(&PostParams::default(), &obj).await.unwrap()
}

fn retriever(method: &str) -> Value {
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "Retriever", "metadata": {"name": "wiki", "namespace": NS},
           "spec": {"config": {"method": method}, "corpus": "/data/wiki.jsonl"}})
}

fn pool() -> Value {
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "RolloutPool", "metadata": {"name": "pool", "namespace": NS},
           "spec": {"replicas": 2, "retrieverRef": "wiki", "config": {"model": "/models/qwen"}}})
}

fn training_job(refs: Value) -> Value {
    let mut spec = json!({"config": {"model": "/models/qwen", "data": {"train": "/data/train.parquet"}, "total_steps": 5},
                          "backoffLimit": 2});
    spec.as_object_mut().unwrap().extend(refs.as_object().unwrap().clone());
    json!({"apiVersion": "kart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "run", "namespace": NS}, "spec": spec})
}

async fn tj(client: &Client) -> Value {
    serde_json::to_value(Api::<TrainingJob>::namespaced(client.clone(), NS).get("run").await.unwrap())
        .unwrap()
}

/// Ends Job `name` with condition `type_` (`Complete` or `Failed`).
async fn finish_job(client: &Client, name: &str, type_: &str) {
    let status = json!({"status": {"conditions": [{"type": type_, "status": "True"}]}});
    Api::<Job>::namespaced(client.clone(), NS)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Creates pod `name` whose one container has ended with `report` as its termination message, as
/// a kart workload leaves it through `KART_STATUS_FILE`.
async fn ended_pod(client: &Client, name: &str, labels: Value, annotations: Value, report: &Value) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "kart"}]}});
    let _: k8s_openapi::api::core::v1::Pod = create(client, pod).await;
    let terminated = json!({"status": {"containerStatuses": [{"name": "main", "image": "kart", "imageID": "",
        "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "message": report.to_string()}}}]}});
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&terminated))
        .await
        .unwrap();
}

fn job_args(server: &FakeApiServer, name: &str) -> Vec<String> {
    let job = server.get("batch/v1/jobs", NS, name).expect("job");
    serde_json::from_value(job["spec"]["template"]["spec"]["containers"][0]["args"].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_waits_for_dependencies_runs_reports_and_finishes() {
    let server = FakeApiServer::new();
    let client = server.client(NS);
    let trainer = Arc::new(FakeTrainer::default());
    create::<Retriever>(&client, retriever("bm25")).await;
    create::<RolloutPool>(&client, pool()).await;
    create::<TrainingJob>(&client, training_job(json!({"retrieverRef": "wiki", "rolloutPoolRef": "pool"})))
        .await;
    let operator = Operator::start(&server, trainer.clone());
    let _sim = simulate_deployments(client.clone());

    let reason = eventually("the job to wait for the retriever's index", || async {
        let t = tj(&client).await;
        (t["status"]["phase"] == "WaitingForDependencies")
            .then(|| t["status"]["conditions"][0]["reason"].clone())
    })
    .await;
    assert_eq!(reason, "RetrieverNotReady");
    eventually("the index-build Job", || async { server.get("batch/v1/jobs", NS, "wiki-retriever-index") })
        .await;
    assert!(server.get("apps/v1/deployments", NS, "wiki-retriever").is_none(), "no server before the index");
    assert!(
        server.names("batch/v1/jobs", NS).iter().all(|n| !n.starts_with("run-trainer")),
        "no trainer before its dependencies"
    );

    // The index-build pod ends with its report as its termination message.
    let labels =
        json!({"app.kubernetes.io/instance": "wiki", "app.kubernetes.io/component": "retriever-index"});
    let report = json!({"documents": 21015324, "method": "bm25"});
    ended_pod(&client, "wiki-retriever-index-fghij", labels, json!({}), &report).await;
    finish_job(&client, "wiki-retriever-index", "Complete").await;
    eventually("the trainer Job", || async { server.get("batch/v1/jobs", NS, "run-trainer-0") }).await;
    let ret =
        serde_json::to_value(Api::<Retriever>::namespaced(client.clone(), NS).get("wiki").await.unwrap())
            .unwrap();
    assert_eq!(
        (ret["status"]["phase"].as_str(), ret["status"]["indexBuilt"].as_bool()),
        (Some("Ready"), Some(true))
    );
    assert_eq!(ret["status"]["documentsIndexed"], 21015324, "the count the index-build pod reported");
    assert_eq!(
        job_args(&server, "run-trainer-0"),
        ["train", "--config", "/etc/kart/config.json", "--nproc-per-node", "1"],
        "one rank: the pod asks for no GPU"
    );
    let config = server.get("/v1/configmaps", NS, "run-trainer").unwrap();
    let config: Value = serde_json::from_str(config["data"]["config.json"].as_str().unwrap()).unwrap();
    assert_eq!(config["rollout"]["urls"], json!(["http://pool-rollout.ml.svc:8001"]));
    let worker_config = server.get("/v1/configmaps", NS, "pool-rollout").unwrap();
    assert!(
        worker_config["data"]["config.json"].as_str().unwrap().contains("http://wiki-retriever.ml.svc:8000")
    );

    *trainer.0.lock().unwrap() =
        TrainerReport { step: Some(3), reward: Some(0.5), eval_em: Some(0.25), ..TrainerReport::default() };
    eventually("the trainer's step in the status", || async {
        (tj(&client).await["status"]["step"] == 3).then_some(())
    })
    .await;
    // Rank 0 ends and leaves its final report as its termination message.
    let labels = json!({"app.kubernetes.io/instance": "run", "app.kubernetes.io/component": "trainer", "kart.dev/attempt": "0"});
    let annotations = json!({"batch.kubernetes.io/job-completion-index": "0"});
    let report = json!({"phase": "finished", "step": 5});
    ended_pod(&client, "run-trainer-0-0-abcde", labels, annotations, &report).await;
    finish_job(&client, "run-trainer-0", "Complete").await;
    let t = eventually("success", || async {
        let t = tj(&client).await;
        (t["status"]["phase"] == "Succeeded").then_some(t)
    })
    .await;
    assert_eq!((t["status"]["reward"].as_f64(), t["status"]["evalEm"].as_f64()), (Some(0.5), Some(0.25)));
    assert_eq!(t["status"]["step"], 5, "the final step comes from rank 0's termination message");
    assert_eq!(t["status"]["worldSize"], 1, "one pod of one rank");
    assert!(
        t["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Succeeded" && c["status"] == "True")
    );
    let events: Vec<String> = server.names("events.k8s.io/v1/events", NS);
    assert!(events.iter().any(|e| e.starts_with("run.")), "Events on the TrainingJob: {events:?}");

    // A finished job's deleted child is not recreated.
    // Reconciliations finished so far (the histogram counts when one ends).
    let reconciles = |m: &Metrics| {
        m.render()
            .lines()
            .find(|l| {
                l.starts_with("kart_operator_reconcile_duration_seconds_count{controller=\"training-job\"}")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = reconciles(&operator.metrics);
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NS)
        .delete("run-trainer", &Default::default())
        .await
        .unwrap();
    eventually("a finished reconcile after the deletion", || async {
        (reconciles(&operator.metrics) > before).then_some(())
    })
    .await;
    assert!(
        server.get("/v1/configmaps", NS, "run-trainer").is_none(),
        "a finished job's child stays deleted"
    );
    assert_eq!(tj(&client).await["status"]["phase"], "Succeeded");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_retried_failures_resume_and_a_restart_is_idempotent() {
    let server = FakeApiServer::new();
    let client = server.client(NS);
    let trainer = Arc::new(FakeTrainer::default());
    server.fail(Method::PATCH, "/deployments/wiki-retriever", 409, 1);
    server.fail(Method::PATCH, "/configmaps/run-trainer", 500, 2);
    create::<Retriever>(&client, retriever("serper")).await;
    create::<TrainingJob>(&client, training_job(json!({"retrieverRef": "wiki"}))).await;
    let operator = Operator::start(&server, trainer.clone());
    let _sim = simulate_deployments(client.clone());

    eventually("the trainer Job despite the injected failures", || async {
        server.get("batch/v1/jobs", NS, "run-trainer-0")
    })
    .await;
    let text = operator.metrics.render();
    assert!(
        text.contains(r#"kart_operator_reconcile_errors_total{controller="retriever",reason="conflict"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"kart_operator_reconcile_errors_total{controller="training-job",reason="server_error"} 2"#
        ),
        "{text}"
    );

    finish_job(&client, "run-trainer-0", "Failed").await;
    eventually("the resumed attempt", || async { server.get("batch/v1/jobs", NS, "run-trainer-1") }).await;
    assert_eq!(
        job_args(&server, "run-trainer-1"),
        ["train", "--config", "/etc/kart/config.json", "--nproc-per-node", "1", "--resume"]
    );
    let t = eventually("the failure in the status", || async {
        let t = tj(&client).await;
        (t["status"]["failures"] == 1).then_some(t)
    })
    .await;
    assert_eq!((t["status"]["attempts"].as_i64(), t["status"]["phase"].as_str()), (Some(2), Some("Running")));

    // Restart the operator in the middle: the new one adopts the state and starts nothing twice.
    operator.stop().await;
    let requests_before = server.requests().len();
    let operator = Operator::start(&server, trainer.clone());
    eventually("the new operator to reconcile", || async {
        (server.requests().len() > requests_before + 10).then_some(())
    })
    .await;
    eventually("a running job after the restart", || async {
        (tj(&client).await["status"]["phase"] == "Running").then_some(())
    })
    .await;
    let t = tj(&client).await;
    assert_eq!((t["status"]["attempts"].as_i64(), t["status"]["failures"].as_i64()), (Some(2), Some(1)));
    let trainer_jobs: Vec<_> =
        server.names("batch/v1/jobs", NS).into_iter().filter(|n| n.starts_with("run-trainer")).collect();
    assert_eq!(trainer_jobs, ["run-trainer-0", "run-trainer-1"]);

    // Deleting the TrainingJob removes everything it owns.
    Api::<TrainingJob>::namespaced(client.clone(), NS).delete("run", &Default::default()).await.unwrap();
    eventually("the cascade", || async {
        let left = server.names("batch/v1/jobs", NS).into_iter().filter(|n| n.starts_with("run-")).count()
            + server.names("/v1/configmaps", NS).into_iter().filter(|n| n.starts_with("run-")).count()
            + server.names("/v1/services", NS).into_iter().filter(|n| n.starts_with("run-")).count()
            + server.names("/v1/persistentvolumeclaims", NS).len();
        (left == 0).then_some(())
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_resizes_the_worker_deployment() {
    let server = FakeApiServer::new();
    let client = server.client(NS);
    create::<RolloutPool>(&client, pool()).await;
    let operator = Operator::start(&server, Arc::default());
    let _sim = simulate_deployments(client.clone());
    let pools: Api<RolloutPool> = Api::namespaced(client.clone(), NS);
    eventually("a ready pool", || async {
        let p = pools.get("pool").await.ok()?;
        (p.status?.ready_replicas == 2).then_some(())
    })
    .await;
    pools
        .patch_scale("pool", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 5}})))
        .await
        .unwrap();
    eventually("the Deployment to follow the scale subresource", || async {
        let d = server.get("apps/v1/deployments", NS, "pool-rollout")?;
        (d["spec"]["replicas"] == 5).then_some(())
    })
    .await;
    let scale = eventually("the scale status", || async {
        let s = pools.get_scale("pool").await.ok()?;
        (s.status.as_ref()?.replicas == 5).then_some(s)
    })
    .await;
    assert_eq!(
        scale.status.unwrap().selector.as_deref(),
        Some("app.kubernetes.io/component=rollout,app.kubernetes.io/instance=pool")
    );
    let p = pools.get("pool").await.unwrap();
    assert_eq!(p.metadata.generation, Some(2), "scaling changes the spec");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_resumes_and_ttl_removes_a_finished_runs_workloads() {
    let server = FakeApiServer::new();
    let client = server.client(NS);
    create::<Retriever>(&client, retriever("serper")).await;
    let mut job = training_job(json!({"retrieverRef": "wiki", "ttlSecondsAfterFinished": 0}));
    job["spec"]["checkpoint"] = json!({"size": "1Gi"});
    create::<TrainingJob>(&client, job).await;
    let operator = Operator::start(&server, Arc::default());
    let _sim = simulate_deployments(client.clone());
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NS);
    eventually("the first attempt", || async { server.get("batch/v1/jobs", NS, "run-trainer-0") }).await;

    jobs.patch("run", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"suspend": true}})))
        .await
        .unwrap();
    eventually("the suspended run's Job to go", || async {
        let gone = server.get("batch/v1/jobs", NS, "run-trainer-0").is_none();
        (gone && tj(&client).await["status"]["phase"] == "Suspended").then_some(())
    })
    .await;
    jobs.patch("run", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"suspend": false}})))
        .await
        .unwrap();
    eventually("the resumed attempt", || async { server.get("batch/v1/jobs", NS, "run-trainer-1") }).await;
    assert_eq!(job_args(&server, "run-trainer-1").last().map(String::as_str), Some("--resume"));
    assert_eq!(tj(&client).await["status"]["failures"], 0, "a suspension is not a failure");

    finish_job(&client, "run-trainer-1", "Complete").await;
    let t = eventually("the TTL clean-up", || async {
        let t = tj(&client).await;
        (t["status"]["cleanedUp"] == true).then_some(t)
    })
    .await;
    assert_eq!(t["status"]["phase"], "Succeeded");
    assert!(server.names("batch/v1/jobs", NS).iter().all(|n| !n.starts_with("run-")));
    assert!(server.get("/v1/configmaps", NS, "run-trainer").is_none());
    assert!(server.get("/v1/services", NS, "run-trainer").is_none());
    assert!(server.get("/v1/persistentvolumeclaims", NS, "run-checkpoints").is_some(), "checkpoints stay");
    operator.stop().await;
}
