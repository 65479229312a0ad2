//! The provisioner of the node's StorageClass `kart-local` (`scripts/control-plane.sh` makes it the
//! default), following the protocol of Kubernetes' external provisioners, as rancher's
//! local-path-provisioner does for a single node:
//!
//! - The PersistentVolume controller marks a claim of the class with
//!   `volume.kubernetes.io/storage-provisioner: kart.dev/node-local`.
//! - The provisioner makes a folder of the node and a `hostPath` PersistentVolume `pvc-<claim uid>`
//!   for it, of the claim's size, access modes and class, pre-bound to the claim; the
//!   PersistentVolume controller binds the two.
//! - A volume whose claim was deleted is `Released`; with the reclaim policy `Delete` the
//!   provisioner removes its folder and deletes it.

use anyhow::Context;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::path::PathBuf;

/// The provisioner's name, as the StorageClass names it.
pub const PROVISIONER: &str = "kart.dev/node-local";
/// The annotation by which the PersistentVolume controller hands a claim to its provisioner.
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The annotation naming the provisioner of a volume.
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Provisions and reclaims the node's volumes, as the identity of `client`.
pub struct Provisioner {
    client: kube::Client,
    /// The node's folder of volumes.
    dir: PathBuf,
}

impl Provisioner {
    /// A provisioner keeping its volumes under `dir`.
    pub fn new(client: kube::Client, dir: PathBuf) -> Provisioner {
        Provisioner { client, dir }
    }

    /// One pass: a volume for each claim handed to this provisioner that has none, and the
    /// released volumes reclaimed.
    pub async fn sync(&self) -> anyhow::Result<()> {
        let claims =
            Api::<PersistentVolumeClaim>::all(self.client.clone()).list(&ListParams::default()).await?;
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let existing = volumes.list(&ListParams::default()).await?.items;
        for claim in &claims.items {
            let ours = claim.annotations().get(STORAGE_PROVISIONER).is_some_and(|p| p == PROVISIONER);
            let unbound = claim.spec.as_ref().is_some_and(|s| s.volume_name.is_none());
            let name = format!("pvc-{}", claim.uid().unwrap_or_default());
            if ours
                && unbound
                && claim.metadata.deletion_timestamp.is_none()
                && !existing.iter().any(|v| v.name_any() == name)
            {
                volumes.create(&PostParams::default(), &self.volume(claim, &name)?).await?;
            }
        }
        for volume in &existing {
            let ours = volume.annotations().get(PROVISIONED_BY).is_some_and(|p| p == PROVISIONER);
            let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
            let delete = volume.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
                == Some("Delete");
            if ours && released && delete {
                if let Some(path) = volume.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| &h.path) {
                    std::fs::remove_dir_all(path)
                        .or_else(ignore_missing)
                        .with_context(|| format!("removing {path}"))?;
                }
                match volumes.delete(&volume.name_any(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// The volume `name` for `claim`, its folder made.
    fn volume(&self, claim: &PersistentVolumeClaim, name: &str) -> anyhow::Result<PersistentVolume> {
        let spec = claim.spec.clone().unwrap_or_default();
        let size = spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage"));
        let size =
            size.with_context(|| format!("claim {}: no spec.resources.requests.storage", claim.name_any()))?;
        let folder = self.dir.join(name);
        std::fs::create_dir_all(&folder).with_context(|| format!("making {}", folder.display()))?;
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
                "storageClassName": spec.storage_class_name,
                "volumeMode": spec.volume_mode.unwrap_or_else(|| "Filesystem".into()),
                "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": folder, "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": claim.namespace(),
                             "name": claim.name_any(), "uid": claim.uid()},
            },
        }))?)
    }
}

/// Success for a folder already gone.
fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    match e.kind() {
        std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(e),
    }
}
