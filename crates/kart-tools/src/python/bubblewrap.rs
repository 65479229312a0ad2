//! The bubblewrap command line of a sandboxed call: new user, PID, mount, network, IPC, UTS and
//! cgroup namespaces; the code's user inside; a read-only view of the configured host paths and
//! nothing else of the host's filesystem; a `/proc` of its own where the kernel lets one be
//! mounted; private size-capped tmpfs `/tmp` and `/dev/shm`; no capabilities, no further user
//! namespaces, a new terminal session; the syscall filters of [`super::syscalls`]; death with its
//! parent. Bubblewrap runs as the PID namespace's init, so when the interpreter ends, or the
//! bubblewrap process is killed, the kernel kills every process of the call, double forks
//! included.

use super::{SandboxError, syscalls};
use kart_core::config::sandbox::SandboxConfig;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Inside the sandbox: the working directory, `HOME` and `TMPDIR`.
pub(super) const SCRATCH: &str = "/tmp";

/// The first descriptor number the filters are given to bubblewrap at.
pub(super) const FIRST_FILTER_FD: libc::c_int = 3;

/// What bubblewrap writes to the kernel's file systems, which a container runtime may forbid: a
/// `/proc` of the sandbox's own (refused where the runtime masks parts of its `/proc`), and the
/// sandbox's user-namespace limit set to 0 (`--disable-userns`, which writes
/// `/proc/sys/user/max_user_namespaces`: refused where `/proc/sys` is read-only, as in every
/// container). Without the limit, the syscall filter still refuses every new namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KernelMounts {
    /// A `/proc` of the sandbox's own.
    pub proc: bool,
    /// `--disable-userns`.
    pub userns_limit: bool,
}

impl KernelMounts {
    /// Everything, then what a runtime is likelier to allow, in the order they are tried.
    pub(super) const FALLBACKS: [KernelMounts; 4] = [
        KernelMounts { proc: true, userns_limit: true },
        KernelMounts { proc: false, userns_limit: true },
        KernelMounts { proc: true, userns_limit: false },
        KernelMounts { proc: false, userns_limit: false },
    ];
}

/// The fixed part of the command line and the filter programs.
#[derive(Debug)]
pub(super) struct Bubblewrap {
    program: PathBuf,
    args: Vec<OsString>,
    filters: Vec<Vec<u8>>,
}

impl Bubblewrap {
    /// The command line for `config` with `env` as the code's whole environment, with what the
    /// machine allows of `mounts`.
    pub(super) fn new(
        config: &SandboxConfig,
        env: &[(&'static str, OsString)],
        mounts: KernelMounts,
    ) -> Result<Self, SandboxError> {
        let filters = syscalls::programs().map_err(|error| SandboxError::Config {
            field: "isolation",
            reason: format!("syscall filter: {error}"),
        })?;
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
        let (uid, gid) = (config.run_as.uid.to_string(), config.run_as.gid.to_string());
        push(&["--unshare-all", "--unshare-user", "--uid", &uid, "--gid", &gid]);
        push(&["--hostname", "sandbox", "--cap-drop", "ALL"]);
        if mounts.userns_limit {
            push(&["--disable-userns"]);
        }
        push(&["--die-with-parent", "--new-session"]);
        for path in &config.read_only_paths {
            view(&mut args, path);
        }
        let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
        if mounts.proc {
            push(&["--proc", "/proc"]);
        }
        let size = config.tmpfs_bytes.to_string();
        push(&["--dev", "/dev"]);
        for dir in [SCRATCH, "/dev/shm"] {
            push(&["--perms", "1777", "--size", &size, "--tmpfs", dir]);
        }
        push(&["--chdir", SCRATCH, "--clearenv"]);
        for (name, value) in env {
            args.extend([OsString::from("--setenv"), OsString::from(name), value.clone()]);
        }
        for fd in (FIRST_FILTER_FD..).take(filters.len()) {
            args.extend([OsString::from("--add-seccomp-fd"), fd.to_string().into()]);
        }
        args.push("--".into());
        Ok(Bubblewrap { program: resolve(&config.bubblewrap)?, args, filters })
    }

    /// A command running `interpreter args` in the sandbox, and the descriptors that must reach
    /// the child as [`FIRST_FILTER_FD`] and after (pipes holding the filters, read once each).
    pub(super) fn command(
        &self,
        interpreter: &Path,
        args: &[&str],
    ) -> Result<(std::process::Command, Vec<OwnedFd>), SandboxError> {
        let mut command = std::process::Command::new(&self.program);
        command.args(&self.args).arg(interpreter).args(args);
        let fds = self.filters.iter().map(|program| filled_pipe(program)).collect::<Result<_, _>>()?;
        Ok((command, fds))
    }

    /// The bubblewrap executable.
    pub(super) fn program(&self) -> &Path {
        &self.program
    }
}

/// `program` as an absolute path, looked up in the worker's `PATH` when it is a bare name
/// (bubblewrap starts with an empty environment, so without a `PATH` of its own).
fn resolve(program: &Path) -> Result<PathBuf, SandboxError> {
    if program.components().count() > 1 {
        return Ok(program.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| SandboxError::Config {
            field: "bubblewrap",
            reason: format!(
                "{} is not on PATH: install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap)",
                program.display()
            ),
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// `path` as it is on the host, read-only: a symbolic link recreated, a directory or file bound,
/// nothing for a missing path.
fn view(args: &mut Vec<OsString>, path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            if let Ok(target) = std::fs::read_link(path) {
                args.extend([OsString::from("--symlink"), target.into(), path.into()]);
            }
        }
        Ok(_) => args.extend([OsString::from("--ro-bind"), path.into(), path.into()]),
        Err(_) => {}
    }
}

/// A pipe holding `bytes`, its write end closed: the read end, close-on-exec.
fn filled_pipe(bytes: &[u8]) -> Result<OwnedFd, SandboxError> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A filter is a few kilobytes, well under a pipe's buffer, so this does not block.
    std::fs::File::from(write).write_all(bytes)?;
    Ok(read)
}
