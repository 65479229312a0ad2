//! Settings of tool-integrated reasoning's Python executor (the sandbox itself is
//! `kart_tools::python`); plain data, so the operator can render them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A user and group to run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UserIds {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Where the boundary around model-written code is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Bubblewrap: each call in its own user, PID, mount, network, IPC, UTS and cgroup
    /// namespaces, with a read-only view of [`SandboxConfig::read_only_paths`], private tmpfs
    /// `/tmp` and `/dev/shm`, and a syscall filter. Needs unprivileged user namespaces.
    Bubblewrap,
    /// Resource limits, a process group and (for a root worker) another user only: not a
    /// boundary. For nodes that forbid user namespaces, where the worker pod itself runs in a
    /// sandboxed runtime (gVisor, Kata) and holds nothing the code may not see.
    None,
}

/// How the Python executor runs code; the defaults follow upstream's 20 s timeout. The module docs
/// of `kart_tools::python` say what each setting enforces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// The boundary around the code.
    pub isolation: Isolation,
    /// The bubblewrap executable, a path or a name looked up in the worker's `PATH`.
    pub bubblewrap: PathBuf,
    /// Host paths visible, read-only, inside the sandbox (`isolation: bubblewrap`); a symbolic
    /// link is recreated as one, a missing path is skipped; one under `/tmp` or `/dev/shm` is
    /// hidden by the sandbox's own. [`SandboxConfig::run_as`] must be able to reach each; the
    /// interpreter must be under one.
    pub read_only_paths: Vec<PathBuf>,
    /// Size of each of the private `/tmp` and `/dev/shm` (`isolation: bubblewrap`), in bytes.
    pub tmpfs_bytes: u64,
    /// The interpreter, a path or a name looked up in [`SandboxConfig::path`].
    pub interpreter: PathBuf,
    /// `PATH` of the child.
    pub path: String,
    /// Wall-clock limit of one call, in seconds.
    pub timeout_secs: u64,
    /// CPU time limit of one call (`RLIMIT_CPU`), in seconds.
    pub cpu_secs: u64,
    /// Address-space limit (`RLIMIT_AS`), in bytes.
    pub memory_bytes: u64,
    /// Process and thread limit (`RLIMIT_NPROC`), applied when the worker is root and the code
    /// runs as [`SandboxConfig::run_as`].
    pub max_processes: u64,
    /// Largest file the code may write (`RLIMIT_FSIZE`), in bytes.
    pub max_file_bytes: u64,
    /// Open file descriptor limit (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// Bytes kept of standard output, and of standard error, per call.
    pub max_output_bytes: usize,
    /// Calls running at once; more wait for a slot.
    pub max_concurrent: usize,
    /// The user the code runs as. A root worker switches to it; a worker that is not root runs
    /// the code as this user inside its user namespace (`isolation: bubblewrap`), which the kernel
    /// maps onto the worker's own user outside. Must not be root or the worker's user.
    pub run_as: UserIds,
    /// Where work directories are made (`isolation: none`); the system's temporary directory
    /// when unset.
    pub work_root: Option<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            isolation: Isolation::Bubblewrap,
            bubblewrap: "bwrap".into(),
            read_only_paths: ["/usr", "/bin", "/lib", "/lib64", "/sbin"].map(PathBuf::from).into(),
            tmpfs_bytes: 128 << 20,
            interpreter: "python3".into(),
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            timeout_secs: 20,
            cpu_secs: 20,
            memory_bytes: 1 << 30,
            max_processes: 64,
            max_file_bytes: 64 << 20,
            max_open_files: 256,
            max_output_bytes: 64 << 10,
            max_concurrent: std::thread::available_parallelism().map_or(4, usize::from),
            run_as: UserIds { uid: 65534, gid: 65534 },
            work_root: None,
        }
    }
}
