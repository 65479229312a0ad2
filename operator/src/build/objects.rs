//! The plain Kubernetes objects children are made of.

use super::CONFIG_FILE;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodTemplateSpec, Secret, Service,
    ServicePort, ServiceSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The key of a token Secret.
pub const TOKEN_KEY: &str = "token";

/// A Secret holding a fresh random token (32 bytes, hex) under [`TOKEN_KEY`]. The controller
/// creates it once and never rewrites it, so each reconcile's fresh value goes unused.
pub fn token_secret(meta: ObjectMeta) -> Secret {
    let token: String = rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect();
    Secret {
        metadata: meta,
        data: Some(BTreeMap::from([(TOKEN_KEY.to_string(), ByteString(token.into_bytes()))])),
        ..Secret::default()
    }
}

/// A ConfigMap holding `text` as [`CONFIG_FILE`].
pub fn config_map(meta: ObjectMeta, text: String) -> ConfigMap {
    ConfigMap {
        metadata: meta,
        data: Some(BTreeMap::from([(CONFIG_FILE.to_string(), text)])),
        ..ConfigMap::default()
    }
}

/// A Service over the pods `selector` matches; headless (a DNS record per Pod, no virtual IP)
/// when `headless`.
pub fn service(
    meta: ObjectMeta,
    selector: BTreeMap<String, String>,
    ports: &[(&str, u16)],
    headless: bool,
) -> Service {
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(
                ports
                    .iter()
                    .map(|&(name, port)| ServicePort {
                        name: Some(name.into()),
                        port: i32::from(port),
                        target_port: Some(IntOrString::Int(i32::from(port))),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            cluster_ip: headless.then(|| "None".to_string()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// A PersistentVolumeClaim of `size`.
pub fn claim(
    meta: ObjectMeta,
    size: &str,
    storage_class: Option<&String>,
    access_modes: &[String],
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes.to_vec()),
            storage_class_name: storage_class.cloned(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size.to_string()))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// A Deployment of `replicas` pods from `template`.
pub fn deployment(
    meta: ObjectMeta,
    replicas: i32,
    selector: BTreeMap<String, String>,
    template: PodTemplateSpec,
) -> Deployment {
    Deployment {
        metadata: meta,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector { match_labels: Some(selector), ..LabelSelector::default() },
            template,
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}
