//! Containers and pod templates, with the user's [`PodOverrides`] applied on top of what the
//! operator sets.

use super::{CONFIG_DIR, Settings};
use crate::crd::pod::PodOverrides;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, SeccompProfile, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// Where a workload writes its final report (`KART_STATUS_FILE`: the trainer its `/status` JSON,
/// the index build its passage count): the container's termination message, which the
/// controllers read when its Job ends.
pub const STATUS_FILE: &str = "/dev/termination-log";

/// The group the kart image runs as (`USER 65532:65532` in `deploy/Dockerfile.worker`).
pub const IMAGE_GROUP: i64 = 65532;

/// The pods' security context unless overridden: volumes are made writable by the image's group
/// (checked and changed only at their root when it does not match, not file by file: an index
/// volume holds millions of files).
pub fn default_pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        fs_group: Some(IMAGE_GROUP),
        fs_group_change_policy: Some("OnRootMismatch".into()),
        ..PodSecurityContext::default()
    }
}

/// The volume of kart containers' scratch space, an `emptyDir` at /tmp.
pub const SCRATCH_VOLUME: &str = "tmp";

/// Kart containers' security context unless overridden (`pod.securityContext` replaces it whole):
/// the restricted Pod Security Standard, on a read-only root file system (kart writes only to its
/// volumes, /tmp and its termination message).
pub fn default_container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Capabilities::default() }),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..SeccompProfile::default() }),
        ..SecurityContext::default()
    }
}

/// The operator's part of a container.
#[derive(Debug, Clone, Default)]
pub struct ContainerParts {
    /// Container name.
    pub name: String,
    /// The image unless overridden; `None` uses [`Settings::image`].
    pub image: Option<String>,
    /// Command (the entrypoint).
    pub command: Vec<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Named ports.
    pub ports: Vec<(&'static str, u16)>,
    /// HTTP readiness and (optional) liveness paths on the first port.
    pub probes: Option<(&'static str, Option<&'static str>)>,
    /// Environment set by the operator.
    pub env: Vec<EnvVar>,
    /// Mounts set by the operator.
    pub mounts: Vec<VolumeMount>,
}

/// A pod template running one container, with `overrides` applied.
pub fn template(
    settings: &Settings,
    overrides: &PodOverrides,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    parts: ContainerParts,
    volumes: Vec<Volume>,
    restart_policy: Option<&str>,
) -> PodTemplateSpec {
    // Kubernetes' default probe time-out, 1 s, is shorter than a busy node (a trainer's rank
    // saturating the cores beside a worker) may take to answer: a liveness probe would then kill
    // a healthy worker.
    let probe = |path: &str, port: u16, period: i32, timeout: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        ..Probe::default()
    };
    let first_port = parts.ports.first().map(|p| p.1);
    let (readiness, liveness) = match (parts.probes, first_port) {
        (Some((ready, live)), Some(port)) => {
            (Some(probe(ready, port, 5, 5)), live.map(|live| probe(live, port, 20, 10)))
        }
        _ => (None, None),
    };
    let mut env = parts.env;
    env.extend(overrides.env.iter().cloned());
    let mut mounts = parts.mounts;
    mounts.extend(overrides.volume_mounts.iter().cloned());
    let mut all_volumes = volumes;
    all_volumes.extend(overrides.volumes.iter().cloned());
    // kart's own containers (the kart image) run restricted, on a read-only root file system with
    // scratch space at /tmp (weights a worker downloads) unless a volume of the user's is there;
    // another image (an SGLang or vLLM server) keeps its own defaults.
    let kart_image = parts.image.is_none();
    if kart_image && !mounts.iter().any(|m| m.mount_path.trim_end_matches('/') == "/tmp") {
        all_volumes.push(Volume {
            name: SCRATCH_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
        mounts.push(mount(SCRATCH_VOLUME, "/tmp", false));
    }
    let security_context =
        overrides.security_context.clone().or_else(|| kart_image.then(default_container_security_context));
    let container = Container {
        name: parts.name,
        image: Some(overrides.image.clone().or(parts.image).unwrap_or_else(|| settings.image.clone())),
        image_pull_policy: overrides.image_pull_policy.clone(),
        command: Some(parts.command).filter(|c| !c.is_empty()),
        args: Some(parts.args).filter(|a| !a.is_empty()),
        ports: Some(
            parts
                .ports
                .iter()
                .map(|&(name, port)| ContainerPort {
                    name: Some(name.into()),
                    container_port: i32::from(port),
                    ..ContainerPort::default()
                })
                .collect::<Vec<_>>(),
        )
        .filter(|p| !p.is_empty()),
        env: Some(env).filter(|e| !e.is_empty()),
        volume_mounts: Some(mounts).filter(|m| !m.is_empty()),
        resources: overrides.resources.clone(),
        security_context,
        readiness_probe: readiness,
        liveness_probe: liveness,
        ..Container::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: Some(annotations).filter(|a| !a.is_empty()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(all_volumes).filter(|v| !v.is_empty()),
            restart_policy: restart_policy.map(str::to_string),
            image_pull_secrets: Some(overrides.image_pull_secrets.clone()).filter(|s| !s.is_empty()),
            node_selector: Some(overrides.node_selector.clone()).filter(|s| !s.is_empty()),
            tolerations: Some(overrides.tolerations.clone()).filter(|t| !t.is_empty()),
            affinity: overrides.affinity.clone(),
            service_account_name: overrides.service_account_name.clone(),
            priority_class_name: overrides.priority_class_name.clone(),
            security_context: Some(
                overrides.pod_security_context.clone().unwrap_or_else(default_pod_security_context),
            )
            .filter(|c| *c != PodSecurityContext::default()),
            ..PodSpec::default()
        }),
    }
}

/// The volume holding the rendered config, from ConfigMap `config_map`.
pub fn config_volume(config_map: &str) -> Volume {
    Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.into(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Its mount at [`CONFIG_DIR`].
pub fn config_mount() -> VolumeMount {
    mount("config", CONFIG_DIR, true)
}

/// A volume from PersistentVolumeClaim `claim`.
pub fn claim_volume(name: &str, claim: &str, read_only: bool) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: Some(read_only).filter(|r| *r),
        }),
        ..Volume::default()
    }
}

/// A mount of volume `name` at `path`.
pub fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only).filter(|r| *r),
        ..VolumeMount::default()
    }
}

/// An environment variable with a literal value.
pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..EnvVar::default() }
}

/// The variable `name` set from the Pod's field `path` (`status.podIP`, an annotation).
pub fn field_env(name: &str, path: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The variable `name` set from `key` of Secret `secret`; the container waits for the Secret.
pub fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    let selector = SecretKeySelector { name: secret.into(), key: key.into(), optional: Some(false) };
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource { secret_key_ref: Some(selector), ..EnvVarSource::default() }),
        ..EnvVar::default()
    }
}

/// The kart token of RolloutPool `pool` (its workers and the trainers using it), from its Secret.
pub fn token_env(pool: &str) -> EnvVar {
    secret_env(
        kart_core::wire::TOKEN_ENV,
        &super::rollout_pool::token_secret_name(pool),
        super::objects::TOKEN_KEY,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pod spec of one container `parts` with `overrides`.
    fn spec(overrides: &PodOverrides, parts: ContainerParts) -> PodSpec {
        let pod =
            template(&Settings::default(), overrides, BTreeMap::new(), BTreeMap::new(), parts, vec![], None);
        pod.spec.unwrap()
    }

    /// A kart container's parts (the kart image).
    fn kart() -> ContainerParts {
        ContainerParts { name: "main".into(), ..ContainerParts::default() }
    }

    fn pod_security(overrides: &PodOverrides) -> Option<PodSecurityContext> {
        spec(overrides, kart()).security_context
    }

    fn container_security(overrides: &PodOverrides) -> Option<SecurityContext> {
        spec(overrides, kart()).containers[0].security_context.clone()
    }

    #[test]
    fn kart_containers_are_restricted_with_scratch_space_unless_overridden() {
        let pod = spec(&PodOverrides::default(), kart());
        let scratch =
            pod.containers[0].volume_mounts.iter().flatten().find(|m| m.mount_path == "/tmp").unwrap();
        let volume = pod.volumes.iter().flatten().find(|v| v.name == scratch.name).unwrap();
        assert!(volume.empty_dir.is_some(), "{volume:?}");

        let server = ContainerParts {
            name: "vllm".into(),
            image: Some("vllm/vllm-openai".into()),
            ..ContainerParts::default()
        };
        let pod = spec(&PodOverrides::default(), server);
        assert_eq!(pod.containers[0].security_context, None, "another image keeps its own defaults");
        assert_eq!(pod.containers[0].volume_mounts, None);

        let default = container_security(&PodOverrides::default()).unwrap();
        assert_eq!(
            (default.run_as_non_root, default.read_only_root_filesystem, default.allow_privilege_escalation),
            (Some(true), Some(true), Some(false))
        );
        assert_eq!(default.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
        assert_eq!(default.seccomp_profile.unwrap().type_, "RuntimeDefault");

        let own: PodOverrides = serde_json::from_value(serde_json::json!({
            "securityContext": {"seccompProfile": {"type": "Unconfined"}}
        }))
        .unwrap();
        let own = container_security(&own).unwrap();
        assert_eq!(own.seccomp_profile.unwrap().type_, "Unconfined");
        assert_eq!(own.read_only_root_filesystem, None, "an override replaces the default whole");
    }

    #[test]
    fn pods_write_their_volumes_as_the_image_group_unless_overridden() {
        let default = pod_security(&PodOverrides::default()).unwrap();
        assert_eq!(default.fs_group, Some(65532));
        assert_eq!(default.fs_group_change_policy.as_deref(), Some("OnRootMismatch"));

        let own: PodOverrides = serde_json::from_value(serde_json::json!({
            "podSecurityContext": {"fsGroup": 1000, "runAsUser": 1000}
        }))
        .unwrap();
        let own = pod_security(&own).unwrap();
        assert_eq!(
            (own.fs_group, own.run_as_user, own.fs_group_change_policy),
            (Some(1000), Some(1000), None)
        );

        let cluster: PodOverrides =
            serde_json::from_value(serde_json::json!({"podSecurityContext": {}})).unwrap();
        assert_eq!(pod_security(&cluster), None, "`{{}}` leaves the pod security context to the cluster");
    }
}
