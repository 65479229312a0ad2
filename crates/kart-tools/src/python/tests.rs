use super::*;
use std::sync::Arc;

/// Limits that a loaded machine's slow start of bubblewrap and Python never reaches; tests of a
/// limit set their own.
fn config() -> SandboxConfig {
    SandboxConfig { timeout_secs: 60, cpu_secs: 60, memory_bytes: 512 << 20, ..SandboxConfig::default() }
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

/// Processes whose command line holds `marker`, with their pids.
fn processes_with(marker: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .expect("procfs")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
        })
        .filter(|(_, cmdline)| cmdline.contains(marker))
        .collect()
}

/// Waits, with a deadline, until no process holds `marker` in its command line.
async fn wait_until_gone(marker: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !processes_with(marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "left running: {:?}", processes_with(marker));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn prints_output() {
    let sandbox = sandbox(config());
    assert_eq!(run(&sandbox, "x = 6\nprint(x * 7)").await, ("42\n".into(), "Done".into()));
    // Upstream prints nothing for a trailing expression and runs no `__main__` block.
    let code = "print('a')\n1 + 1\nif __name__ == '__main__':\n    print('main')";
    assert_eq!(run(&sandbox, code).await, ("a\n".into(), "Done".into()));
    assert_eq!(run(&sandbox, "import sys\nprint('bye')\nsys.exit(0)").await, ("bye\n".into(), "Done".into()));
    // A forked child that reaches the end of the runner does not report for the call.
    let code = "import os\nif os.fork() == 0:\n    raise ValueError('child')\nos.wait()\nprint('parent')";
    assert_eq!(run(&sandbox, code).await, ("parent\n".into(), "Done".into()));
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
    for isolation in [Isolation::Bubblewrap, Isolation::None] {
        let sandbox = sandbox(SandboxConfig { timeout_secs: 1, isolation, ..config() });
        let marker = format!("kart-sandbox-timeout-{}-{isolation:?}", std::process::id());
        let code = format!(
            "import subprocess, sys\n\
             subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])\n\
             while True:\n    pass"
        );
        let started = std::time::Instant::now();
        assert_eq!(run(&sandbox, &code).await, (String::new(), TIMEOUT_REPORT.into()));
        // Not the child's 600 s: the call ends at its limit, however slowly a loaded machine
        // gets there.
        assert!(started.elapsed() < Duration::from_secs(300), "took {:?}", started.elapsed());
        wait_until_gone(&marker).await;
    }
}

#[tokio::test]
async fn cpu_time_is_limited() {
    // The wall-clock limit is far beyond what 1 s of CPU takes even on a loaded machine, so the
    // CPU limit is what ends the call.
    let sandbox = sandbox(SandboxConfig { timeout_secs: 600, cpu_secs: 1, ..config() });
    let started = std::time::Instant::now();
    assert_eq!(run(&sandbox, "while True:\n    pass").await.1, TIMEOUT_REPORT);
    assert!(started.elapsed() < Duration::from_secs(300), "took {:?}", started.elapsed());
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
    let config = SandboxConfig { max_processes: 8, run_as: UserIds { uid: 64_999, gid: 64_999 }, ..config() };
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
        // A worker that is not root keeps its user: the PID namespace, the timeout and the group
        // kill bound the fork bomb.
        assert_ne!(unsafe { libc::geteuid() }, 0);
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
async fn private_tmpfs_is_capped_by_tmpfs_bytes() {
    let sandbox = sandbox(SandboxConfig { tmpfs_bytes: 4 << 20, ..config() });
    for dir in ["/tmp", "/dev/shm"] {
        let code = format!("open('{dir}/fill', 'wb').write(b'x' * (8 << 20))");
        assert_eq!(run(&sandbox, &code).await.1, "OSError: [Errno 28] No space left on device", "{dir}");
        let code = format!("open('{dir}/fits', 'wb').write(b'x' * (1 << 20))\nprint('ok')");
        assert_eq!(run(&sandbox, &code).await.0, "ok\n", "{dir}");
    }
}

#[tokio::test]
async fn read_only_paths_and_run_as_shape_the_sandbox() {
    use std::os::unix::fs::PermissionsExt;
    // Not under /tmp, which the sandbox's own tmpfs covers, and reachable by the code's user.
    let shared = tempfile::tempdir_in("/var/tmp").expect("temporary directory");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(shared.path().join("visible"), "x").expect("written");
    let mut paths = SandboxConfig::default().read_only_paths;
    paths.push(shared.path().into());
    let sandbox = sandbox(SandboxConfig {
        read_only_paths: paths,
        run_as: UserIds { uid: 64_998, gid: 64_998 },
        ..config()
    });
    let code = format!(
        "import os\nprint(os.getuid(), os.getgid(), sorted(os.listdir('{}')))",
        shared.path().display()
    );
    assert_eq!(run(&sandbox, &code).await, ("64998 64998 ['visible']\n".into(), "Done".into()));
    assert_eq!(sandbox.protections().uid, 64_998);
}

#[tokio::test]
async fn the_environment_is_clean() {
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some(), "cargo sets it for tests");
    // Bubblewrap adds `PWD`, the working directory.
    for (isolation, pwd) in [(Isolation::Bubblewrap, " 'PWD',"), (Isolation::None, "")] {
        let sandbox = sandbox(SandboxConfig { isolation, ..config() });
        let (stdout, _) = run(&sandbox, "import os\nprint(sorted(os.environ))").await;
        assert_eq!(
            stdout.trim(),
            format!(
                "['HOME', 'LANG', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH',{pwd} 'TMPDIR']"
            )
        );
    }
}

#[tokio::test]
async fn without_isolation_each_call_gets_a_fresh_directory_that_is_removed() {
    let root = tempfile::tempdir().expect("temporary directory");
    let sandbox = sandbox(SandboxConfig {
        isolation: Isolation::None,
        work_root: Some(root.path().into()),
        ..config()
    });
    assert_eq!(sandbox.protections().isolation, Isolation::None);
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
async fn network_is_cut_off_only_with_isolation() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let port = listener.local_addr().expect("bound").port();
    let code = format!(
        "import socket\n\
         try:\n    \
             socket.create_connection(('127.0.0.1', {port}), timeout=30)\n    \
             print('connected')\n\
         except OSError as error:\n    \
             print(type(error).__name__)"
    );
    // The sandbox's loopback is its own: nothing listens there.
    assert_eq!(run(&sandbox(config()), &code).await, ("ConnectionRefusedError\n".into(), "Done".into()));
    let open = sandbox(SandboxConfig { isolation: Isolation::None, ..config() });
    assert_eq!(run(&open, &code).await, ("connected\n".into(), "Done".into()));
}

#[tokio::test]
async fn concurrent_calls_wait_for_a_slot() {
    let sandbox = Arc::new(sandbox(SandboxConfig { max_concurrent: 1, ..config() }));
    let code = "import time\nstart = time.monotonic()\nsum(range(3_000_000))\nprint(start, time.monotonic())";
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

#[test]
fn configuration_errors_name_the_field() {
    let error = PythonSandbox::new(SandboxConfig { max_concurrent: 0, ..config() }).expect_err("invalid");
    assert_eq!(error.to_string(), "python sandbox config `max_concurrent`: must be positive");
    let error = PythonSandbox::new(SandboxConfig { run_as: UserIds { uid: 0, gid: 0 }, ..config() })
        .expect_err("root");
    assert_eq!(error.to_string(), "python sandbox config `run_as`: uid 0 is root or the worker's own user");
    let error = PythonSandbox::new(SandboxConfig { bubblewrap: "no-such-bwrap".into(), ..config() })
        .expect_err("no bubblewrap");
    assert!(
        error.to_string().starts_with("python sandbox config `bubblewrap`: no-such-bwrap is not on PATH"),
        "{error}"
    );
    // An interpreter outside the view fails at start-up, saying what to do.
    let error = PythonSandbox::new(SandboxConfig { interpreter: "/nonexistent/python".into(), ..config() })
        .expect_err("no interpreter");
    let message = error.to_string();
    assert!(message.contains("could not run `/nonexistent/python`"), "{message}");
    assert!(message.contains("read_only_paths") && message.contains("isolation: none"), "{message}");
    let error = PythonSandbox::new(SandboxConfig {
        isolation: Isolation::None,
        interpreter: "/nonexistent/python".into(),
        ..config()
    })
    .expect_err("no interpreter");
    assert!(error.to_string().starts_with("starting /nonexistent/python: "), "{error}");
    assert!(matches!(ToolOutcome::from(error), ToolOutcome::Failed { .. }));
}

/// The escapes a hostile but fair user tried (issue 37), each contained by the sandbox of the
/// user running the test: its worker (this process) survives, and nothing of the host is seen,
/// kept or left running.
#[tokio::test]
async fn escapes_are_contained() {
    let sandbox = sandbox(config());
    let protections = sandbox.protections();
    assert_eq!((protections.isolation, protections.uid), (Isolation::Bubblewrap, 65534), "{protections}");
    // SAFETY: geteuid has no preconditions.
    let worker_uid = unsafe { libc::geteuid() };
    assert_ne!(protections.uid, worker_uid);
    let expected_host_uid = if worker_uid == 0 { 65534 } else { worker_uid };
    assert_eq!(protections.host_uid, expected_host_uid);
    let worker = std::process::id();

    // Signals: the parent is the sandbox's init, which ignores them; the worker is not there.
    let code = format!(
        "import os, signal\n\
         for pid in (os.getppid(), {worker}):\n    \
             try:\n        \
                 os.kill(pid, signal.SIGKILL)\n        \
                 print(pid, 'sent')\n    \
             except OSError as error:\n        \
                 print(pid, type(error).__name__)\n\
         print(os.getuid(), os.getgid())"
    );
    let (stdout, report) = run(&sandbox, &code).await;
    assert_eq!(report, "Done", "the code's own sandbox survived");
    assert_eq!(stdout, format!("1 sent\n{worker} ProcessLookupError\n65534 65534\n"));

    // Files: none of the host's configuration, homes, model or temporary files; no worker's
    // environment through /proc (bubblewrap starts with none).
    let model = tempfile::NamedTempFile::new().expect("a file standing for the model");
    let code = format!(
        "import os\n\
         for path in ('/etc/passwd', '/root', '/home', '{model}', '/proc/{worker}/environ', '/work'):\n    \
             print(path, os.path.exists(path))\n\
         found = []\n\
         for pid in filter(str.isdigit, os.listdir('/proc') if os.path.isdir('/proc') else []):\n    \
             try:\n        \
                 found += [pid for var in (b'CARGO_MANIFEST_DIR', b'KART_SANDBOX_CANARY') if var in open('/proc/%s/environ' % pid, 'rb').read()]\n    \
             except OSError:\n        \
                 pass\n\
         print('secrets', found)",
        model = model.path().display()
    );
    let (stdout, _) = run(&sandbox, &code).await;
    let expected = format!(
        "/etc/passwd False\n/root False\n/home False\n{} False\n/proc/{worker}/environ False\n/work False\nsecrets []\n",
        model.path().display()
    );
    assert_eq!(stdout, expected);
    let (_, report) = run(&sandbox, "open('/usr/bin/kart-sandbox-write', 'w')").await;
    assert!(
        report.starts_with("OSError: [Errno 30] Read-only file system")
            || report.starts_with("PermissionError"),
        "{report}"
    );

    // Scratch space: 50 MB in /tmp and /dev/shm within the call, gone after it, never on the host.
    let name = format!("kart-sandbox-shm-{worker}");
    let code = format!(
        "for dir in ('/tmp', '/dev/shm'):\n    \
             open(dir + '/{name}', 'wb').write(b'x' * (50 << 20))\n\
         print('written')"
    );
    assert_eq!(run(&sandbox, &code).await, ("written\n".into(), "Done".into()));
    let code = format!("import os\nprint([os.path.exists(d + '/{name}') for d in ('/tmp', '/dev/shm')])");
    assert_eq!(run(&sandbox, &code).await.0, "[False, False]\n");
    for dir in ["/tmp", "/dev/shm"] {
        assert!(!Path::new(dir).join(&name).exists(), "{dir}/{name} on the host");
    }

    // Subprocesses, whatever the spelling, run inside, as the sandbox's user.
    let code = "import os, subprocess\n\
                getattr(os, 'sys' + 'tem')('id -u')\n\
                print(subprocess.run(['id', '-g'], capture_output=True, text=True).stdout.strip())";
    assert_eq!(run(&sandbox, code).await, ("65534\n65534\n".into(), "Done".into()));

    // System calls of the filter: no namespaces, no io_uring.
    let code = "import ctypes\n\
                libc = ctypes.CDLL(None, use_errno=True)\n\
                print(libc.unshare(0x10000000), ctypes.get_errno())\n\
                print(libc.syscall(425, 1, 0), ctypes.get_errno())";
    assert_eq!(run(&sandbox, code).await, ("-1 1\n-1 1\n".into(), "Done".into()));

    // A double-forked, setsid process: it runs as the sandbox's user on the host while the call
    // lasts, and dies with the call. The call lasts until the test has seen the orphan and
    // stopped it (SIGSTOP, which the call sees in the orphan's state where it has a /proc), or 30 s.
    let marker = format!("kart-sandbox-orphan-{worker}");
    let code = format!(
        "import os, sys, time\n\
         r, w = os.pipe()\n\
         if os.fork() == 0:\n    \
             os.setsid()\n    \
             pid = os.fork()\n    \
             if pid == 0:\n        \
                 os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'])\n    \
             os.write(w, str(pid).encode())\n    \
             os._exit(0)\n\
         orphan = int(os.read(r, 32))\n\
         deadline = time.monotonic() + 30\n\
         while time.monotonic() < deadline:\n    \
             try:\n        \
                 if open('/proc/%d/stat' % orphan).read().rsplit(')', 1)[1].split()[0] == 'T':\n            \
                     break\n    \
             except OSError:\n        \
                 pass\n    \
             time.sleep(0.05)\n\
         print('leaving')"
    );
    let call = tokio::spawn({
        let sandbox = Arc::new(sandbox);
        async move { run(&sandbox, &code).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let orphan = loop {
        if let Some((pid, _)) = processes_with(&marker).into_iter().next() {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "the orphan never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = std::fs::read_to_string(format!("/proc/{orphan}/status")).unwrap_or_default();
    let uid_line = status.lines().find(|line| line.starts_with("Uid:")).unwrap_or_default().to_owned();
    // SAFETY: a signal to the orphan this test's call started, seen above.
    unsafe { libc::kill(orphan as libc::pid_t, libc::SIGSTOP) };
    assert_eq!(call.await.expect("joined"), ("leaving\n".into(), "Done".into()));
    assert!(uid_line.split_whitespace().nth(1) == Some(&expected_host_uid.to_string()), "{uid_line}");
    wait_until_gone(&marker).await;
}

/// The same escapes with the worker running as the worker image's user, 65532: the test binary,
/// copied where that user can read it, runs [`escapes_are_contained`] as that user.
#[test]
fn escapes_are_contained_for_a_worker_running_as_uid_65532() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Only root can start a process as another user; a worker that is not root is the case
        // `escapes_are_contained` covers as it runs.
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let binary = dir.path().join("kart-tools-tests");
    std::fs::copy(std::env::current_exe().expect("the test binary"), &binary).expect("copied");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let output = std::process::Command::new(&binary)
        .args(["--exact", "python::tests::escapes_are_contained", "--test-threads=1"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CARGO_MANIFEST_DIR", env!("CARGO_MANIFEST_DIR"))
        .env("KART_SANDBOX_CANARY", "secret")
        .current_dir(dir.path())
        .uid(65532)
        .gid(65532)
        .output()
        .expect("the test binary runs as uid 65532");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
}
