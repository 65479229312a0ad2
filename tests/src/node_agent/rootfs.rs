//! A Pod's filesystem on the host, and the one liberty the harness takes with what a container
//! sees.
//!
//! Every Pod gets a root folder in which each volume mount is a symlink to its volume's folder:
//! a ConfigMap's keys written as files into a folder of the Pod, a PersistentVolumeClaim's bound
//! volume (a `hostPath` volume of the node's provisioner, see [`super::volumes`]), a `hostPath` itself, an
//! `emptyDir` a folder of the Pod. The termination-message file (`/dev/termination-log` unless the
//! container names another) is a file there too. A container's absolute paths under a mount point
//! then become paths under the root: the harness prefixes them in the command, the args, the
//! environment values and the string values of the ConfigMap files that are JSON; nothing else
//! changes. A projected volume (the service account volume every Pod gets: a token bound to the
//! Pod, the cluster's CA, the namespace) is written as files too. Not simulated: `subPath`,
//! read-only mounts (they are writable), other volume sources.

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount, VolumeProjection,
};
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The default `terminationMessagePath`.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// A Pod's root folder and its container's mount points.
#[derive(Debug, Clone)]
pub struct RootFs {
    root: PathBuf,
    mount_points: Vec<String>,
    termination_log: String,
}

impl RootFs {
    /// Lays out the root of `pod` (running `container`) under `pod_dir`. Fails while a ConfigMap
    /// it mounts is missing or a claim it mounts is not bound.
    pub async fn mount(
        client: &kube::Client,
        pod: &Pod,
        container: &Container,
        pod_dir: &Path,
    ) -> anyhow::Result<RootFs> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mounts = container.volume_mounts.clone().unwrap_or_default();
        let termination_log = container.termination_message_path.clone().unwrap_or(TERMINATION_LOG.into());
        let mut mount_points: Vec<String> = mounts.iter().map(|m| m.mount_path.clone()).collect();
        mount_points.push(termination_log.clone());
        let rootfs = RootFs { root: pod_dir.join("root"), mount_points, termination_log };
        for mount in &mounts {
            if mount.sub_path.is_some() || mount.sub_path_expr.is_some() {
                bail!("volume mount {}: subPath is not simulated", mount.name);
            }
            let volume = pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .find(|v| v.name == mount.name)
                .ok_or_else(|| anyhow!("volume mount {}: no volume of that name", mount.name))?;
            let folder = if let Some(source) = &volume.config_map {
                let name = &source.name;
                let map = Api::<ConfigMap>::namespaced(client.clone(), &namespace)
                    .get_opt(name)
                    .await?
                    .ok_or_else(|| anyhow!("configmap \"{name}\" not found"))?;
                let folder = pod_dir.join("volumes").join(&volume.name);
                std::fs::create_dir_all(&folder)?;
                for (key, text) in map.data.iter().flatten() {
                    std::fs::write(folder.join(key), rootfs.map_file(key, text))?;
                }
                folder
            } else if let Some(source) = &volume.persistent_volume_claim {
                bound_folder(client, &namespace, &source.claim_name).await?
            } else if let Some(source) = &volume.host_path {
                PathBuf::from(&source.path)
            } else if volume.empty_dir.is_some() {
                let folder = pod_dir.join("volumes").join(&volume.name);
                std::fs::create_dir_all(&folder)?;
                folder
            } else if let Some(source) = &volume.projected {
                let folder = pod_dir.join("volumes").join(&volume.name);
                std::fs::create_dir_all(&folder)?;
                for source in source.sources.iter().flatten() {
                    project(client, pod, source, &folder).await?;
                }
                folder
            } else {
                bail!(
                    "volume {}: only configMap, persistentVolumeClaim, hostPath, emptyDir and projected are simulated",
                    volume.name
                );
            };
            let link = rootfs.host_path(&mount.mount_path);
            std::fs::create_dir_all(link.parent().context("a mount point below the root")?)?;
            // From an earlier attempt that stopped at a missing volume.
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&folder, &link)
                .with_context(|| format!("mounting {} at {}", folder.display(), link.display()))?;
        }
        let log = rootfs.termination_log();
        std::fs::create_dir_all(log.parent().context("a termination log below the root")?)?;
        std::fs::write(&log, "")?;
        Ok(rootfs)
    }

    /// The Pod's root folder (the container's working directory).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the container's termination message is written.
    pub fn termination_log(&self) -> PathBuf {
        self.host_path(&self.termination_log)
    }

    /// `path` (absolute, in the container) below the root.
    fn host_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// `value` with a container path under a mount point moved below the root; anything else as is.
    pub fn map(&self, value: &str) -> String {
        let under =
            |m: &String| value == m || value.strip_prefix(m.as_str()).is_some_and(|r| r.starts_with('/'));
        match self.mount_points.iter().any(under) {
            true => self.host_path(value).display().to_string(),
            false => value.to_string(),
        }
    }

    /// A ConfigMap file as the container reads it: JSON with its string values mapped.
    fn map_file(&self, key: &str, text: &str) -> String {
        match serde_json::from_str::<Value>(text) {
            Ok(mut json) if key.ends_with(".json") => {
                self.map_json(&mut json);
                serde_json::to_string_pretty(&json).expect("JSON serialises")
            }
            _ => text.to_string(),
        }
    }

    fn map_json(&self, value: &mut Value) {
        match value {
            Value::String(s) => *s = self.map(s),
            Value::Array(items) => items.iter_mut().for_each(|v| self.map_json(v)),
            Value::Object(fields) => fields.values_mut().for_each(|v| self.map_json(v)),
            _ => {}
        }
    }
}

/// The folder of the volume bound to claim `namespace/name`: a `hostPath` volume.
async fn bound_folder(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .ok_or_else(|| anyhow!("persistentvolumeclaim \"{name}\" not found"))?;
    let volume = claim
        .spec
        .and_then(|s| s.volume_name)
        .ok_or_else(|| anyhow!("persistentvolumeclaim \"{name}\" is not bound"))?;
    let bound = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .with_context(|| format!("persistentvolume \"{volume}\" of claim \"{name}\""))?;
    let path = bound
        .spec
        .and_then(|s| s.host_path)
        .map(|h| h.path)
        .ok_or_else(|| anyhow!("persistentvolume \"{volume}\": only hostPath volumes are simulated"))?;
    std::fs::create_dir_all(&path)?;
    Ok(PathBuf::from(path))
}

/// Writes one source of a projected volume into `folder`: a token of the Pod's ServiceAccount
/// bound to the Pod (the TokenRequest API, as a kubelet asks for it), a ConfigMap's keys, or the
/// Pod's name, namespace or uid (the service account volume every Pod gets holds all three kinds).
async fn project(
    client: &kube::Client,
    pod: &Pod,
    source: &VolumeProjection,
    folder: &Path,
) -> anyhow::Result<()> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(token) = &source.service_account_token {
        let account =
            pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or("default".into());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: token.audience.iter().cloned().collect(),
                expiration_seconds: token.expiration_seconds,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..TokenRequest::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token of serviceaccount {account:?}"))?;
        let token_text = issued.status.map(|s| s.token).unwrap_or_default();
        std::fs::write(folder.join(&token.path), token_text)?;
    } else if let Some(source) = &source.config_map {
        let map = Api::<ConfigMap>::namespaced(client.clone(), &namespace)
            .get_opt(&source.name)
            .await?
            .ok_or_else(|| anyhow!("configmap \"{}\" not found", source.name))?;
        let data = map.data.unwrap_or_default();
        let items: Vec<(String, String)> = match &source.items {
            Some(items) => items.iter().map(|i| (i.key.clone(), i.path.clone())).collect(),
            None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
        };
        for (key, path) in items {
            let text =
                data.get(&key).ok_or_else(|| anyhow!("configmap {:?} has no key {key:?}", source.name))?;
            std::fs::write(folder.join(path), text)?;
        }
    } else if let Some(source) = &source.downward_api {
        for item in source.items.iter().flatten() {
            let meta = &pod.metadata;
            let value = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.namespace") => meta.namespace.clone(),
                Some("metadata.name") => meta.name.clone(),
                Some("metadata.uid") => meta.uid.clone(),
                other => bail!("downwardAPI {other:?}: only the Pod's namespace, name and uid are simulated"),
            };
            std::fs::write(folder.join(&item.path), value.unwrap_or_default())?;
        }
    } else {
        bail!("projected volume: only serviceAccountToken, configMap and downwardAPI sources are simulated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_under_mount_points_move_below_the_root() {
        let fs = RootFs {
            root: "/tmp/pods/a/root".into(),
            mount_points: vec!["/etc/kart".into(), "/data".into(), TERMINATION_LOG.into()],
            termination_log: TERMINATION_LOG.into(),
        };
        assert_eq!(fs.map("/etc/kart/config.json"), "/tmp/pods/a/root/etc/kart/config.json");
        assert_eq!(fs.map("/data"), "/tmp/pods/a/root/data");
        assert_eq!(fs.map(TERMINATION_LOG), "/tmp/pods/a/root/dev/termination-log");
        assert_eq!(fs.map("/database"), "/database", "a prefix that is no mount point");
        assert_eq!(fs.map("http://wiki.ml.svc:8000/data"), "http://wiki.ml.svc:8000/data");
        let config = r#"{"model": "/data/m", "urls": ["/etc/kart/x", "8000"], "n": 1}"#;
        let mapped: Value = serde_json::from_str(&fs.map_file("config.json", config)).unwrap();
        assert_eq!(mapped["model"], "/tmp/pods/a/root/data/m");
        assert_eq!(mapped["urls"], serde_json::json!(["/tmp/pods/a/root/etc/kart/x", "8000"]));
        assert_eq!(fs.map_file("notes.txt", "\"/data/m\""), "\"/data/m\"", "only JSON files");
    }
}
