//! Figures of another process, as a benchmark reads them off a server it started.

/// The resident memory of process `pid` now, in MB (`VmRSS` of /proc; 0 where unreadable, as for
/// a process that has exited).
pub fn resident_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_nothing_for_a_missing_one() {
        let mine = resident_mb(std::process::id());
        let mut buffer = vec![0u8; 64 << 20];
        for page in buffer.iter_mut().step_by(4096) {
            *page = 1;
        }
        std::hint::black_box(&buffer);
        let more = resident_mb(std::process::id());
        assert!(mine > 1.0 && more >= mine + 60.0, "{mine} MB, then {more} MB with 64 MB touched");
        drop(buffer);
        assert_eq!(resident_mb(u32::MAX), 0.0);
    }
}
