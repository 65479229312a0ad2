//! What the child applies to itself between fork and exec, and the process group a call is
//! killed by.

use super::UserIds;
use std::io;
use std::os::fd::RawFd;

/// The child's resource limits and user, applied by [`Limits::apply`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The user a root worker switches to before anything else runs.
    pub switch_to: Option<UserIds>,
    pub cpu_secs: u64,
    pub memory_bytes: u64,
    /// `RLIMIT_NPROC`, set only when the child has a user of its own (it counts every process of
    /// the user, the worker's threads included).
    pub max_processes: Option<u64>,
    pub max_file_bytes: u64,
    pub max_open_files: u64,
}

impl Limits {
    /// Runs in the forked child: a new session (so a process group to kill), the user switch, no
    /// new privileges, the resource limits, `inherit` moved to descriptors 3, 4, … and every other
    /// descriptor above standard error marked close-on-exec. Only system calls, which are safe
    /// between fork and exec.
    pub fn apply(&self, inherit: &[RawFd]) -> io::Result<()> {
        // SAFETY: plain system calls on the calling process.
        unsafe {
            check(libc::setsid())?;
            drop_privileges(self.switch_to)?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
        let first_free = 3 + inherit.len() as libc::c_int;
        for (target, &fd) in (3..).zip(inherit) {
            // SAFETY: duplicates open descriptors; first out of the way of every target, then onto
            // the target (dup2 clears close-on-exec there).
            unsafe {
                let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, first_free);
                check(moved)?;
                check(libc::dup2(moved, target))?;
            }
        }
        set_limit(libc::RLIMIT_CPU, self.cpu_secs, self.cpu_secs + 1)?;
        set_limit(libc::RLIMIT_AS, self.memory_bytes, self.memory_bytes)?;
        if let Some(max) = self.max_processes {
            set_limit(libc::RLIMIT_NPROC, max, max)?;
        }
        set_limit(libc::RLIMIT_FSIZE, self.max_file_bytes, self.max_file_bytes)?;
        set_limit(libc::RLIMIT_NOFILE, self.max_open_files, self.max_open_files)?;
        set_limit(libc::RLIMIT_CORE, 0, 0)?;
        // SAFETY: marks descriptors close-on-exec; nothing is closed under anyone's feet.
        check(unsafe {
            libc::close_range(
                first_free as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            )
        })
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

/// The child's process group (its id is the child's pid, as the child calls `setsid`); killed on
/// drop, so a cancelled call leaves nothing running.
pub(super) struct ProcessGroup(pub libc::pid_t);

impl ProcessGroup {
    pub fn kill(&self) {
        // SAFETY: signals a process group; an empty group (ESRCH) is fine.
        unsafe { libc::killpg(self.0, libc::SIGKILL) };
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}
