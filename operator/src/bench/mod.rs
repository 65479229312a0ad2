//! `kart bench operator` (`kart-operator bench`): the operator at scale, on a real control plane
//! with KWOK's simulated GPU nodes (scripts/control-plane.sh `up --kwok`) and simulated trainers
//! ([`trainers`]: each running trainer's `/status` answers). It applies the
//! Retrievers, RolloutPools and TrainingJobs of [`workload`] at once, and measures against the
//! goals, printing each figure's ratio to its goal:
//! - the time until every object has a phase (goal 5 minutes);
//! - reconciles per second, and p50/p99 reconcile latency from the operator's histogram (p99 goal
//!   500 ms);
//! - the operator's API requests by verb, from the API server's audit log of its user;
//! - its peak resident memory (goal 300 MB);
//! - writes per minute once settled, with every object reconciled again by a short resync (goal
//!   zero; the leader's Lease renewals are counted apart);
//! - a restart: the new operator lists everything and reconciles each object, writing no child
//!   (goal zero).

pub mod audit;
pub mod trainers;
pub mod workload;

use crate::crd::{self, Retriever, RolloutPool, TrainingJob};
use crate::metrics::{RECONCILE_DURATION, RECONCILES};
use anyhow::{Context as _, bail};
use audit::{AuditLog, Request};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use workload::Counts;

/// Measure the operator on simulated nodes against its scale goals.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TrainingJobs (each with a RolloutPool of its own while there are pools) [default: 1000, 24
    /// with --quick].
    #[arg(long)]
    training_jobs: Option<usize>,
    /// RolloutPools [default: 1000, 24 with --quick].
    #[arg(long)]
    rollout_pools: Option<usize>,
    /// Retrievers [default: 100, 4 with --quick].
    #[arg(long)]
    retrievers: Option<usize>,
    /// Namespaces the objects are spread over [default: 10, 2 with --quick].
    #[arg(long)]
    namespaces: Option<usize>,
    /// Simulated nodes of 8 GPUs each [default: 50, 2 with --quick: fewer GPUs than
    /// TrainingJobs].
    #[arg(long)]
    nodes: Option<usize>,
    /// A control plane already up with KWOK's nodes (`scripts/control-plane.sh up DIR --node none
    /// --kwok N`) instead of one the benchmark starts and stops.
    #[arg(long)]
    control_plane: Option<PathBuf>,
    /// The control-plane script [default: the repository's scripts/control-plane.sh].
    #[arg(long)]
    script: Option<PathBuf>,
    /// The operator's resync period during the benchmark, in seconds: every object is reconciled
    /// again at least this often, and a steady-state window of twice it sees each one twice
    /// [default: 60, 10 with --quick].
    #[arg(long)]
    resync_seconds: Option<u64>,
    /// The operator's `--concurrency`: reconciles at once per controller [default: the operator's].
    #[arg(long)]
    concurrency: Option<u16>,
    /// How long without a write counts as settled, in seconds [default: 30, 10 with --quick].
    #[arg(long)]
    quiet_seconds: Option<u64>,
    /// Small counts that finish in about a minute, to check the bench itself runs; its figures are
    /// not the benchmark's.
    #[arg(long)]
    quick: bool,
    /// Also write the figures to this file as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// How long each wait may take before the benchmark fails.
const DEADLINE: Duration = Duration::from_secs(1200);

/// What a run measured.
#[derive(Debug, Serialize)]
struct Report {
    counts: Counts,
    nodes: usize,
    apply_secs: f64,
    /// From the first object applied until every object has a phase.
    all_phased_secs: f64,
    phases: BTreeMap<String, usize>,
    /// Objects by phase at the end of the steady state.
    settled_phases: BTreeMap<String, usize>,
    /// The Pods of the benchmark's namespaces by phase at the end of the steady state.
    pods: BTreeMap<String, usize>,
    /// From the first object applied until no write for the quiet period (the period excluded).
    settled_secs: f64,
    reconciles: u64,
    reconciles_per_sec: f64,
    p50_reconcile_secs: f64,
    p99_reconcile_secs: f64,
    /// The p99 until settled of each controller.
    p99_reconcile_secs_by_controller: BTreeMap<String, f64>,
    /// The operator's requests until settled, by verb.
    requests: BTreeMap<String, usize>,
    peak_rss_mb: f64,
    steady_secs: f64,
    steady_reconciles: u64,
    p99_steady_reconcile_secs: f64,
    p99_steady_reconcile_secs_by_controller: BTreeMap<String, f64>,
    /// Writes at steady state other than the Lease's, by verb and resource.
    steady_writes: BTreeMap<String, usize>,
    steady_writes_per_min: f64,
    lease_writes_per_min: f64,
    restart_relist_secs: f64,
    restart_requests: BTreeMap<String, usize>,
    /// Writes of children after the restart, by verb and resource.
    restart_child_writes: BTreeMap<String, usize>,
    restart_status_writes: usize,
    /// Trainer `/status` reads the simulated trainers answered over the whole run.
    status_reads: u64,
}

pub async fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let q = |given: Option<usize>, full: usize, quick: usize| {
        given.unwrap_or(if args.quick { quick } else { full })
    };
    let counts = Counts {
        training_jobs: q(args.training_jobs, 1000, 24),
        rollout_pools: q(args.rollout_pools, 1000, 24),
        retrievers: q(args.retrievers, 100, 4),
        namespaces: q(args.namespaces, 10, 2).max(1),
    };
    let nodes = q(args.nodes, 50, 2);
    let quiet = Duration::from_secs(args.quiet_seconds.unwrap_or(if args.quick { 10 } else { 30 }));
    let started_dir;
    let cluster = match &args.control_plane {
        Some(dir) => Cluster { dir: dir.clone(), script: None },
        None => {
            started_dir = tempfile::tempdir()?;
            let script = args
                .script
                .clone()
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/control-plane.sh"));
            Cluster::up(started_dir.path(), &script, nodes)?
        }
    };
    let resync = args.resync_seconds.unwrap_or(if args.quick { 10 } else { 60 }).max(1);
    let flags = OperatorFlags { resync_seconds: resync, concurrency: args.concurrency };
    let report = measure(&cluster, counts, nodes, &flags, quiet).await;
    drop(cluster);
    let report = report?;
    print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("--json {}", path.display()))?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

async fn measure(
    cluster: &Cluster,
    counts: Counts,
    nodes: usize,
    flags: &OperatorFlags,
    quiet: Duration,
) -> anyhow::Result<Report> {
    let client = cluster.client().await?;
    install_crds(&client).await?;
    for i in 0..counts.namespaces {
        for object in workload::namespace_objects(i) {
            match object["kind"].as_str() {
                Some("Namespace") => create::<Namespace>(&client, object).await?,
                Some("PersistentVolume") => create::<PersistentVolume>(&client, object).await?,
                _ => create::<PersistentVolumeClaim>(&client, object).await?,
            }
        }
    }
    let audit_path = cluster.dir.join("logs/audit.log");
    let trainers = trainers::Trainers::start().await?;
    let mut operator = Operator::start(cluster, &trainers, flags, "first")?;
    operator.wait_listening().await?;
    let mut log = AuditLog::from_end(&audit_path)?;
    // Before the objects: what the operator does on an empty cluster (its caches' lists and
    // watches) counts with the rest.
    let before = operator.metrics().await?;
    let start = Instant::now();
    apply_all(&client, &counts).await?;
    let apply_secs = start.elapsed().as_secs_f64();
    eprintln!("bench: {} objects applied in {apply_secs:.1} s", total(&counts));

    let mut requests = Vec::new();
    let mut peak_rss = operator.rss_mb();
    let phases = loop {
        requests.extend(log.read()?);
        peak_rss = peak_rss.max(operator.rss_mb());
        let phases = phases_of(&client).await?;
        let phased: usize = phases.iter().filter(|(p, _)| !p.is_empty()).map(|(_, n)| n).sum();
        if phased == total(&counts) {
            break phases;
        }
        operator.check_alive()?;
        if start.elapsed() > DEADLINE {
            bail!("{phased} of {} objects have a phase after {DEADLINE:?}: {phases:?}", total(&counts));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let all_phased_secs = start.elapsed().as_secs_f64();
    eprintln!("bench: every object has a phase after {all_phased_secs:.1} s: {phases:?}");

    // Settled: no write but the Lease's for `quiet`.
    let mut last_write = Instant::now();
    loop {
        let new = log.read()?;
        if new.iter().any(|r| r.writes() && r.resource() != "leases") {
            last_write = Instant::now();
        }
        requests.extend(new);
        peak_rss = peak_rss.max(operator.rss_mb());
        if last_write.elapsed() >= quiet {
            break;
        }
        operator.check_alive()?;
        if start.elapsed() > DEADLINE {
            eprintln!("bench: still writing after {DEADLINE:?}; measuring the steady state anyway");
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled_secs = (last_write - start).as_secs_f64().max(all_phased_secs);
    let settled = operator.metrics().await?;
    let reconciles = settled.reconciles - before.reconciles;
    let latency = settled.minus(&before);
    eprintln!("bench: settled after {settled_secs:.1} s, {reconciles} reconciles");

    // The steady state: two resync periods, every object reconciled again.
    let steady = Duration::from_secs(flags.resync_seconds * 2);
    let steady_start = Instant::now();
    let mut steady_requests = Vec::new();
    while steady_start.elapsed() < steady {
        tokio::time::sleep(Duration::from_secs(2)).await;
        steady_requests.extend(log.read()?);
        peak_rss = peak_rss.max(operator.rss_mb());
        operator.check_alive()?;
    }
    let steady_secs = steady_start.elapsed().as_secs_f64();
    let settled_phases = phases_of(&client).await?;
    let pods = pod_phases(&client).await?;
    let steady_latency = operator.metrics().await?.minus(&settled);
    let steady_reconciles = steady_latency.reconciles;
    let per_min = |n: usize| n as f64 * 60.0 / steady_secs;
    let steady_writes = audit::writes(&steady_requests, |r| r.writes() && r.resource() != "leases");
    let lease_writes = audit::writes(&steady_requests, |r| r.writes() && r.resource() == "leases");

    // A restart: the new operator lists and reconciles everything, and writes no child.
    operator.stop()?;
    let mut log = AuditLog::from_end(&audit_path)?;
    let restart = Instant::now();
    let mut operator = Operator::start(cluster, &trainers, flags, "restarted")?;
    operator.wait_listening().await?;
    loop {
        let reconciled = operator.metrics().await?.reconciles;
        if reconciled >= total(&counts) as u64 {
            break;
        }
        operator.check_alive()?;
        if restart.elapsed() > DEADLINE {
            bail!("the restarted operator reconciled {reconciled} objects in {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let restart_relist_secs = restart.elapsed().as_secs_f64();
    tokio::time::sleep(quiet).await;
    let restart_requests = log.read()?;
    let status_reads = trainers.answered();
    peak_rss = peak_rss.max(operator.rss_mb());
    operator.stop()?;

    let elapsed = settled_secs.max(1e-9);
    Ok(Report {
        counts,
        nodes,
        apply_secs,
        all_phased_secs,
        phases: named(phases),
        settled_phases: named(settled_phases),
        pods,
        settled_secs,
        reconciles,
        reconciles_per_sec: reconciles as f64 / elapsed,
        p50_reconcile_secs: latency.quantile(0.5),
        p99_reconcile_secs: latency.quantile(0.99),
        p99_reconcile_secs_by_controller: latency.quantiles(0.99),
        requests: audit::by_verb(&requests),
        peak_rss_mb: peak_rss,
        steady_secs,
        steady_reconciles,
        p99_steady_reconcile_secs: steady_latency.quantile(0.99),
        p99_steady_reconcile_secs_by_controller: steady_latency.quantiles(0.99),
        steady_writes_per_min: per_min(steady_writes.values().sum()),
        lease_writes_per_min: per_min(lease_writes.values().sum()),
        steady_writes,
        restart_relist_secs,
        restart_child_writes: audit::writes(&restart_requests, Request::writes_child),
        restart_status_writes: restart_requests
            .iter()
            .filter(|r| r.writes() && r.resource().ends_with("/status"))
            .count(),
        restart_requests: audit::by_verb(&restart_requests),
        status_reads,
    })
}

/// `phases` with "(none)" for objects without one.
fn named(phases: BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    phases.into_iter().map(|(p, n)| (if p.is_empty() { "(none)".into() } else { p }, n)).collect()
}

/// The Pods of the benchmark's namespaces by phase.
async fn pod_phases(client: &Client) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut phases = BTreeMap::new();
    for pod in Api::<Pod>::all(client.clone()).list(&ListParams::default()).await? {
        if pod.metadata.namespace.as_deref().is_some_and(|ns| ns.starts_with("bench-")) {
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            *phases.entry(phase).or_default() += 1;
        }
    }
    Ok(phases)
}

fn total(counts: &Counts) -> usize {
    counts.training_jobs + counts.rollout_pools + counts.retrievers
}

/// Objects by phase (`""`: none yet), of the three kinds.
async fn phases_of(client: &Client) -> anyhow::Result<BTreeMap<String, usize>> {
    async fn of<K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize>(
        client: &Client,
        phases: &mut BTreeMap<String, usize>,
    ) -> anyhow::Result<()> {
        let kind = K::kind(&());
        for object in Api::<K>::all(client.clone()).list(&ListParams::default()).await? {
            let value = serde_json::to_value(&object)?;
            let phase = value["status"]["phase"].as_str().unwrap_or_default();
            let key = if phase.is_empty() { String::new() } else { format!("{kind} {phase}") };
            *phases.entry(key).or_default() += 1;
        }
        Ok(())
    }
    let mut phases = BTreeMap::new();
    of::<TrainingJob>(client, &mut phases).await?;
    of::<RolloutPool>(client, &mut phases).await?;
    of::<Retriever>(client, &mut phases).await?;
    Ok(phases)
}

/// Applies every CRD and waits until the API server serves them.
async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply("kart-bench").force(), &Patch::Apply(&crd)).await?;
    }
    let start = Instant::now();
    for crd in crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let stored = api.get(&name).await?;
            let conditions = stored.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
                break;
            }
            if start.elapsed() > DEADLINE {
                bail!("CRD {name} not established within {DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Creates `object` (of kind `K`, checked against its type); one that exists counts as created.
async fn create<K>(client: &Client, object: Value) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize,
{
    let typed: K = serde_json::from_value(object.clone())?;
    let object: DynamicObject = serde_json::from_value(object)?;
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match typed.meta().namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {} {:?}", K::kind(&()), typed.meta().name)),
    }
}

/// Every Retriever, RolloutPool and TrainingJob, 64 requests at a time.
async fn apply_all(client: &Client, counts: &Counts) -> anyhow::Result<()> {
    let objects = (0..counts.retrievers)
        .map(|i| workload::retriever(i, counts))
        .chain((0..counts.rollout_pools).map(|i| workload::rollout_pool(i, counts)))
        .chain((0..counts.training_jobs).map(|i| workload::training_job(i, counts)));
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(objects)
        .map(|object| async move {
            match object["kind"].as_str() {
                Some("Retriever") => create::<Retriever>(client, object).await,
                Some("RolloutPool") => create::<RolloutPool>(client, object).await,
                _ => create::<TrainingJob>(client, object).await,
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The control plane the benchmark runs on; one it started is stopped when dropped.
struct Cluster {
    dir: PathBuf,
    script: Option<PathBuf>,
}

impl Cluster {
    /// Starts a control plane in `dir` with `nodes` simulated nodes.
    fn up(dir: &Path, script: &Path, nodes: usize) -> anyhow::Result<Cluster> {
        eprintln!("bench: starting a control plane with {nodes} KWOK nodes in {}", dir.display());
        let status = Command::new("bash")
            .arg(script)
            .args([
                "up",
                &dir.display().to_string(),
                "--etcd-in-memory",
                "--node",
                "none",
                "--kwok",
                &nodes.to_string(),
            ])
            .env("KART_CONTROL_PLANE_OWNER", std::process::id().to_string())
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() {
            bail!("{} up failed ({status})", script.display());
        }
        Ok(Cluster { dir: dir.to_path_buf(), script: Some(script.to_path_buf()) })
    }

    /// A client of the cluster's admin.
    async fn client(&self) -> anyhow::Result<Client> {
        let path = self.dir.join("kubeconfig");
        let kubeconfig =
            Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(script) = &self.script {
            let _ = Command::new("bash").arg(script).args(["down", &self.dir.display().to_string()]).status();
        }
    }
}

/// The operator under test: this binary's `run`, as user `kart-operator`.
struct Operator {
    child: Child,
    port: u16,
}

/// What the operator's `/metrics` says.
#[derive(Debug, Clone, Default)]
struct Scrape {
    reconciles: u64,
    /// The reconcile-duration histogram over every controller: (upper bound, cumulative count).
    buckets: Vec<(f64, u64)>,
    /// The same for each controller alone (empty within a controller's own).
    controllers: BTreeMap<String, Scrape>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut all = Scrape::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let value = value.parse::<f64>().unwrap_or(0.0) as u64;
            let label = |name: &str| {
                series
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .map(str::to_string)
            };
            let controller = label("controller").unwrap_or_default();
            if series.starts_with(RECONCILES) {
                all.reconciles += value;
                all.controllers.entry(controller).or_default().reconciles += value;
            } else if series.strip_prefix(RECONCILE_DURATION).is_some_and(|rest| rest.starts_with("_bucket"))
                && let Some(le) = label("le")
            {
                let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
                all.add_bucket(bound, value);
                all.controllers.entry(controller).or_default().add_bucket(bound, value);
            }
        }
        all
    }

    /// Adds `count` to the bucket of upper bound `bound`, keeping the buckets sorted.
    fn add_bucket(&mut self, bound: f64, count: u64) {
        match self.buckets.binary_search_by(|(b, _)| b.total_cmp(&bound)) {
            Ok(i) => self.buckets[i].1 += count,
            Err(i) => self.buckets.insert(i, (bound, count)),
        }
    }

    /// The histogram of what happened since `earlier`.
    fn minus(&self, earlier: &Scrape) -> Scrape {
        let before = |bound: f64| earlier.buckets.iter().find(|(b, _)| *b == bound).map_or(0, |(_, n)| *n);
        let none = Scrape::default();
        Scrape {
            reconciles: self.reconciles - earlier.reconciles,
            buckets: self.buckets.iter().map(|&(b, n)| (b, n.saturating_sub(before(b)))).collect(),
            controllers: self
                .controllers
                .iter()
                .map(|(name, c)| (name.clone(), c.minus(earlier.controllers.get(name).unwrap_or(&none))))
                .collect(),
        }
    }

    /// The `q` quantile of each controller.
    fn quantiles(&self, q: f64) -> BTreeMap<String, f64> {
        self.controllers.iter().map(|(name, c)| (name.clone(), c.quantile(q))).collect()
    }

    /// The `q` quantile, interpolated within its bucket (the largest finite bound when it falls
    /// beyond it).
    fn quantile(&self, q: f64) -> f64 {
        let Some(&(_, count)) = self.buckets.last() else { return f64::NAN };
        let rank = q * count as f64;
        let mut previous = (0.0, 0);
        for &(bound, cumulative) in &self.buckets {
            if cumulative as f64 >= rank {
                if bound.is_infinite() {
                    return previous.0;
                }
                let within = (cumulative - previous.1) as f64;
                let fraction = if within > 0.0 { (rank - previous.1 as f64) / within } else { 1.0 };
                return previous.0 + (bound - previous.0) * fraction;
            }
            previous = (bound, cumulative);
        }
        previous.0
    }
}

/// The flags the benchmark runs the operator with.
struct OperatorFlags {
    resync_seconds: u64,
    concurrency: Option<u16>,
}

impl Operator {
    fn start(
        cluster: &Cluster,
        trainers: &trainers::Trainers,
        flags: &OperatorFlags,
        name: &str,
    ) -> anyhow::Result<Operator> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::File::create(cluster.dir.join(format!("logs/operator-{name}.log")))?;
        let child = Command::new(std::env::current_exe()?)
            .args(["run", "--http-port", &port.to_string(), "--log-format", "json"])
            .args(["--resync-seconds", &flags.resync_seconds.to_string()])
            .args(flags.concurrency.map(|n| format!("--concurrency={n}")))
            .env("KUBECONFIG", cluster.dir.join("operator.kubeconfig"))
            .env("POD_NAME", format!("kart-operator-{name}"))
            .env("HTTP_PROXY", &trainers.url)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        Ok(Operator { child, port })
    }

    async fn wait_listening(&mut self) -> anyhow::Result<()> {
        let start = Instant::now();
        while self.metrics().await.is_err() {
            self.check_alive()?;
            if start.elapsed() > DEADLINE {
                bail!("the operator's /metrics did not answer within {DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    async fn metrics(&self) -> anyhow::Result<Scrape> {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        let text = reqwest::get(&url).await?.error_for_status()?.text().await?;
        Ok(Scrape::parse(&text))
    }

    /// Resident memory now, in MB (from /proc).
    fn rss_mb(&self) -> f64 {
        kart_http::process::resident_mb(self.child.id())
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("the operator exited ({status}); its log is in the control plane's logs/"),
            None => Ok(()),
        }
    }

    /// SIGTERM, and waits for it to exit.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = i32::try_from(self.child.id()).context("a pid")?;
        // SAFETY: a signal to a child of this process, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn print(r: &Report) {
    let ratio = |value: f64, goal: f64| if goal > 0.0 { format!("{:.2}", value / goal) } else { "-".into() };
    let pass = |ok: bool| if ok { "yes" } else { "NO" };
    println!(
        "kart bench operator: {} TrainingJobs, {} RolloutPools, {} Retrievers in {} namespaces on {} KWOK nodes",
        r.counts.training_jobs, r.counts.rollout_pools, r.counts.retrievers, r.counts.namespaces, r.nodes
    );
    println!("{:<44} {:>12} {:>10} {:>7} {:>5}", "measure", "value", "goal", "ratio", "met");
    let row = |name: &str, value: f64, unit: &str, goal: Option<f64>, ok: Option<bool>| {
        let goal_text = goal.map_or_else(|| "-".into(), |g| format!("{g}{unit}"));
        let ratio_text = goal.map_or_else(|| "-".into(), |g| ratio(value, g));
        let met = ok.map_or("-", pass);
        println!("{name:<44} {:>12} {goal_text:>10} {ratio_text:>7} {met:>5}", format!("{value:.2}{unit}"));
    };
    row(
        "time until every object has a phase",
        r.all_phased_secs,
        " s",
        Some(300.0),
        Some(r.all_phased_secs <= 300.0),
    );
    row("time until settled (no write)", r.settled_secs, " s", None, None);
    row("reconciles per second (until settled)", r.reconciles_per_sec, "", None, None);
    row("p50 reconcile latency", r.p50_reconcile_secs * 1000.0, " ms", None, None);
    row(
        "p99 reconcile latency (until settled)",
        r.p99_reconcile_secs * 1000.0,
        " ms",
        Some(500.0),
        Some(r.p99_reconcile_secs <= 0.5),
    );
    row(
        "p99 reconcile latency at steady state",
        r.p99_steady_reconcile_secs * 1000.0,
        " ms",
        Some(500.0),
        Some(r.p99_steady_reconcile_secs <= 0.5),
    );
    let by_controller = |m: &BTreeMap<String, f64>| {
        m.iter().map(|(k, v)| format!("{k} {:.1} ms", v * 1000.0)).collect::<Vec<_>>().join(", ")
    };
    println!("  p99 by controller until settled: {}", by_controller(&r.p99_reconcile_secs_by_controller));
    println!(
        "  p99 by controller at steady state: {}",
        by_controller(&r.p99_steady_reconcile_secs_by_controller)
    );
    row("peak resident memory", r.peak_rss_mb, " MB", Some(300.0), Some(r.peak_rss_mb <= 300.0));
    row(
        "writes per minute at steady state",
        r.steady_writes_per_min,
        "",
        Some(0.0),
        Some(r.steady_writes.is_empty()),
    );
    row("  Lease renewals per minute (leader election)", r.lease_writes_per_min, "", None, None);
    let restart_writes: usize = r.restart_child_writes.values().sum();
    row("child writes after a restart", restart_writes as f64, "", Some(0.0), Some(restart_writes == 0));
    row("status writes after a restart", r.restart_status_writes as f64, "", None, None);
    row("restart: every object reconciled after", r.restart_relist_secs, " s", None, None);
    let verbs = |m: &BTreeMap<String, usize>| {
        m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    };
    println!("phases once every object had one: {}", verbs(&r.phases));
    println!("phases at the end: {}; their Pods: {}", verbs(&r.settled_phases), verbs(&r.pods));
    println!("API requests until settled ({} reconciles): {}", r.reconciles, verbs(&r.requests));
    println!("trainer /status reads answered: {}", r.status_reads);
    println!(
        "steady state ({:.0} s, {} reconciles) writes: {}",
        r.steady_secs,
        r.steady_reconciles,
        verbs(&r.steady_writes)
    );
    println!(
        "after the restart: requests {}; child writes {}",
        verbs(&r.restart_requests),
        verbs(&r.restart_child_writes)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_the_histograms_buckets() {
        let text = "# TYPE x histogram\n\
            kart_operator_reconcile_duration_seconds_bucket{controller=\"a\",le=\"0.1\"} 50\n\
            kart_operator_reconcile_duration_seconds_bucket{controller=\"a\",le=\"0.5\"} 90\n\
            kart_operator_reconcile_duration_seconds_bucket{controller=\"a\",le=\"+Inf\"} 100\n\
            kart_operator_reconcile_duration_seconds_bucket{controller=\"b\",le=\"0.1\"} 50\n\
            kart_operator_reconcile_duration_seconds_bucket{controller=\"b\",le=\"0.5\"} 100\n\
            kart_operator_reconcile_duration_seconds_bucket{controller=\"b\",le=\"+Inf\"} 100\n\
            kart_operator_reconciles_total{controller=\"a\"} 100\n\
            kart_operator_reconciles_total{controller=\"b\"} 100\n";
        let scrape = Scrape::parse(text);
        assert_eq!(scrape.reconciles, 200);
        assert_eq!(scrape.buckets, vec![(0.1, 100), (0.5, 190), (f64::INFINITY, 200)]);
        assert!((scrape.quantile(0.5) - 0.1).abs() < 1e-9);
        // Rank 150 lies halfway through the second bucket's 90.
        assert!((scrape.quantile(0.75) - (0.1 + 0.4 * 50.0 / 90.0)).abs() < 1e-9);
        // Beyond the largest finite bound: that bound.
        assert_eq!(scrape.quantile(0.99), 0.5);
        let none = scrape.minus(&scrape);
        assert_eq!((none.reconciles, none.buckets[2]), (0, (f64::INFINITY, 0)));
        assert_eq!(scrape.minus(&Scrape::default()).buckets, scrape.buckets);
        let by_controller = scrape.quantiles(0.9);
        assert_eq!((by_controller["a"], by_controller["b"]), (0.5, 0.1 + 0.4 * 40.0 / 50.0));
        assert_eq!(scrape.controllers["a"].reconciles, 100);
    }
}
