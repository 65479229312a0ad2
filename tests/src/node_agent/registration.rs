//! The Node a kubelet of the real control plane stands for: registered with its capacity (CPU,
//! memory, Pods and `nvidia.com/gpu`, so GPU Pods schedule) and kept alive as a kubelet keeps it,
//! by renewing its Lease in `kube-node-lease` and reporting the `Ready` condition.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// How long a Lease renewal holds (the kubelet's default is 40 s; renewals come every 10 s).
const LEASE_SECONDS: i32 = 40;

/// Creates or updates Node `name` and reports it Ready.
pub async fn register(client: &kube::Client, name: &str) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
    });
    let apply = PatchParams::apply("kart-node").force();
    nodes.patch(name, &apply, &Patch::Apply(&node)).await?;
    heartbeat(client, name).await
}

/// Renews the Node's Lease and reports its status: capacity, address and the `Ready` condition.
pub async fn heartbeat(client: &kube::Client, name: &str) -> kube::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": MicroTime(now)},
    });
    leases.patch(name, &PatchParams::apply("kart-node").force(), &Patch::Apply(&lease)).await?;
    let resources = json!({"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8",
                           "ephemeral-storage": "100Gi"});
    let status = json!({"status": {
        "capacity": resources, "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kart's node agent is posting ready status",
                        "lastHeartbeatTime": now.to_string(), "lastTransitionTime": now.to_string()}],
        "nodeInfo": {"kubeletVersion": "v1.37.2", "operatingSystem": "linux", "architecture": "amd64",
                     "containerRuntimeVersion": "kart://local-processes", "machineID": "", "systemUUID": "",
                     "bootID": "", "kernelVersion": "", "osImage": "", "kubeProxyVersion": ""},
    }});
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.map(drop)
}
