//! The TIR Python executor: model-written code run in a sandbox, a fresh one per call.
//!
//! Upstream (`QwenPythonTool`, Qwen-Agent's `PythonExecutor`) runs `exec(code, {})` in a pebble
//! worker process with standard output captured and returns `(stdout, "Done")`, or `("", last line
//! of the traceback)` when the code raises, or `("", "Timeout Error")` after 20 s; code containing
//! `input(` or `os.system(` is refused with a bare `RuntimeError`. kart keeps those results
//! exactly — including that `__name__` is `builtins`, so an `if __name__ == "__main__":` block does
//! not run — and adds what upstream lacks, a sandbox whose boundary is the kernel's. Every call
//! gets a fresh interpreter (`python3 -I`, isolated from `PYTHON*` variables and user
//! site-packages).
//!
//! With [`Isolation::Bubblewrap`] (the default) each call runs under
//! [bubblewrap](https://github.com/containers/bubblewrap), the namespace sandbox Flatpak is built
//! on, chosen over nsjail because it is small, setuid-free where user namespaces are allowed,
//! packaged by every distribution, and does exactly this job; it is started once by
//! [`PythonSandbox::new`] to fail at start-up, not at the first call, where the node forbids it:
//! - namespaces: user, PID, mount, network (no interface but a loopback of its own), IPC, UTS
//!   and cgroup of its own; no capabilities; no further user namespaces;
//! - user: [`SandboxConfig::run_as`], distinct from the worker's; a root worker switches to it
//!   before starting bubblewrap, so the code is that user on the host too, while a worker that is
//!   not root can only map its own user, so outside the user namespace the code has the worker's
//!   uid, with no process of the worker in its PID namespace to signal or trace and none of its
//!   files in its view;
//! - files: a read-only view of [`SandboxConfig::read_only_paths`] (the system's programs and
//!   libraries, not `/etc`, `/root`, `/home`, the model or the secrets), a `/proc` of its own
//!   (none where the container runtime forbids mounting one, [`Protections::proc`]), a minimal
//!   `/dev`, and private tmpfs `/tmp` (the working directory, `HOME` and `TMPDIR`) and `/dev/shm`
//!   of [`SandboxConfig::tmpfs_bytes`] each, gone with the call;
//! - processes: bubblewrap is the PID namespace's init, so when the interpreter ends, times out
//!   or is cancelled every process of the call dies with it, `setsid` double forks included;
//! - system calls: the deny-list of `syscalls` (namespaces, mounts, tracing, io_uring, BPF, perf
//!   events, keyrings, modules).
//!
//! Always enforced, with or without bubblewrap:
//! - no secrets: the code's environment is only `PATH`, `LANG`, `HOME`, `TMPDIR` and one
//!   BLAS/OpenMP thread, and bubblewrap itself starts with an empty environment;
//! - CPU time: `RLIMIT_CPU` ([`SandboxConfig::cpu_secs`]), the kernel's `SIGXCPU` reading as
//!   `Timeout Error`;
//! - memory: `RLIMIT_AS` ([`SandboxConfig::memory_bytes`]), allocations failing with `MemoryError`;
//! - file size: `RLIMIT_FSIZE` ([`SandboxConfig::max_file_bytes`]), writes failing with `File too
//!   large`; open files: `RLIMIT_NOFILE` ([`SandboxConfig::max_open_files`]); no core dumps;
//! - processes: `RLIMIT_NPROC` ([`SandboxConfig::max_processes`]) when a root worker switches
//!   user ([`Protections::process_limit`]);
//! - wall clock: [`SandboxConfig::timeout_secs`], then `SIGKILL` to the call's process group;
//! - output: standard output and error kept up to [`SandboxConfig::max_output_bytes`] each (head
//!   and tail);
//! - privileges: `PR_SET_NO_NEW_PRIVS`, and inherited descriptors closed on exec.
//!
//! [`Isolation::None`] keeps only those, with a fresh `0700` work directory under
//! [`SandboxConfig::work_root`]; it is not a boundary (the code sees the host's files and network,
//! and a process that leaves the group with `setsid` outlives the call), and is meant for nodes
//! that forbid user namespaces where the worker pod runs in a sandboxed runtime of its own.

mod bubblewrap;
mod capture;
mod limits;
mod syscalls;
#[cfg(test)]
mod tests;
mod work_dir;

use bubblewrap::{Bubblewrap, KernelMounts};
use capture::Capture;
use kart_core::agent::tir::ToolOutcome;
use limits::{Limits, ProcessGroup};
use serde::Serialize;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use work_dir::WorkDir;

pub use kart_core::config::sandbox::{Isolation, SandboxConfig, UserIds};

/// The program the interpreter runs: it reads the model's code from standard input, applies
/// upstream's checks, executes it, and writes the report on standard error after
/// [`REPORT_MARKER`] (processes the code forked may reach the end of this program too; only the
/// interpreter it started in reports). `os._exit` skips interpreter shutdown, so threads the code
/// left running cannot delay the result.
const RUNNER: &str = r#"import os, re, sys, traceback
runner = os.getpid()
code = sys.stdin.read()
try:
    if re.search(r"(\s|^)?input\(", code) or re.search(r"(\s|^)?os.system\(", code):
        raise RuntimeError()
    exec(code, {})
    report = "Done"
except SystemExit as error:
    report = "Done" if error.code in (None, 0) else traceback.format_exc().split("\n")[-2]
except BaseException:
    report = traceback.format_exc().split("\n")[-2]
for stream in (sys.stdout, sys.__stdout__):
    try:
        stream.flush()
    except BaseException:
        pass
if os.getpid() == runner:
    sys.__stderr__.write("\n\x1ekart-python-report:%s\n" % report)
    sys.__stderr__.flush()
os._exit(0)
"#;

/// Precedes the report on standard error.
const REPORT_MARKER: &str = "\x1ekart-python-report:";

/// The report of a call that ran out of time (upstream's wording).
pub const TIMEOUT_REPORT: &str = "Timeout Error";

/// What holds on this machine, decided once by [`PythonSandbox::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Protections {
    /// The boundary around the code.
    pub isolation: Isolation,
    /// The user the code runs as, as it sees itself.
    pub uid: u32,
    /// The code's user on the host, outside its user namespace.
    pub host_uid: u32,
    /// Whether the sandbox has a `/proc` of its own (bubblewrap; without one it has none).
    pub proc: bool,
    /// Whether bubblewrap also set the sandbox's user-namespace limit to 0 (not where `/proc/sys`
    /// is read-only, as in containers; the syscall filter refuses new namespaces either way).
    pub userns_limit: bool,
    /// Whether `RLIMIT_NPROC` binds.
    pub process_limit: bool,
}

impl std::fmt::Display for Protections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.isolation {
            Isolation::Bubblewrap => write!(
                f,
                "bubblewrap: user, PID, mount, network, IPC and UTS namespaces, read-only view, private /tmp \
                 and /dev/shm, syscall filter, {} /proc, {}",
                if self.proc { "own" } else { "no" },
                if self.userns_limit { "user-namespace limit 0" } else { "no user-namespace limit" }
            )?,
            Isolation::None => f.write_str("no isolation (isolation: none)")?,
        }
        write!(
            f,
            "; uid {} (host uid {}); CPU/memory/file-size/open-file limits, wall-clock timeout, output cap, \
             no new privileges; process limit {}",
            self.uid,
            self.host_uid,
            if self.process_limit { "enforced" } else { "not enforced" }
        )
    }
}

/// Failures of the sandbox itself (not of the code, which are reports).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A configuration value that cannot work.
    #[error("python sandbox config `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// The start-up check could not run code.
    #[error(
        "python sandbox: {program} could not run `{interpreter}`: {reason}. With isolation: bubblewrap, the \
         node must allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, and a seccomp \
         profile allowing clone/unshare with CLONE_NEWUSER) and the interpreter must be under one of \
         read_only_paths; where the node forbids user namespaces, run the worker in a sandboxed runtime \
         class and set python.isolation: none"
    )]
    Unavailable {
        /// What was started: bubblewrap, or the interpreter itself.
        program: PathBuf,
        /// The configured interpreter.
        interpreter: PathBuf,
        /// What it said.
        reason: String,
    },
    /// The work directory could not be made ready.
    #[error("python sandbox work directory {path}: {source}")]
    WorkDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A process could not be started.
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program: bubblewrap, or the interpreter.
        program: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Talking to the child failed.
    #[error("python sandbox I/O: {0}")]
    Io(#[from] io::Error),
}

impl From<SandboxError> for ToolOutcome {
    /// A sandbox failure is shown to the model as a failed tool call.
    fn from(error: SandboxError) -> Self {
        ToolOutcome::Failed { message: error.to_string() }
    }
}

/// Runs Python code in sandboxed child processes, at most [`SandboxConfig::max_concurrent`] at once.
#[derive(Debug)]
pub struct PythonSandbox {
    config: SandboxConfig,
    launch: Launch,
    limits: Limits,
    protections: Protections,
    slots: Semaphore,
}

/// How a call is started.
#[derive(Debug)]
enum Launch {
    Bubblewrap(Bubblewrap),
    Direct { work_root: PathBuf },
}

/// A call's command, ready to spawn, with what must live until it has.
struct Prepared {
    command: std::process::Command,
    program: PathBuf,
    /// Descriptors handed to the child.
    _fds: Vec<OwnedFd>,
    work_dir: Option<WorkDir>,
}

impl PythonSandbox {
    /// Checks `config` and runs an empty program the way every call will run, so that a node
    /// without user namespaces or an interpreter outside the view fails here.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        let positive = |field: &'static str, value: u64| {
            if value == 0 {
                Err(SandboxError::Config { field, reason: "must be positive".into() })
            } else {
                Ok(())
            }
        };
        positive("timeout_secs", config.timeout_secs)?;
        positive("cpu_secs", config.cpu_secs)?;
        positive("memory_bytes", config.memory_bytes)?;
        positive("max_processes", config.max_processes)?;
        positive("max_open_files", config.max_open_files)?;
        positive("max_output_bytes", config.max_output_bytes as u64)?;
        positive("max_concurrent", config.max_concurrent as u64)?;
        positive("tmpfs_bytes", config.tmpfs_bytes)?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let run_as = config.run_as;
        if run_as.uid == 0 || run_as.uid == euid {
            let reason = format!("uid {} is root or the worker's own user", run_as.uid);
            return Err(SandboxError::Config { field: "run_as", reason });
        }
        let switch_to = (euid == 0).then_some(run_as);
        let limits = Limits {
            switch_to,
            cpu_secs: config.cpu_secs,
            memory_bytes: config.memory_bytes,
            max_processes: switch_to.map(|_| config.max_processes),
            max_file_bytes: config.max_file_bytes,
            max_open_files: config.max_open_files,
        };
        let host_uid = switch_to.map_or(euid, |ids| ids.uid);
        let protections = Protections {
            isolation: config.isolation,
            uid: if config.isolation == Isolation::Bubblewrap { run_as.uid } else { host_uid },
            host_uid,
            proc: false,
            userns_limit: false,
            process_limit: switch_to.is_some(),
        };
        let bubblewrap = config.isolation == Isolation::Bubblewrap;
        let [all, fallbacks @ ..] = KernelMounts::FALLBACKS;
        let mut sandbox = PythonSandbox {
            launch: launch(&config, all)?,
            slots: Semaphore::new(config.max_concurrent),
            config,
            limits,
            protections: Protections { proc: bubblewrap, userns_limit: bubblewrap, ..protections },
        };
        let Err(first) = sandbox.probe() else { return Ok(sandbox) };
        if !bubblewrap {
            return Err(first);
        }
        // A container runtime may forbid what bubblewrap writes to /proc: the first command line
        // it runs wins.
        for mounts in fallbacks {
            sandbox.launch = launch(&sandbox.config, mounts)?;
            if sandbox.probe().is_ok() {
                sandbox.protections.proc = mounts.proc;
                sandbox.protections.userns_limit = mounts.userns_limit;
                tracing::warn!(
                    protections = %sandbox.protections,
                    "python sandbox: the container runtime forbids part of what bubblewrap writes to /proc (the first try: {first}); calls run without it"
                );
                return Ok(sandbox);
            }
        }
        Err(first)
    }

    /// What is enforced on this machine.
    pub fn protections(&self) -> Protections {
        self.protections
    }

    /// Runs `code` and returns upstream's result: `Python { stdout, report }` with `report` `Done`,
    /// the last line of the traceback (standard output then dropped, as upstream does), or
    /// [`TIMEOUT_REPORT`]. Waits for a free slot first; dropping the future kills the call.
    pub async fn run(&self, code: &str) -> Result<ToolOutcome, SandboxError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let Prepared { command, program, _fds, work_dir: _work_dir } = self.prepare()?;
        let mut command = tokio::process::Command::from(command);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| SandboxError::Spawn { program, source })?;
        drop(_fds);
        let pid = child.id().expect("a child that was just spawned has an id");
        let group = ProcessGroup(pid as libc::pid_t);
        let (mut stdin, stdout, stderr) = (
            child.stdin.take().expect("stdin is piped"),
            child.stdout.take().expect("stdout is piped"),
            child.stderr.take().expect("stderr is piped"),
        );

        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_secs);
        let (mut out, mut err) =
            (Capture::new(self.config.max_output_bytes), Capture::new(self.config.max_output_bytes));
        let mut exit = None;
        let mut read_result = Ok(());
        let finished = tokio::time::timeout_at(deadline, async {
            let feed = async {
                // The code may exit without reading its input; a broken pipe is its business.
                let _ = stdin.write_all(code.as_bytes()).await;
                drop(stdin);
            };
            let wait = async {
                exit = Some(child.wait().await);
                // Whatever the code left behind in its group goes with it.
                group.kill();
            };
            let (_, out_result, err_result, ()) =
                tokio::join!(feed, out.read_from(stdout), err.read_from(stderr), wait);
            read_result = out_result.and(err_result);
        })
        .await
        .is_ok();
        if !finished {
            // Out of time: the sandbox, or what it left in its group holding the pipes.
            group.kill();
        }
        let status = match exit {
            Some(status) => status?,
            // Timed out before the sandbox ended: reap it after the kill.
            None => {
                child.wait().await?;
                return Ok(python_outcome("", TIMEOUT_REPORT));
            }
        };
        if finished {
            read_result?;
        }
        Ok(outcome(status, &out.into_string(), &err.into_string()))
    }

    /// The command of one call: bubblewrap around the interpreter, or the interpreter in a fresh
    /// work directory; the limits applied between fork and exec either way.
    fn prepare(&self) -> Result<Prepared, SandboxError> {
        let args = ["-I", "-c", RUNNER];
        let (mut command, program, fds, work_dir) = match &self.launch {
            Launch::Bubblewrap(bubblewrap) => {
                let (mut command, fds) = bubblewrap.command(&self.config.interpreter, &args)?;
                // Bubblewrap, the sandbox's init, holds no variable of the worker's either.
                command.env_clear();
                (command, bubblewrap.program().to_owned(), fds, None)
            }
            Launch::Direct { work_root } => {
                let work_dir = WorkDir::create(work_root, self.limits.switch_to)?;
                let mut command = std::process::Command::new(&self.config.interpreter);
                command
                    .args(args)
                    .env_clear()
                    .envs(child_env(&self.config, work_dir.path()))
                    .current_dir(work_dir.path());
                (command, self.config.interpreter.clone(), Vec::new(), Some(work_dir))
            }
        };
        let limits = self.limits;
        let inherit: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        // SAFETY: `Limits::apply` only makes system calls, which are safe between fork and exec.
        unsafe { command.pre_exec(move || limits.apply(&inherit)) };
        Ok(Prepared { command, program, _fds: fds, work_dir })
    }

    /// Runs an empty program as a call would; an error with what the sandbox said unless it
    /// reports `Done`.
    fn probe(&self) -> Result<(), SandboxError> {
        let Prepared { mut command, program, _fds, work_dir: _work_dir } = self.prepare()?;
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|source| SandboxError::Spawn { program: program.clone(), source })?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() && stderr.contains(&format!("{REPORT_MARKER}Done")) {
            return Ok(());
        }
        let said = stderr.trim();
        let reason =
            if said.is_empty() { format!("it ended with {}", output.status) } else { said.to_owned() };
        Err(SandboxError::Unavailable { program, interpreter: self.config.interpreter.clone(), reason })
    }
}

/// How calls of `config` start; with bubblewrap, with or without a `/proc` of their own.
fn launch(config: &SandboxConfig, mounts: KernelMounts) -> Result<Launch, SandboxError> {
    Ok(match config.isolation {
        Isolation::Bubblewrap => {
            let env = child_env(config, bubblewrap::SCRATCH);
            Launch::Bubblewrap(Bubblewrap::new(config, &env, mounts)?)
        }
        Isolation::None => {
            Launch::Direct { work_root: config.work_root.clone().unwrap_or_else(std::env::temp_dir) }
        }
    })
}

/// The code's whole environment, with `home` as its home and temporary directory: no variable of
/// the worker's.
fn child_env(config: &SandboxConfig, home: impl AsRef<Path>) -> Vec<(&'static str, OsString)> {
    let home = home.as_ref();
    let mut env = vec![
        ("PATH", OsString::from(&config.path)),
        ("LANG", "C.UTF-8".into()),
        ("HOME", home.into()),
        ("TMPDIR", home.into()),
    ];
    // One BLAS/OpenMP thread: a thread per core would hit the process and memory limits.
    for name in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"] {
        env.push((name, "1".into()));
    }
    env
}

fn python_outcome(stdout: &str, report: &str) -> ToolOutcome {
    ToolOutcome::Python { stdout: stdout.to_owned(), report: report.to_owned() }
}

/// The result of a call that ended by itself: the runner's report, else one made from how the
/// sandbox ended (`SIGXCPU` is the CPU limit, hence a timeout; bubblewrap passes a signal on as
/// exit status 128 + its number).
fn outcome(status: ExitStatus, stdout: &str, stderr: &str) -> ToolOutcome {
    let out_of_cpu = status.signal() == Some(libc::SIGXCPU) || status.code() == Some(128 + libc::SIGXCPU);
    let report = match stderr.rfind(REPORT_MARKER) {
        Some(at) => {
            let rest = &stderr[at + REPORT_MARKER.len()..];
            rest.split('\n').next().unwrap_or_default().to_owned()
        }
        None if status.success() => "Done".to_owned(),
        None if out_of_cpu => TIMEOUT_REPORT.to_owned(),
        None => match stderr.lines().rev().find(|line| !line.trim().is_empty()) {
            Some(line) => line.trim().to_owned(),
            None => format!("Process ended with {status}"),
        },
    };
    if report == "Done" { python_outcome(stdout, &report) } else { python_outcome("", &report) }
}
