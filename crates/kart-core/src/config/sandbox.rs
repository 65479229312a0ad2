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

/// How the Python executor runs code; the defaults follow upstream's 20 s timeout. The module docs
/// say what each limit enforces; `PythonSandbox::protections` says which of the conditional
/// ones (user, processes, network) hold on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
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
    /// Process and thread limit (`RLIMIT_NPROC`); not enforced for a root child.
    pub max_processes: u64,
    /// Largest file the code may write (`RLIMIT_FSIZE`), in bytes.
    pub max_file_bytes: u64,
    /// Open file descriptor limit (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// Bytes kept of standard output, and of standard error, per call.
    pub max_output_bytes: usize,
    /// Calls running at once; more wait for a slot.
    pub max_concurrent: usize,
    /// Whether to cut the network off with user and network namespaces where the kernel allows.
    pub isolate_network: bool,
    /// Who runs the code when the worker is root (`None` keeps root).
    pub run_as_when_root: Option<UserIds>,
    /// Where work directories are made; the system's temporary directory when unset.
    pub work_root: Option<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
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
            isolate_network: true,
            run_as_when_root: Some(UserIds { uid: 65534, gid: 65534 }),
            work_root: None,
        }
    }
}
