//! Loopback ports for servers kart (or a test) starts in another process or hands to a library
//! that binds them itself: a benchmark's inference server, a c10d store's `MASTER_PORT`.
//!
//! A port found free by binding port 0 and released is in the kernel's ephemeral range: until the
//! server binds it, the kernel may give it to any outgoing connection's source or to another
//! `bind(0)`, and a test beside this one may be handed it too. So ports come from below that range
//! (`net.ipv4.ip_local_port_range`), which the kernel never hands out by itself, and each is
//! claimed against every process that takes ports here: an open-file-description lock on the
//! port's byte of one shared file, held until the process exits (so a crashed test leaves no
//! claim behind).

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::{Mutex, OnceLock, PoisonError};

/// The lowest port handed out: above the well-known and most registered services' ports.
const LOWEST: u16 = 15000;

/// A TCP port on 127.0.0.1 that was free a moment ago, that no other process taking ports through
/// this function holds, that this process has not handed out before, and that the kernel gives
/// to no connection or `bind(0)` of its own accord (where the ephemeral range leaves room below
/// it; else one of that range).
///
/// Fails when no port is free (tens of thousands taken) or the claims file cannot be opened.
pub fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let (low, high) = candidates();
    let span = u32::from(high - low) + 1;
    // Processes start at different places, so they seldom contend for the same ports.
    let start = (std::process::id().wrapping_mul(7919) + handed_out.len() as u32) % span;
    for offset in 0..span {
        let port = low + ((start + offset) % span) as u16;
        if handed_out.contains(&port) || !claim(port)? {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            handed_out.insert(port);
            return Ok(port);
        }
        // Taken by something that does not claim ports: leave it (the claim is harmless).
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no free port in {low}..={high}")))
}

/// The ports to choose from: below the kernel's ephemeral range where it leaves room, else that
/// range.
fn candidates() -> (u16, u16) {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = range.split_whitespace().filter_map(|n| n.parse::<u16>().ok());
    match (bounds.next(), bounds.next()) {
        (Some(first), _) if first > LOWEST + 1000 => (LOWEST, first - 1),
        (Some(first), Some(last)) => (first, last),
        _ => (LOWEST, 32767),
    }
}

/// The file whose bytes are the ports' claims.
fn claims_path() -> std::path::PathBuf {
    std::env::temp_dir().join("kart-ports.lock")
}

/// Claims `port` for this process until it exits; false when another process holds it.
fn claim(port: u16) -> std::io::Result<bool> {
    static CLAIMS: OnceLock<File> = OnceLock::new();
    let file = match CLAIMS.get() {
        Some(file) => file,
        None => {
            let path = claims_path();
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            // Other users' processes take ports through the same file.
            let _ = std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666));
            CLAIMS.get_or_init(|| file)
        }
    };
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct; the fields are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = libc::off_t::from(port);
    lock.l_len = 1;
    // SAFETY: fcntl on an open descriptor with a pointer to a valid `flock` that outlives the call.
    Ok(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) == 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_stay_out_of_the_ephemeral_range() {
        let mut ports: Vec<u16> = (0..500).map(|_| free_port().unwrap()).collect();
        let (low, high) = candidates();
        assert!(ports.iter().all(|p| (low..=high).contains(p)), "{ports:?} outside {low}..={high}");
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 500);
    }

    #[test]
    fn a_port_claimed_by_another_process_is_not_handed_out() {
        // Another process (a child holding its claims) takes ports; none of them comes back here.
        let port = free_port().unwrap();
        let script = format!(
            "import fcntl, os, struct, sys\n\
             f = open({path:?}, 'r+')\n\
             lock = struct.pack('hhqqi4x', fcntl.F_WRLCK, os.SEEK_SET, {port}, 1, 0)\n\
             try:\n    fcntl.fcntl(f, 37, lock)\nexcept OSError:\n    print('held'); sys.exit(0)\n\
             print('free')\n",
            path = claims_path(),
        );
        let out = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "held", "{out:?}");
    }
}
