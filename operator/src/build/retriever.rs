//! A Retriever's children: the rendered config, the index claim, the index-build Job, and the
//! serving Deployment and Service.
//!
//! The index is built once: the controller runs the Job while `status.indexBuilt` is false and
//! sets it when the Job succeeded; from then on only the Deployment reads the volume (read-only).
//! `index.prebuilt` (an existing claim that holds an index) and the online `serper` method skip
//! the Job.

use super::meta::{self, child};
use super::objects::{claim, config_map, deployment, service};
use super::pod::{
    ContainerParts, STATUS_FILE, claim_volume, config_mount, config_volume, env, mount, template,
};
use super::{INDEX_DIR, InvalidSpec, RETRIEVER_PORT, Settings, config_path};
use crate::crd::Retriever;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kart_core::config::retriever::{MAX_TOPK, Method, RetrieverConfig};
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Component label of the serving pods.
pub const COMPONENT: &str = "retriever";
/// Component label of the index-build pod.
pub const INDEX_COMPONENT: &str = "retriever-index";

/// Everything a Retriever owns.
#[derive(Debug, Clone)]
pub struct RetrieverChildren {
    pub config_map: ConfigMap,
    /// The index claim, unless the spec names an existing one or needs no index.
    pub claim: Option<PersistentVolumeClaim>,
    /// The index-build Job, unless the index is prebuilt or not needed.
    pub index_job: Option<Job>,
    pub deployment: Deployment,
    pub service: Service,
}

/// Name of the Deployment, Service and ConfigMap.
pub fn workload_name(name: &str) -> String {
    format!("{name}-retriever")
}

/// Name of the index claim and the index-build Job.
pub fn index_name(name: &str) -> String {
    format!("{name}-retriever-index")
}

/// The URL clients reach the retriever at.
pub fn endpoint(ret: &Retriever) -> String {
    meta::endpoint(&workload_name(&ret.name_any()), &ret.namespace().unwrap_or_default(), RETRIEVER_PORT)
}

/// Whether the retriever serves from a local index.
pub fn needs_index(ret: &Retriever) -> bool {
    ret.spec.config.method != Method::Serper
}

/// The config the pods read: the user's with index, host and port set.
pub fn render_config(ret: &Retriever) -> RetrieverConfig {
    let mut config = ret.spec.config.clone();
    config.index = needs_index(ret).then(|| INDEX_DIR.into());
    config.host = "0.0.0.0".into();
    config.port = RETRIEVER_PORT;
    config
}

/// Checks what the CRD's schema and rules cannot (or an API server without CEL did not).
pub fn validate(ret: &Retriever) -> Result<(), InvalidSpec> {
    let spec = &ret.spec;
    if spec.replicas < 0 {
        return Err(InvalidSpec::new("spec.replicas", spec.replicas, "must be >= 0"));
    }
    if !(1..=MAX_TOPK).contains(&spec.config.topk) {
        return Err(InvalidSpec::new(
            "spec.config.topk",
            spec.config.topk,
            format!("must be in 1..={MAX_TOPK}"),
        ));
    }
    if needs_index(ret) && !spec.index.prebuilt && spec.corpus.as_deref().is_none_or(str::is_empty) {
        return Err(InvalidSpec::new(
            "spec.corpus",
            "null",
            "a bm25 or dense retriever needs a corpus to index",
        ));
    }
    if let Some(ann) = &spec.index.ann {
        let value = || serde_json::to_string(ann).expect("the config serialises");
        if spec.config.method != Method::Dense || spec.index.prebuilt {
            return Err(InvalidSpec::new(
                "spec.index.ann",
                value(),
                "an approximate graph is built over a dense index the Job builds: config.method must \
                 be dense and index.prebuilt false",
            ));
        }
        if ann.connectivity < 2 {
            return Err(InvalidSpec::new(
                "spec.index.ann.connectivity",
                ann.connectivity,
                "must be at least 2",
            ));
        }
        if ann.expansion_add < 1 {
            return Err(InvalidSpec::new(
                "spec.index.ann.expansion_add",
                ann.expansion_add,
                "must be at least 1",
            ));
        }
    }
    if spec.config.method == Method::Dense && spec.config.encoder.model.is_none() {
        return Err(InvalidSpec::new(
            "spec.config.encoder.model",
            "null",
            "a dense retriever needs an encoder",
        ));
    }
    Ok(())
}

/// The Retriever's children.
pub fn children(ret: &Retriever, settings: &Settings) -> Result<RetrieverChildren, InvalidSpec> {
    validate(ret)?;
    let name = ret.name_any();
    let spec = &ret.spec;
    let workload = workload_name(&name);
    let index = index_name(&name);
    let text = serde_json::to_string_pretty(&render_config(ret)).expect("the config serialises");
    let hash = meta::config_hash(&text);
    let claim_name = spec.index.existing_claim.clone().unwrap_or_else(|| index.clone());
    let local = needs_index(ret);

    let mut volumes = vec![config_volume(&workload)];
    let mut mounts = vec![config_mount()];
    if local {
        volumes.push(claim_volume("index", &claim_name, true));
        mounts.push(mount("index", INDEX_DIR, true));
    }
    let pod = template(
        settings,
        &spec.pod,
        meta::labels(&name, COMPONENT),
        BTreeMap::from([("kart.dev/config-hash".to_string(), hash)]),
        ContainerParts {
            name: "retriever".into(),
            command: vec!["kart".into()],
            args: vec!["retriever".into(), "serve".into(), "--config".into(), config_path()],
            ports: vec![("http", RETRIEVER_PORT)],
            probes: Some(("/readyz", Some("/healthz"))),
            mounts,
            ..ContainerParts::default()
        },
        volumes,
        None,
    );

    let claim = (local && spec.index.existing_claim.is_none()).then(|| {
        claim(
            child(ret, &index, INDEX_COMPONENT),
            &spec.index.size,
            spec.index.storage_class_name.as_ref(),
            &spec.index.access_modes,
        )
    });
    let index_job = (local && !spec.index.prebuilt).then(|| index_job(ret, settings, &index, &claim_name));
    Ok(RetrieverChildren {
        config_map: config_map(child(ret, &workload, COMPONENT), text),
        claim,
        index_job,
        deployment: deployment(
            child(ret, &workload, COMPONENT),
            spec.replicas,
            meta::selector(&name, COMPONENT),
            pod,
        ),
        service: service(
            child(ret, &workload, COMPONENT),
            meta::selector(&name, COMPONENT),
            &[("http", RETRIEVER_PORT)],
            false,
        ),
    })
}

/// The Job that runs `kart retriever index` into the index volume.
fn index_job(ret: &Retriever, settings: &Settings, name: &str, claim_name: &str) -> Job {
    let spec = &ret.spec;
    let method = match spec.config.method {
        Method::Dense => "dense",
        _ => "bm25",
    };
    let mut args = vec![
        "retriever".to_string(),
        "index".into(),
        "--corpus".into(),
        spec.corpus.clone().unwrap_or_default(),
        "--method".into(),
        method.into(),
        "--out".into(),
        INDEX_DIR.into(),
    ];
    if let (Method::Dense, Some(model)) = (spec.config.method, &spec.config.encoder.model) {
        args.extend(["--encoder".into(), model.display().to_string()]);
    }
    if let Some(ann) = &spec.index.ann {
        let quantization = serde_json::to_value(ann.quantization).expect("the config serialises");
        args.extend([
            "--ann".into(),
            "hnsw".into(),
            "--ann-connectivity".into(),
            ann.connectivity.to_string(),
            "--ann-expansion-add".into(),
            ann.expansion_add.to_string(),
            "--ann-quantization".into(),
            quantization.as_str().expect("a unit variant").into(),
        ]);
    }
    let pod = template(
        settings,
        &spec.pod,
        meta::labels(&ret.name_any(), INDEX_COMPONENT),
        BTreeMap::new(),
        ContainerParts {
            name: "index".into(),
            command: vec!["kart".into()],
            args,
            // The passage count, read into `status.documentsIndexed`.
            env: vec![env("KART_STATUS_FILE", STATUS_FILE)],
            mounts: vec![mount("index", INDEX_DIR, false)],
            ..ContainerParts::default()
        },
        vec![claim_volume("index", claim_name, false)],
        Some("Never"),
    );
    Job {
        metadata: child(ret, name, INDEX_COMPONENT),
        spec: Some(JobSpec { backoff_limit: Some(2), template: pod, ..JobSpec::default() }),
        ..Job::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;
    use kart_core::config::retriever::{AnnConfig, AnnQuantization};

    fn args(job: &Job) -> Vec<String> {
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        pod.containers[0].args.clone().unwrap()
    }

    #[test]
    fn bm25_retriever_gets_index_job_claim_and_server() {
        let ret = fixtures::retriever();
        let c = children(&ret, &Settings { image: "kart:test".into() }).unwrap();
        let config: RetrieverConfig =
            serde_json::from_str(&c.config_map.data.as_ref().unwrap()["config.json"]).unwrap();
        assert_eq!(config.index.as_deref(), Some(std::path::Path::new(INDEX_DIR)));
        assert_eq!((config.port, config.host.as_str(), config.topk), (8000, "0.0.0.0", 3));
        let job = c.index_job.as_ref().unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("wiki-retriever-index"));
        assert_eq!(
            args(job),
            [
                "retriever",
                "index",
                "--corpus",
                "/data/wiki-18.jsonl.gz",
                "--method",
                "bm25",
                "--out",
                INDEX_DIR
            ]
        );
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let claims: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|p| p.claim_name.as_str())
            .collect();
        assert_eq!(claims, ["wiki-retriever-index", "corpus"], "the index claim, then the user's volume");
        assert_eq!(c.claim.as_ref().unwrap().metadata.name.as_deref(), Some("wiki-retriever-index"));

        let d = &c.deployment;
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].kind, "Retriever");
        assert_eq!(d.metadata.owner_references.as_ref().unwrap()[0].controller, Some(true));
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("kart:test"));
        assert_eq!(container.command.as_deref(), Some(&["kart".to_string()][..]));
        assert_eq!(
            container.args.as_ref().unwrap(),
            &["retriever", "serve", "--config", "/etc/kart/config.json"]
        );
        let probe = container.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(
            (probe.path.as_deref(), &probe.port),
            (Some("/readyz"), &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8000))
        );
        // Probes wait for a busy node's answer longer than Kubernetes' default of 1 s.
        let timeouts = [&container.readiness_probe, &container.liveness_probe]
            .map(|p| p.as_ref().and_then(|p| p.timeout_seconds));
        assert_eq!(timeouts, [Some(5), Some(10)]);
        let mounts: Vec<_> =
            container.volume_mounts.iter().flatten().map(|m| (m.mount_path.as_str(), m.read_only)).collect();
        assert_eq!(
            mounts,
            [("/etc/kart", Some(true)), (INDEX_DIR, Some(true)), ("/data", None), ("/tmp", None)]
        );
        let config_volume = pod.volumes.as_ref().unwrap()[0].config_map.as_ref().unwrap();
        assert_eq!(config_volume.name, "wiki-retriever");
        let s = c.service.spec.as_ref().unwrap();
        assert_eq!(s.ports.as_ref().unwrap()[0].port, 8000);
        assert_eq!(s.selector, d.spec.as_ref().unwrap().selector.match_labels);
        assert_eq!(endpoint(&ret), "http://wiki-retriever.ml.svc:8000");
    }

    #[test]
    fn dense_passes_the_encoder_and_serper_needs_no_index() {
        let mut ret = fixtures::retriever();
        ret.spec.config.method = Method::Dense;
        ret.spec.config.encoder.model = Some("/models/e5".into());
        let c = children(&ret, &Settings::default()).unwrap();
        let a = args(c.index_job.as_ref().unwrap());
        assert_eq!(&a[4..], ["--method", "dense", "--out", INDEX_DIR, "--encoder", "/models/e5"]);

        // An approximate graph is built by the same Job, with the spec's settings.
        ret.spec.index.ann =
            Some(AnnConfig { connectivity: 16, expansion_add: 64, quantization: AnnQuantization::F16 });
        let c = children(&ret, &Settings::default()).unwrap();
        let a = args(c.index_job.as_ref().unwrap());
        assert_eq!(
            &a[10..],
            [
                "--ann",
                "hnsw",
                "--ann-connectivity",
                "16",
                "--ann-expansion-add",
                "64",
                "--ann-quantization",
                "f16"
            ]
        );
        ret.spec.index.ann = Some(AnnConfig { connectivity: 1, ..AnnConfig::default() });
        let err = children(&ret, &Settings::default()).unwrap_err().to_string();
        assert!(err.contains("spec.index.ann.connectivity") && err.contains('1'), "{err}");
        ret.spec.index.ann = Some(AnnConfig::default());
        ret.spec.index.prebuilt = true;
        let err = children(&ret, &Settings::default()).unwrap_err().to_string();
        assert!(err.contains("spec.index.ann") && err.contains("index.prebuilt false"), "{err}");

        let mut ret = fixtures::retriever();
        ret.spec.config.method = Method::Serper;
        ret.spec.corpus = None;
        let c = children(&ret, &Settings::default()).unwrap();
        assert!(c.index_job.is_none() && c.claim.is_none());
        let text = &c.config_map.data.as_ref().unwrap()["config.json"];
        assert!(text.contains("\"index\": null"), "{text}");
    }

    #[test]
    fn invalid_specs_name_field_and_value() {
        let mut ret = fixtures::retriever();
        ret.spec.config.topk = 0;
        assert_eq!(validate(&ret).unwrap_err().to_string(), "spec.config.topk = 0: must be in 1..=1000");
        let mut ret = fixtures::retriever();
        ret.spec.corpus = None;
        assert!(validate(&ret).unwrap_err().to_string().starts_with("spec.corpus = null"));
        ret.spec.index.prebuilt = true;
        assert!(validate(&ret).is_ok(), "a prebuilt index needs no corpus");
        let mut ret = fixtures::retriever();
        ret.spec.config.method = Method::Dense;
        assert!(validate(&ret).unwrap_err().to_string().starts_with("spec.config.encoder.model = null"));
    }
}
