//! The worker's file-descriptor budget. Every trajectory in flight on an HTTP engine holds a
//! connection to it, every search call in flight one to the retriever, and every Python run the
//! pipes of its sandbox; a worker whose limits allow more of these than the process may open
//! would fail calls with `EMFILE` under load. So a worker raises its soft `RLIMIT_NOFILE` to the
//! hard limit and refuses to start when its configuration could still exceed it.

use kart_core::config::rollout::{EngineConfig, RolloutConfig};

/// Descriptors a worker holds whatever its load: the listener, connections from the trainer and
/// Prometheus, the model's files, logs and the runtime's own.
pub const BASE: u64 = 256;

/// Descriptors one Python run holds in the worker: its stdin, stdout and stderr pipes, the two
/// seccomp pipes while bubblewrap starts, and the child's handle, with room to spare.
pub const PER_PYTHON_RUN: u64 = 8;

/// The most descriptors `config` lets the worker hold at once.
pub fn needed(config: &RolloutConfig) -> u64 {
    let engine = match config.engine {
        EngineConfig::Embedded { .. } => 0,
        EngineConfig::Sglang { .. } | EngineConfig::Vllm { .. } => config.max_trajectories as u64,
    };
    let search =
        if config.context.retriever_url.is_some() { config.context.search_concurrency as u64 } else { 0 };
    let python = if config.env.runs_python() {
        config.context.python.max_concurrent as u64 * PER_PYTHON_RUN
    } else {
        0
    };
    BASE + engine + search + python
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the limit now in force.
pub fn raise_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

/// A configuration that could hold more descriptors than the process may open.
#[derive(Debug, thiserror::Error)]
#[error(
    "max_trajectories {max_trajectories}: with this engine, search_concurrency and python.max_concurrent \
     the worker may hold {needed} file descriptors, and this process may open {limit} (RLIMIT_NOFILE); \
     lower max_trajectories or raise the limit (ulimit -n, or the container runtime's nofile)"
)]
pub struct DescriptorError {
    pub max_trajectories: usize,
    pub needed: u64,
    pub limit: u64,
}

/// Whether a worker configured with `config` stays within `limit` descriptors.
pub fn check(config: &RolloutConfig, limit: u64) -> Result<(), DescriptorError> {
    let needed = needed(config);
    if needed <= limit {
        return Ok(());
    }
    Err(DescriptorError { max_trajectories: config.max_trajectories, needed, limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sglang(max_trajectories: usize) -> RolloutConfig {
        RolloutConfig {
            engine: EngineConfig::Sglang { urls: vec!["http://sglang:30000".into()], timeout_secs: 60.0 },
            max_trajectories,
            ..with_retriever()
        }
    }

    fn with_retriever() -> RolloutConfig {
        let mut config = RolloutConfig::default();
        config.context.retriever_url = Some("http://retriever:8000".into());
        config
    }

    #[test]
    fn http_engines_count_a_connection_per_trajectory() {
        let embedded = RolloutConfig { max_trajectories: 100_000, ..with_retriever() };
        assert_eq!(needed(&embedded), BASE + 8, "search_concurrency only");
        assert_eq!(needed(&RolloutConfig::default()), BASE, "no retriever, no search connections");
        assert_eq!(needed(&sglang(16_384)), BASE + 16_384 + 8);
    }

    #[test]
    fn python_runs_count_their_pipes() {
        let mut config = with_retriever();
        config.env = serde_json::from_str(r#"{"kind": "tir", "tools": ["python"]}"#).unwrap();
        config.context.python.max_concurrent = 10;
        assert_eq!(needed(&config), BASE + 8 + 10 * PER_PYTHON_RUN);
    }

    #[test]
    fn a_worker_that_could_run_out_of_descriptors_is_refused() {
        // The audit's case: n = 1024 x 16 prompts on SGLang under a 20,000 descriptor limit.
        let err = check(&sglang(32_768), 20_000).unwrap_err().to_string();
        assert!(err.contains("max_trajectories") && err.contains("32768") && err.contains("20000"), "{err}");
        check(&sglang(16_384), 20_000).unwrap();
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let raised = raise_limit().unwrap();
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        assert_eq!((raised, limit.rlim_cur), (limit.rlim_max, limit.rlim_max));
    }
}
