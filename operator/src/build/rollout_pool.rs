//! A RolloutPool's children: the rendered config, the worker Deployment and Service, and for an
//! `sglang` or `vllm` engine with `spec.inference`, the inference server Deployment and Service.

use super::meta::{self, child};
use super::objects::{config_map, deployment, service, token_secret};
use super::pod::{ContainerParts, config_mount, config_volume, env, template, token_env};
use super::{
    InvalidSpec, ROLLOUT_PORT, SGLANG_PORT, Settings, TRAINER_PORT, VLLM_PORT, config_path, retriever,
    training_job,
};
use crate::crd::RolloutPool;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kart_core::config::rollout::{EngineConfig, RolloutConfig};
use kart_core::config::train::InferenceServer;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Component label of the worker pods.
pub const COMPONENT: &str = "rollout";

/// Everything a RolloutPool owns.
#[derive(Debug, Clone)]
pub struct RolloutPoolChildren {
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub service: Service,
    /// The token the workers and the trainers using the pool share (created once).
    pub token: Secret,
    /// The inference servers, when the operator runs them.
    pub inference: Option<Inference>,
}

/// The SGLang or vLLM servers of a pool.
#[derive(Debug, Clone)]
pub struct Inference {
    pub deployment: Deployment,
    /// The Service the workers generate through.
    pub service: Service,
    /// A headless Service with a DNS record per ready server, through which a trainer updates
    /// every replica's weights.
    pub replicas: Service,
}

/// Name of the worker Deployment, Service and ConfigMap.
pub fn workload_name(name: &str) -> String {
    format!("{name}-rollout")
}

/// Name of the Secret holding the pool's token.
pub fn token_secret_name(name: &str) -> String {
    format!("{name}-token")
}

/// The URL standing for every ready `server` of pool `pool` in `namespace` (its headless
/// replicas Service), for `weight_sync.urls`.
pub fn replicas_url(server: InferenceServer, pool: &str, namespace: &str) -> String {
    match server {
        InferenceServer::Sglang => meta::endpoint(&format!("{pool}-sglang-replicas"), namespace, SGLANG_PORT),
        InferenceServer::Vllm => meta::endpoint(&format!("{pool}-vllm-replicas"), namespace, VLLM_PORT),
    }
}

/// The URL the trainer reaches the pool at.
pub fn endpoint(pool: &RolloutPool) -> String {
    meta::endpoint(&workload_name(&pool.name_any()), &pool.namespace().unwrap_or_default(), ROLLOUT_PORT)
}

/// The worker pods' label selector (the scale subresource's `.status.selector`).
pub fn selector(pool: &RolloutPool) -> String {
    meta::selector_string(&pool.name_any(), COMPONENT)
}

/// The inference server the operator runs: its component name (`sglang`, `vllm`) and port.
fn server_kind(pool: &RolloutPool) -> Option<(&'static str, u16)> {
    pool.spec.inference.as_ref()?;
    match pool.spec.config.engine {
        EngineConfig::Sglang { .. } => Some(("sglang", SGLANG_PORT)),
        EngineConfig::Vllm { .. } => Some(("vllm", VLLM_PORT)),
        EngineConfig::Embedded { .. } => None,
    }
}

/// Where a pool's workers may read weights files from when `weight_sources.path_prefix` is unset:
/// nothing unless a shared volume is mounted there.
pub const SHARED_WEIGHTS_DIR: &str = "/var/lib/kart/weights";

/// The config the workers read: the user's with host and port set, the retriever URL from
/// `retrieverRef` and the engine URLs from the inference Service when unset, and weights admitted
/// (when `weight_sources` leaves them open) from the trainers of the namespace and files under
/// [`SHARED_WEIGHTS_DIR`].
pub fn render_config(pool: &RolloutPool) -> RolloutConfig {
    let name = pool.name_any();
    let namespace = pool.namespace().unwrap_or_default();
    let mut config = pool.spec.config.clone();
    config.host = "0.0.0.0".into();
    config.port = ROLLOUT_PORT;
    let sources = &mut config.weight_sources;
    if sources.url_prefixes.is_empty() {
        let trainers = meta::endpoint(&training_job::workload_name("*"), &namespace, TRAINER_PORT);
        sources.url_prefixes.push(format!("{trainers}/weights/"));
    }
    sources.path_prefix.get_or_insert_with(|| SHARED_WEIGHTS_DIR.into());
    if config.context.retriever_url.is_none()
        && let Some(r) = &pool.spec.retriever_ref
    {
        config.context.retriever_url =
            Some(meta::endpoint(&retriever::workload_name(r), &namespace, super::RETRIEVER_PORT));
    }
    if let Some((kind, port)) = server_kind(pool) {
        let url = meta::endpoint(&format!("{name}-{kind}"), &namespace, port);
        match &mut config.engine {
            EngineConfig::Sglang { urls, .. } | EngineConfig::Vllm { urls, .. } if urls.is_empty() => {
                urls.push(url)
            }
            _ => {}
        }
    }
    config
}

/// Checks what the CRD's schema and rules cannot (or an API server without CEL did not).
pub fn validate(pool: &RolloutPool) -> Result<(), InvalidSpec> {
    let spec = &pool.spec;
    if spec.replicas < 0 {
        return Err(InvalidSpec::new("spec.replicas", spec.replicas, "must be >= 0"));
    }
    if spec.config.model.as_os_str().is_empty() {
        return Err(InvalidSpec::new("spec.config.model", "\"\"", "a Hugging Face model folder is required"));
    }
    match (&spec.config.engine, &spec.inference) {
        (EngineConfig::Embedded { .. }, Some(_)) => Err(InvalidSpec::new(
            "spec.inference",
            "set",
            "inference servers need config.engine.kind sglang or vllm, not embedded",
        )),
        (EngineConfig::Sglang { urls, .. } | EngineConfig::Vllm { urls, .. }, None) if urls.is_empty() => {
            Err(InvalidSpec::new("spec.config.engine.urls", "[]", "set the server URLs or spec.inference"))
        }
        _ => Ok(()),
    }
}

/// The RolloutPool's children.
pub fn children(pool: &RolloutPool, settings: &Settings) -> Result<RolloutPoolChildren, InvalidSpec> {
    validate(pool)?;
    let name = pool.name_any();
    let spec = &pool.spec;
    let workload = workload_name(&name);
    let text = serde_json::to_string_pretty(&render_config(pool)).expect("the config serialises");
    let pod = template(
        settings,
        &spec.pod,
        meta::labels(&name, COMPONENT),
        BTreeMap::from([("kart.dev/config-hash".to_string(), meta::config_hash(&text))]),
        ContainerParts {
            name: "rollout".into(),
            command: vec!["kart".into()],
            args: vec!["rollout".into(), "serve".into(), "--config".into(), config_path()],
            ports: vec![("http", ROLLOUT_PORT)],
            probes: Some(("/readyz", Some("/healthz"))),
            mounts: vec![config_mount()],
            env: vec![token_env(&name)],
            ..ContainerParts::default()
        },
        vec![config_volume(&workload)],
        None,
    );
    Ok(RolloutPoolChildren {
        config_map: config_map(child(pool, &workload, COMPONENT), text),
        deployment: deployment(
            child(pool, &workload, COMPONENT),
            spec.replicas,
            meta::selector(&name, COMPONENT),
            pod,
        ),
        service: service(
            child(pool, &workload, COMPONENT),
            meta::selector(&name, COMPONENT),
            &[("http", ROLLOUT_PORT)],
            false,
        ),
        token: token_secret(child(pool, &token_secret_name(&name), COMPONENT)),
        inference: inference(pool, settings),
    })
}

/// The SGLang or vLLM Deployment and Services, serving `config.model`.
fn inference(pool: &RolloutPool, settings: &Settings) -> Option<Inference> {
    let (kind, port) = server_kind(pool)?;
    let server = pool.spec.inference.as_ref()?;
    let name = pool.name_any();
    let workload = format!("{name}-{kind}");
    let model = pool.spec.config.model.display().to_string();
    let (image, command, mut args, environment) = match &pool.spec.config.engine {
        // The RL routes (weight transfer, `/weight_info`) exist in dev mode only; a trainer of
        // LoRA adapters loads them at run time (with `--enable-lora` among the pool's args).
        EngineConfig::Vllm { model: served, .. } => (
            "vllm/vllm-openai:latest",
            vec!["vllm".to_string(), "serve".into(), model],
            vec![
                "--served-model-name".to_string(),
                served.clone(),
                "--host".into(),
                "0.0.0.0".into(),
                "--weight-transfer-config".into(),
                r#"{"backend": "nccl"}"#.into(),
            ],
            vec![env("VLLM_SERVER_DEV_MODE", "1"), env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")],
        ),
        _ => (
            "lmsysorg/sglang:latest",
            vec!["python3".to_string(), "-m".into(), "sglang.launch_server".into()],
            vec!["--model-path".to_string(), model, "--host".into(), "0.0.0.0".into()],
            Vec::new(),
        ),
    };
    args.extend(["--port".into(), port.to_string()]);
    args.extend(server.args.iter().cloned());
    let pod = template(
        settings,
        &server.pod,
        meta::labels(&name, kind),
        BTreeMap::new(),
        ContainerParts {
            name: kind.into(),
            image: Some(image.into()),
            command,
            args,
            ports: vec![("http", port)],
            env: environment,
            // Loading a model takes minutes: readiness only, no liveness probe.
            probes: Some(("/health", None)),
            ..ContainerParts::default()
        },
        Vec::new(),
        None,
    );
    let selector = meta::selector(&name, kind);
    Some(Inference {
        deployment: deployment(child(pool, &workload, kind), server.replicas, selector.clone(), pod),
        service: service(child(pool, &workload, kind), selector.clone(), &[("http", port)], false),
        replicas: service(
            child(pool, &format!("{workload}-replicas"), kind),
            selector,
            &[("http", port)],
            true,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures;

    #[test]
    fn sglang_pool_gets_servers_and_workers_pointing_at_them() {
        let pool = fixtures::rollout_pool();
        let c = children(&pool, &Settings { image: "kart:test".into() }).unwrap();
        let config: RolloutConfig =
            serde_json::from_str(&c.config_map.data.as_ref().unwrap()["config.json"]).unwrap();
        assert_eq!(config.context.retriever_url.as_deref(), Some("http://wiki-retriever.ml.svc:8000"));
        assert_eq!(config.port, 8001);
        // Weights from the namespace's trainers (`<job>-trainer`) and the shared folder only.
        assert_eq!(config.weight_sources.url_prefixes, ["http://*-trainer.ml.svc:8002/weights/"]);
        assert_eq!(
            config.weight_sources.path_prefix.as_deref(),
            Some(std::path::Path::new(SHARED_WEIGHTS_DIR))
        );
        config.weight_sources.validate().unwrap();
        let trainer = kart_core::wire::WeightSource {
            version: 1,
            url: Some("http://run-trainer.ml.svc:8002/weights/1".into()),
            path: None,
            run: None,
            lora: None,
        };
        config.weight_sources.admits(&trainer).unwrap();
        match &config.engine {
            EngineConfig::Sglang { urls, .. } => assert_eq!(urls, &["http://pool-sglang.ml.svc:30000"]),
            other => panic!("engine {other:?}"),
        }
        let d = c.deployment.spec.as_ref().unwrap();
        assert_eq!(d.replicas, Some(2));
        let worker = &d.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(worker.args.as_ref().unwrap(), &["rollout", "serve", "--config", "/etc/kart/config.json"]);
        assert_eq!(worker.ports.as_ref().unwrap()[0].container_port, 8001);
        // The token: a fresh 64-hex-digit value in the pool's Secret, which the workers read.
        assert_eq!(c.token.metadata.name.as_deref(), Some("pool-token"));
        let token = &c.token.data.as_ref().unwrap()["token"].0;
        assert!(token.len() == 64 && token.iter().all(u8::is_ascii_hexdigit), "{token:?}");
        let again = children(&pool, &Settings { image: "kart:test".into() }).unwrap();
        assert_ne!(again.token.data.as_ref().unwrap()["token"].0, *token, "random, so created once");
        let env = &worker.env.as_ref().unwrap()[0];
        let secret = env.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!(
            (env.name.as_str(), secret.name.as_str(), secret.key.as_str()),
            ("KART_TOKEN", "pool-token", "token")
        );

        let Inference { deployment: server, service, replicas } = c.inference.as_ref().unwrap();
        assert_eq!(server.metadata.name.as_deref(), Some("pool-sglang"));
        let replicas_spec = replicas.spec.as_ref().unwrap();
        assert_eq!(replicas.metadata.name.as_deref(), Some("pool-sglang-replicas"));
        assert_eq!(replicas_spec.cluster_ip.as_deref(), Some("None"), "a DNS record per server");
        assert_eq!(replicas_spec.publish_not_ready_addresses, None, "only servers that loaded a model");
        assert_eq!(replicas_spec.selector, service.spec.as_ref().unwrap().selector);
        assert_eq!(
            replicas_url(InferenceServer::Sglang, "pool", "ml"),
            "http://pool-sglang-replicas.ml.svc:30000"
        );
        let container = &server.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some("lmsysorg/sglang:latest"));
        assert_eq!(container.command.as_ref().unwrap(), &["python3", "-m", "sglang.launch_server"]);
        assert_eq!(
            container.args.as_ref().unwrap(),
            &[
                "--model-path",
                "/models/qwen",
                "--host",
                "0.0.0.0",
                "--port",
                "30000",
                "--mem-fraction-static",
                "0.8"
            ]
        );
        let gpus = &container.resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"];
        assert_eq!(gpus.0, "1");
        assert!(container.liveness_probe.is_none(), "model loading must not be killed by a liveness probe");
        assert_eq!(service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 30000);
        assert_eq!(selector(&pool), "app.kubernetes.io/component=rollout,app.kubernetes.io/instance=pool");
    }

    #[test]
    fn vllm_serves_the_model_under_its_name() {
        let mut pool = fixtures::rollout_pool();
        pool.spec.config.engine =
            EngineConfig::Vllm { urls: vec![], model: "qwen".into(), timeout_secs: 60.0 };
        let c = children(&pool, &Settings::default()).unwrap();
        let server = &c.inference.as_ref().unwrap().deployment;
        let container = &server.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.command.as_ref().unwrap(), &["vllm", "serve", "/models/qwen"]);
        assert!(container.args.as_ref().unwrap().windows(2).any(|w| w == ["--served-model-name", "qwen"]));
        assert!(container.args.as_ref().unwrap().windows(2).any(|w| w == ["--port", "8000"]));
        let args = container.args.as_ref().unwrap();
        assert!(args.windows(2).any(|w| w == ["--weight-transfer-config", r#"{"backend": "nccl"}"#]));
        let env = container.env.as_ref().unwrap();
        assert!(env.iter().any(|e| e.name == "VLLM_SERVER_DEV_MODE" && e.value.as_deref() == Some("1")));
        let replicas = c.inference.as_ref().unwrap().replicas.metadata.name.as_deref();
        assert_eq!(replicas, Some("pool-vllm-replicas"));
        assert_eq!(
            replicas_url(InferenceServer::Vllm, "pool", "ml"),
            "http://pool-vllm-replicas.ml.svc:8000"
        );
    }

    #[test]
    fn invalid_engine_combinations_are_named() {
        let mut pool = fixtures::rollout_pool();
        pool.spec.inference = None;
        assert!(validate(&pool).unwrap_err().to_string().starts_with("spec.config.engine.urls = []"));
        let mut pool = fixtures::rollout_pool();
        pool.spec.config.engine = EngineConfig::default();
        assert!(validate(&pool).unwrap_err().to_string().starts_with("spec.inference = set"));
        let mut pool = fixtures::rollout_pool();
        pool.spec.replicas = -1;
        assert_eq!(validate(&pool).unwrap_err().to_string(), "spec.replicas = -1: must be >= 0");
    }
}
