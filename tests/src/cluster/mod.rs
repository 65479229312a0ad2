//! A Kubernetes cluster simulated on one machine, for end-to-end tests of the operator: the
//! operator's stateful fake API server over HTTP ([`apiserver`]), the real `kart-operator` binary
//! pointed at it ([`operator`]), the controllers that turn Deployments, ReplicaSets and Jobs into
//! Pods ([`deployments`], [`jobs`]), a kubelet that runs each Pod's container as a local process of
//! the real `kart` binary ([`kubelet`], with the Pod's volumes as folders: [`rootfs`]), and the pod
//! network: a loopback address per Pod and a proxy that reaches Services by name ([`network`]).
//!
//! The operator's objects reach the processes as a cluster would deliver them; the harness's
//! liberties are the pod network's environment variables and the mapping of container paths
//! below each Pod's root folder, both documented in their modules.

pub mod apiserver;
pub mod deployments;
pub mod jobs;
pub mod kubelet;
pub mod network;
pub mod node;
pub mod objects;
pub mod operator;
pub mod rootfs;

use apiserver::ApiServer;
use kubelet::Kubelet;
use operator::Operator;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the controllers and the kubelet look at the cluster.
const TICK: Duration = Duration::from_millis(100);

/// The running cluster; everything stops when it is dropped.
pub struct Cluster {
    /// An in-process client of the API server, default namespace the one the operator watches.
    pub client: kube::Client,
    pub kubelet: Arc<Kubelet>,
    pub operator: Operator,
    _api: ApiServer,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// Starts a cluster in `dir` (kubeconfig, logs, Pod folders, claims) whose operator watches
    /// `namespace`, reading trainers' `/status` every second; returns once the operator is ready.
    pub async fn start(dir: &Path, namespace: &str) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let api = ApiServer::start(dir, namespace).await?;
        let client = api.server.client(namespace);
        let (proxy, proxy_task) = network::serve_proxy(client.clone()).await?;
        let bin_dir = crate::binary("kart").parent().expect("a binary folder").to_path_buf();
        let kubelet = Arc::new(Kubelet::new(client.clone(), dir.to_path_buf(), &bin_dir, proxy.clone()));
        let (c, k) = (client.clone(), kubelet.clone());
        let nodes = tokio::spawn(async move {
            loop {
                let passes = [deployments::sync(&c).await, jobs::sync(&c).await, k.sync().await];
                for e in passes.into_iter().filter_map(Result::err) {
                    eprintln!("cluster: {e:#}");
                }
                tokio::time::sleep(TICK).await;
            }
        });
        let operator = Operator::start(&api, dir, namespace, 1, Some(&proxy))?;
        let cluster = Cluster { client, kubelet, operator, _api: api, tasks: vec![proxy_task, nodes] };
        let http = reqwest::Client::new();
        let ready = format!("{}/readyz", cluster.operator.url);
        cluster
            .wait("the operator ready", Duration::from_secs(60), async || {
                http.get(&ready).send().await.ok().filter(|r| r.status().is_success()).map(drop)
            })
            .await;
        Ok(cluster)
    }

    /// Polls `check` until it returns `Some`; after `deadline`, panics with `what` and the state of
    /// the cluster (Pods, their logs, the operator's log).
    pub async fn wait<T>(
        &self,
        what: &str,
        deadline: Duration,
        mut check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        let start = Instant::now();
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if start.elapsed() > deadline {
                panic!("{what}: not within {deadline:?}\n{}", self.describe());
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// The kubelet's Pods and the end of the operator's log.
    pub fn describe(&self) -> String {
        let log = std::fs::read_to_string(&self.operator.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        format!(
            "{}operator log:\n  {}",
            self.kubelet.describe(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
