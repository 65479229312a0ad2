//! kart's node agent (the `kart-node` binary): one Node of a real control plane
//! (`scripts/control-plane.sh`) that runs the Pods the scheduler binds to it as local processes of
//! the real `kart` binary.
//!
//! - [`registration`]: the Node, its capacity (`nvidia.com/gpu` included) and its heartbeat.
//! - [`kubelet`]: each bound Pod's container run as a process, its probes, restarts, exit codes and
//!   termination message reported in the Pod's status, a deleted Pod's process stopped.
//! - [`rootfs`]: the Pod's volumes as folders.
//! - [`volumes`]: the provisioner of the node's StorageClass, so claims bind.
//! - [`network`]: the pod network on loopback: an address per Pod and a proxy reaching Services.
//!
//! The Deployments, ReplicaSets, Jobs, scheduling and garbage collection are the real
//! controllers'; the agent's liberties are the pod network's environment variables and the
//! mapping of container paths below each Pod's root folder, both documented in their modules.

pub mod kubelet;
pub mod network;
pub mod registration;
pub mod rootfs;
pub mod volumes;
