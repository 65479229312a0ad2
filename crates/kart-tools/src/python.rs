//! The TIR Python executor: model-written code run in a sandboxed child process.
//!
//! Upstream (`QwenPythonTool`, Qwen-Agent's `PythonExecutor`) runs `exec(code, {})` in a pebble
//! worker process with standard output captured and returns `(stdout, "Done")`, or `("", last line
//! of the traceback)` when the code raises, or `("", "Timeout Error")` after 20 s; code containing
//! `input(` or `os.system(` is refused with a bare `RuntimeError`. kart keeps those results
//! exactly — including that `__name__` is `builtins`, so an `if __name__ == "__main__":` block does
//! not run — and adds what upstream lacks, a sandbox. Every call gets a fresh interpreter
//! (`python3 -I`, isolated from `PYTHON*` variables and user site-packages).
//!
//! Always enforced:
//! - no secrets: `env_clear`, then only `PATH`, `LANG`, `HOME` and `TMPDIR` (both the work
//!   directory) and one BLAS/OpenMP thread;
//! - scratch space: a fresh `0700` directory under [`SandboxConfig::work_root`] as the working
//!   directory, removed afterwards;
//! - CPU time: `RLIMIT_CPU` ([`SandboxConfig::cpu_secs`]), the kernel's `SIGXCPU` reading as
//!   `Timeout Error`;
//! - memory: `RLIMIT_AS` ([`SandboxConfig::memory_bytes`]), allocations failing with `MemoryError`;
//! - file size: `RLIMIT_FSIZE` ([`SandboxConfig::max_file_bytes`]), writes failing with `File too
//!   large`; open files: `RLIMIT_NOFILE` ([`SandboxConfig::max_open_files`]); no core dumps;
//! - wall clock: [`SandboxConfig::timeout_secs`], then `SIGKILL` to the whole process group (the
//!   child calls `setsid`), which also ends whatever a finished call left running;
//! - output: standard output and error kept up to [`SandboxConfig::max_output_bytes`] each (head
//!   and tail);
//! - privileges: `PR_SET_NO_NEW_PRIVS`, and inherited descriptors closed on exec.
//!
//! Enforced where the system allows, as [`PythonSandbox::protections`] reports:
//! - user: a worker running as root runs the code as [`SandboxConfig::run_as_when_root`] (default
//!   `nobody`), so it cannot touch what only root may;
//! - processes: `RLIMIT_NPROC` ([`SandboxConfig::max_processes`]), which the kernel does not apply
//!   to root, so only for a non-root child ([`Protections::process_limit`]);
//! - network: new user and network namespaces (`unshare(CLONE_NEWUSER | CLONE_NEWNET)`), leaving
//!   only a loopback interface that is down, where the kernel lets the child's user create user
//!   namespaces; many container runtimes forbid it ([`Protections::network_isolated`]).
//!
//! Not enforced: a process that leaves the group with `setsid` escapes the kill at the end of a
//! call (it keeps its CPU limit); without namespaces the process limit counts every process of the
//! child's user, so concurrent calls share it.

use kart_core::agent::tir::ToolOutcome;
use serde::Serialize;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use kart_core::config::sandbox::{SandboxConfig, UserIds};

/// The program the interpreter runs: it reads the model's code from standard input, applies
/// upstream's checks, executes it, and writes the report on standard error after [`REPORT_MARKER`]
/// and its pid (processes the code forked run this too, and their reports do not count).
/// `os._exit` skips interpreter shutdown, so threads the code left running cannot delay the result.
const RUNNER: &str = r#"import os, re, sys, traceback
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
sys.__stderr__.write("\n\x1ekart-python-report:%d:%s\n" % (os.getpid(), report))
sys.__stderr__.flush()
os._exit(0)
"#;

/// Precedes the report on standard error.
const REPORT_MARKER: &str = "\x1ekart-python-report:";

/// The report of a call that ran out of time (upstream's wording).
pub const TIMEOUT_REPORT: &str = "Timeout Error";

/// The protections that depend on the kernel and on who runs the worker, decided once by
/// [`PythonSandbox::new`]; every other protection of the module table always applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Protections {
    /// The user the code runs as.
    pub uid: u32,
    /// Whether `RLIMIT_NPROC` binds (the child is not root).
    pub process_limit: bool,
    /// Whether the code runs in its own user and network namespaces, without network.
    pub network_isolated: bool,
}

impl std::fmt::Display for Protections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let yes_no = |b: bool| if b { "enforced" } else { "not enforced" };
        write!(
            f,
            "clean environment, temporary directory, CPU/memory/file-size/open-file limits, wall-clock \
             timeout, output cap, no new privileges; uid {}; process limit {}; network isolation {}",
            self.uid,
            yes_no(self.process_limit),
            yes_no(self.network_isolated)
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
    /// The work directory could not be made ready.
    #[error("python sandbox work directory {path}: {source}")]
    WorkDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The interpreter could not be started.
    #[error("starting {interpreter}: {source}")]
    Spawn {
        /// The configured interpreter.
        interpreter: PathBuf,
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
    work_root: PathBuf,
    limits: Limits,
    protections: Protections,
    slots: Semaphore,
}

impl PythonSandbox {
    /// Checks `config` and probes which protections this kernel and user allow.
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
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let switch_to = config.run_as_when_root.filter(|_| euid == 0);
        let uid = switch_to.map_or(euid, |ids| ids.uid);
        let limits = Limits {
            switch_to,
            isolate_network: config.isolate_network && can_isolate_network(switch_to),
            cpu_secs: config.cpu_secs,
            memory_bytes: config.memory_bytes,
            max_processes: config.max_processes,
            max_file_bytes: config.max_file_bytes,
            max_open_files: config.max_open_files,
        };
        let protections =
            Protections { uid, process_limit: uid != 0, network_isolated: limits.isolate_network };
        let work_root = config.work_root.clone().unwrap_or_else(std::env::temp_dir);
        let slots = Semaphore::new(config.max_concurrent);
        Ok(PythonSandbox { config, work_root, limits, protections, slots })
    }

    /// What is enforced on this machine beyond the protections that always apply.
    pub fn protections(&self) -> Protections {
        self.protections
    }

    /// Runs `code` and returns upstream's result: `Python { stdout, report }` with `report` `Done`,
    /// the last line of the traceback (standard output then dropped, as upstream does), or
    /// [`TIMEOUT_REPORT`]. Waits for a free slot first; dropping the future kills the child.
    pub async fn run(&self, code: &str) -> Result<ToolOutcome, SandboxError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let work_dir = WorkDir::create(&self.work_root, self.limits.switch_to)?;
        let mut command = tokio::process::Command::new(&self.config.interpreter);
        command
            .args(["-I", "-c", RUNNER])
            .env_clear()
            .envs(self.child_env(work_dir.path()))
            .current_dir(work_dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let limits = self.limits;
        // SAFETY: `Limits::apply` only makes system calls, which are safe between fork and exec.
        unsafe { command.pre_exec(move || limits.apply()) };
        let mut child = command
            .spawn()
            .map_err(|source| SandboxError::Spawn { interpreter: self.config.interpreter.clone(), source })?;
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
            // Out of time: the interpreter, or what it left in its group holding the pipes.
            group.kill();
        }
        let status = match exit {
            Some(status) => status?,
            // Timed out before the interpreter ended: reap it after the kill.
            None => {
                child.wait().await?;
                return Ok(python_outcome("", TIMEOUT_REPORT));
            }
        };
        if finished {
            read_result?;
        }
        Ok(outcome(status, pid, &out.into_string(), &err.into_string()))
    }

    /// The child's whole environment: no variable of the worker's.
    fn child_env(&self, work_dir: &Path) -> Vec<(&'static str, OsString)> {
        let mut env = vec![
            ("PATH", OsString::from(&self.config.path)),
            ("LANG", "C.UTF-8".into()),
            ("HOME", work_dir.into()),
            ("TMPDIR", work_dir.into()),
        ];
        // One BLAS/OpenMP thread: a thread per core would hit the process and memory limits.
        for name in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"] {
            env.push((name, "1".into()));
        }
        env
    }
}

fn python_outcome(stdout: &str, report: &str) -> ToolOutcome {
    ToolOutcome::Python { stdout: stdout.to_owned(), report: report.to_owned() }
}

/// The result of interpreter `pid`, which ended by itself: the runner's report, else one made from
/// how the process ended (`SIGXCPU` is the CPU limit, hence a timeout).
fn outcome(status: ExitStatus, pid: u32, stdout: &str, stderr: &str) -> ToolOutcome {
    let marker = format!("{REPORT_MARKER}{pid}:");
    let report = match stderr.rfind(&marker) {
        Some(at) => {
            let rest = &stderr[at + marker.len()..];
            rest.split('\n').next().unwrap_or_default().to_owned()
        }
        None if status.success() => "Done".to_owned(),
        None if status.signal() == Some(libc::SIGXCPU) => TIMEOUT_REPORT.to_owned(),
        None => match stderr.lines().rev().find(|line| !line.trim().is_empty()) {
            Some(line) => line.trim().to_owned(),
            None => format!("Process ended with {status}"),
        },
    };
    if report == "Done" { python_outcome(stdout, &report) } else { python_outcome("", &report) }
}

/// What `pre_exec` applies in the child, between fork and exec.
#[derive(Debug, Clone, Copy)]
struct Limits {
    switch_to: Option<UserIds>,
    isolate_network: bool,
    cpu_secs: u64,
    memory_bytes: u64,
    max_processes: u64,
    max_file_bytes: u64,
    max_open_files: u64,
}

impl Limits {
    /// Runs in the forked child: a new session (so a process group to kill), the user switch, the
    /// namespaces, no new privileges, the resource limits, and close-on-exec for every inherited
    /// descriptor above standard error. The namespaces come after the user switch so that the
    /// process limit counts this call's processes only.
    fn apply(&self) -> io::Result<()> {
        // SAFETY: these are plain system calls on the calling process.
        unsafe {
            check(libc::setsid())?;
            drop_privileges(self.switch_to)?;
            if self.isolate_network {
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET))?;
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
        set_limit(libc::RLIMIT_CPU, self.cpu_secs, self.cpu_secs + 1)?;
        set_limit(libc::RLIMIT_AS, self.memory_bytes, self.memory_bytes)?;
        set_limit(libc::RLIMIT_NPROC, self.max_processes, self.max_processes)?;
        set_limit(libc::RLIMIT_FSIZE, self.max_file_bytes, self.max_file_bytes)?;
        set_limit(libc::RLIMIT_NOFILE, self.max_open_files, self.max_open_files)?;
        set_limit(libc::RLIMIT_CORE, 0, 0)?;
        // SAFETY: marks descriptors close-on-exec; nothing is closed under anyone's feet.
        check(unsafe { libc::close_range(3, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC as libc::c_int) })?;
        Ok(())
    }
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
    // SAFETY: `limit` is a valid rlimit for the duration of the call.
    check(unsafe { libc::setrlimit(resource, &limit) })
}

/// Drops supplementary groups, then switches group and user (in that order, while still allowed).
fn drop_privileges(ids: Option<UserIds>) -> io::Result<()> {
    let Some(UserIds { uid, gid }) = ids else { return Ok(()) };
    // SAFETY: plain system calls; setgroups gets an empty list.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(gid))?;
        check(libc::setuid(uid))
    }
}

/// Whether a child that switches to `ids` may then create user and network namespaces: a forked
/// probe that tries exactly that and exits.
fn can_isolate_network(ids: Option<UserIds>) -> bool {
    // SAFETY: the child makes only system calls (async-signal-safe) and leaves with `_exit`.
    unsafe {
        match libc::fork() {
            -1 => false,
            0 => {
                let isolated = drop_privileges(ids).is_ok()
                    && libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) == 0;
                libc::_exit(if isolated { 0 } else { 1 })
            }
            pid => {
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0) == pid
                    && libc::WIFEXITED(status)
                    && libc::WEXITSTATUS(status) == 0
            }
        }
    }
}

/// The child's process group (its id is the child's pid, as the child calls `setsid`); killed on
/// drop, so a cancelled call leaves nothing running.
struct ProcessGroup(libc::pid_t);

impl ProcessGroup {
    fn kill(&self) {
        // SAFETY: signals a process group; an empty group (ESRCH) is fine.
        unsafe { libc::killpg(self.0, libc::SIGKILL) };
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A call's private working directory, removed on drop.
struct WorkDir(PathBuf);

impl WorkDir {
    /// Makes `kart-python-{pid}-{n}` under `root`, mode 0700, owned by `owner` when given.
    fn create(root: &Path, owner: Option<UserIds>) -> Result<Self, SandboxError> {
        use std::os::unix::fs::DirBuilderExt;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path =
            root.join(format!("kart-python-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let fail = |source| SandboxError::WorkDir { path: path.clone(), source };
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(fail)?;
        let dir = WorkDir(path.clone());
        if let Some(ids) = owner {
            std::os::unix::fs::chown(&path, Some(ids.uid), Some(ids.gid)).map_err(fail)?;
        }
        Ok(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0) {
            let path = self.0.display();
            tracing::warn!(%path, %error, "could not remove a python sandbox work directory");
        }
    }
}

/// Captured output: everything up to `cap` bytes, else the first and last `cap / 2` bytes and
/// how much was left out in between.
struct Capture {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: usize,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Capture { cap, head: Vec::new(), tail: VecDeque::new(), total: 0 }
    }

    async fn read_from(&mut self, mut pipe: impl AsyncRead + Unpin) -> io::Result<()> {
        let mut buf = [0u8; 8192];
        loop {
            let n = pipe.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            self.push(&buf[..n]);
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        let head_room = (self.cap / 2).saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(head_room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        bytes = rest;
        self.tail.extend(bytes);
        let keep = self.cap - self.cap / 2;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
    }

    fn into_string(self) -> String {
        let omitted = self.total - self.head.len() - self.tail.len();
        let mut bytes = self.head;
        if omitted > 0 {
            bytes.extend_from_slice(format!("\n[... {omitted} bytes omitted ...]\n").as_bytes());
        }
        bytes.extend(self.tail);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn config() -> SandboxConfig {
        SandboxConfig { timeout_secs: 5, cpu_secs: 5, memory_bytes: 512 << 20, ..SandboxConfig::default() }
    }

    fn sandbox(config: SandboxConfig) -> PythonSandbox {
        PythonSandbox::new(config).expect("valid config")
    }

    async fn run(sandbox: &PythonSandbox, code: &str) -> (String, String) {
        match sandbox.run(code).await.expect("the sandbox works") {
            ToolOutcome::Python { stdout, report } => (stdout, report),
            other => panic!("unexpected outcome {other:?}"),
        }
    }

    /// Processes whose command line holds `marker`.
    fn processes_with(marker: &str) -> Vec<String> {
        std::fs::read_dir("/proc")
            .expect("procfs")
            .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
            .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
            .filter(|cmdline| cmdline.contains(marker))
            .collect()
    }

    #[tokio::test]
    async fn prints_output() {
        let sandbox = sandbox(config());
        assert_eq!(run(&sandbox, "x = 6\nprint(x * 7)").await, ("42\n".into(), "Done".into()));
        // Upstream prints nothing for a trailing expression and runs no `__main__` block.
        let code = "print('a')\n1 + 1\nif __name__ == '__main__':\n    print('main')";
        assert_eq!(run(&sandbox, code).await, ("a\n".into(), "Done".into()));
        assert_eq!(
            run(&sandbox, "import sys\nprint('bye')\nsys.exit(0)").await,
            ("bye\n".into(), "Done".into())
        );
    }

    #[tokio::test]
    async fn errors_report_the_last_traceback_line() {
        let sandbox = sandbox(config());
        let (stdout, report) = run(&sandbox, "print(").await;
        assert_eq!((stdout.as_str(), report.as_str()), ("", "SyntaxError: '(' was never closed"));
        // Output printed before the exception is dropped, as upstream does.
        let (stdout, report) = run(&sandbox, "print('partial')\n1 / 0").await;
        assert_eq!((stdout.as_str(), report.as_str()), ("", "ZeroDivisionError: division by zero"));
        assert_eq!(run(&sandbox, "x = input('? ')").await.1, "RuntimeError");
        assert_eq!(run(&sandbox, "import sys\nsys.exit(3)").await.1, "SystemExit: 3");
        // `print` output mentioning an error still counts as output.
        assert_eq!(run(&sandbox, "print('ValueError')").await.0, "ValueError\n");
    }

    #[tokio::test]
    async fn an_infinite_loop_times_out_with_its_children() {
        let sandbox = sandbox(SandboxConfig { timeout_secs: 1, ..config() });
        let marker = format!("kart-sandbox-timeout-{}", std::process::id());
        let code = format!(
            "import subprocess, sys\n\
             subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])\n\
             while True:\n    pass"
        );
        let started = std::time::Instant::now();
        assert_eq!(run(&sandbox, &code).await, (String::new(), TIMEOUT_REPORT.into()));
        assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
        // SIGKILL was sent to the whole group; give the kernel a moment to finish the grandchild.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !processes_with(&marker).is_empty() {
            assert!(std::time::Instant::now() < deadline, "left running: {:?}", processes_with(&marker));
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn cpu_time_is_limited() {
        let sandbox = sandbox(SandboxConfig { timeout_secs: 30, cpu_secs: 1, ..config() });
        let started = std::time::Instant::now();
        assert_eq!(run(&sandbox, "while True:\n    pass").await.1, TIMEOUT_REPORT);
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn memory_is_limited() {
        let sandbox = sandbox(SandboxConfig { memory_bytes: 256 << 20, ..config() });
        assert_eq!(run(&sandbox, "x = bytearray(1 << 30)").await, (String::new(), "MemoryError".into()));
        assert_eq!(run(&sandbox, "x = bytearray(1 << 20)\nprint(len(x))").await.1, "Done");
    }

    #[tokio::test]
    async fn processes_are_limited() {
        // A user of its own, so that no other test's processes count against the limit.
        let config = SandboxConfig {
            max_processes: 8,
            run_as_when_root: Some(UserIds { uid: 64_999, gid: 64_999 }),
            ..config()
        };
        let sandbox = sandbox(config);
        let code = "import os, time\n\
                    children = 0\n\
                    try:\n    \
                        while True:\n        \
                            if os.fork() == 0:\n            \
                                time.sleep(60)\n            \
                                os._exit(0)\n        \
                            children += 1\n\
                    except OSError as error:\n    \
                        print(children, type(error).__name__)";
        let (stdout, report) = run(&sandbox, code).await;
        if sandbox.protections().process_limit {
            assert_eq!(report, "Done");
            let (children, error) = stdout.trim().split_once(' ').expect("count and error");
            assert!(children.parse::<u64>().expect("a count") < 8, "{stdout}");
            assert_eq!(error, "BlockingIOError");
        } else {
            // Root is exempt from RLIMIT_NPROC; only the timeout and the group kill bound the fork bomb.
            assert_eq!(sandbox.protections().uid, 0);
        }
    }

    #[tokio::test]
    async fn file_size_is_limited() {
        let sandbox = sandbox(SandboxConfig { max_file_bytes: 1 << 20, ..config() });
        let code = "with open('big', 'wb') as f:\n    f.write(b'x' * (4 << 20))";
        assert_eq!(run(&sandbox, code).await.1, "OSError: [Errno 27] File too large");
        let code = "with open('small', 'wb') as f:\n    f.write(b'x' * 1000)\n\
                    print(open('small', 'rb').read().count(b'x'))";
        assert_eq!(run(&sandbox, code).await.0, "1000\n");
    }

    #[tokio::test]
    async fn the_environment_is_clean() {
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some(), "cargo sets it for tests");
        let sandbox = sandbox(config());
        let (stdout, _) = run(&sandbox, "import os\nprint(sorted(os.environ))").await;
        assert_eq!(
            stdout.trim(),
            "['HOME', 'LANG', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH', 'TMPDIR']"
        );
        let (stdout, _) = run(&sandbox, "import os\nprint(os.environ.get('SERPER_API_KEY'))").await;
        assert_eq!(stdout, "None\n");
    }

    #[tokio::test]
    async fn each_call_gets_a_fresh_directory_that_is_removed() {
        let root = tempfile::tempdir().expect("temporary directory");
        let sandbox = sandbox(SandboxConfig { work_root: Some(root.path().into()), ..config() });
        let code = "import os\n\
                    print(os.getcwd(), os.environ['HOME'] == os.getcwd(), os.listdir('.'))\n\
                    open('left-behind', 'w').write('x')\n\
                    os.mkdir('locked', 0)";
        let (first, report) = run(&sandbox, code).await;
        assert_eq!(report, "Done");
        let (second, _) = run(&sandbox, code).await;
        let cwd = |out: &str| PathBuf::from(out.split(' ').next().expect("a directory"));
        assert_ne!(cwd(&first), cwd(&second));
        for out in [&first, &second] {
            assert!(out.ends_with(" True []\n"), "{out}");
            assert_eq!(cwd(out).parent(), Some(root.path()));
        }
        assert_eq!(std::fs::read_dir(root.path()).expect("readable").count(), 0, "work directories remain");
    }

    #[tokio::test]
    async fn network_is_cut_off_where_the_kernel_allows() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
        let port = listener.local_addr().expect("bound").port();
        let sandbox = sandbox(config());
        let code = format!(
            "import socket\n\
             try:\n    \
                 socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    \
                 print('connected')\n\
             except OSError as error:\n    \
                 print(type(error).__name__)"
        );
        let (stdout, report) = run(&sandbox, &code).await;
        assert_eq!(report, "Done");
        let expected = if sandbox.protections().network_isolated { "OSError\n" } else { "connected\n" };
        assert_eq!(stdout, expected, "protections: {}", sandbox.protections());

        let open = self::sandbox(SandboxConfig { isolate_network: false, ..config() });
        assert!(!open.protections().network_isolated);
        assert_eq!(run(&open, &code).await, ("connected\n".into(), "Done".into()));
    }

    #[tokio::test]
    async fn concurrent_calls_wait_for_a_slot() {
        let sandbox = Arc::new(sandbox(SandboxConfig { max_concurrent: 1, ..config() }));
        let code = "import time\nstart = time.time()\nsum(range(3_000_000))\nprint(start, time.time())";
        let runs = (0..3).map(|_| {
            let sandbox = Arc::clone(&sandbox);
            tokio::spawn(async move { run(&sandbox, code).await.0 })
        });
        let mut spans: Vec<(f64, f64)> = Vec::new();
        for run in runs {
            let out = run.await.expect("joined");
            let (start, end) = out.trim().split_once(' ').expect("two times");
            spans.push((start.parse().expect("a time"), end.parse().expect("a time")));
        }
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "overlapping runs: {spans:?}");
        }
    }

    #[tokio::test]
    async fn output_is_capped_keeping_head_and_tail() {
        let sandbox = sandbox(SandboxConfig { max_output_bytes: 1000, ..config() });
        let (stdout, report) = run(&sandbox, "print('head' + 'x' * 100000 + 'tail')").await;
        assert_eq!(report, "Done");
        assert!(stdout.starts_with("headxxx") && stdout.ends_with("xxxtail\n"), "{stdout}");
        assert!(stdout.contains("[... 99009 bytes omitted ...]"), "{stdout}");
        assert!(stdout.len() < 1100);
    }

    #[tokio::test]
    async fn configuration_errors_name_the_field() {
        let error = PythonSandbox::new(SandboxConfig { max_concurrent: 0, ..config() }).expect_err("invalid");
        assert_eq!(error.to_string(), "python sandbox config `max_concurrent`: must be positive");
        let sandbox = sandbox(SandboxConfig { interpreter: "/nonexistent/python".into(), ..config() });
        let error = sandbox.run("print(1)").await.expect_err("no interpreter");
        assert!(error.to_string().starts_with("starting /nonexistent/python: "), "{error}");
        let outcome = ToolOutcome::from(error);
        assert!(matches!(outcome, ToolOutcome::Failed { .. }));
    }
}
