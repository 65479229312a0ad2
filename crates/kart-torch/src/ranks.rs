//! This process's place in a distributed run, from the variables torchrun (and kart's launcher,
//! and the operator) set: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`.

use serde::Serialize;

/// Where this process sits among the run's processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ranks {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Where rank 0's store listens.
    pub master_addr: String,
    pub master_port: u16,
}

/// A variable that does not describe a rank.
#[derive(Debug, thiserror::Error)]
#[error("{var} = {value}: {reason}")]
pub struct RanksError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

impl Ranks {
    /// Rank `rank` of `world_size` processes on this machine meeting at 127.0.0.1:`port` (tests
    /// and benchmarks that start their ranks themselves).
    pub fn loopback(rank: usize, world_size: usize, port: u16) -> Ranks {
        Ranks {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        }
    }

    /// One process alone.
    pub fn single() -> Ranks {
        Ranks {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
        }
    }

    /// The ranks of this process's environment; without `WORLD_SIZE`, one process alone.
    pub fn from_env() -> Result<Ranks, RanksError> {
        Ranks::from_vars(|name| std::env::var(name).ok())
    }

    /// The ranks the variables `var` answers describe.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Ranks, RanksError> {
        let Some(world) = var("WORLD_SIZE") else { return Ok(Ranks::single()) };
        let number = |name: &'static str, value: String| {
            value.trim().parse::<usize>().map_err(|e| RanksError { var: name, value, reason: e.to_string() })
        };
        let world_size = number("WORLD_SIZE", world.clone())?;
        if world_size == 0 {
            return Err(RanksError { var: "WORLD_SIZE", value: world, reason: "must be at least 1".into() });
        }
        let get = |name: &'static str, default: usize| var(name).map_or(Ok(default), |v| number(name, v));
        let rank = get("RANK", 0)?;
        let local_rank = get("LOCAL_RANK", rank)?;
        let local_world_size = get("LOCAL_WORLD_SIZE", world_size)?;
        let below = |name: &'static str, value: usize, bound: usize, what: &str| {
            if value < bound {
                return Ok(());
            }
            Err(RanksError {
                var: name,
                value: value.to_string(),
                reason: format!("must be below {what} ({bound})"),
            })
        };
        below("RANK", rank, world_size, "WORLD_SIZE")?;
        below("LOCAL_RANK", local_rank, local_world_size, "LOCAL_WORLD_SIZE")?;
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let master_port = match var("MASTER_PORT") {
            None => 29500,
            Some(p) => p.trim().parse::<u16>().map_err(|e| RanksError {
                var: "MASTER_PORT",
                value: p.clone(),
                reason: e.to_string(),
            })?,
        };
        Ok(Ranks { rank, world_size, local_rank, local_world_size, master_addr, master_port })
    }

    /// Whether this is the process that writes, serves and publishes.
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ranks(vars: &[(&str, &str)]) -> Result<Ranks, RanksError> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ranks::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn torchrun_variables_place_the_process() {
        assert_eq!(ranks(&[]).unwrap(), Ranks::single());
        let r = ranks(&[
            ("WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "trainer-0.trainer"),
            ("MASTER_PORT", "29400"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank, r.local_world_size), (3, 4, 1, 2));
        assert_eq!((r.master_addr.as_str(), r.master_port), ("trainer-0.trainer", 29400));
        assert!(!r.is_leader());
    }

    #[test]
    fn bad_variables_are_named() {
        let err = |vars: &[(&str, &str)]| ranks(vars).unwrap_err().to_string();
        assert_eq!(err(&[("WORLD_SIZE", "two")]), "WORLD_SIZE = two: invalid digit found in string");
        assert_eq!(err(&[("WORLD_SIZE", "0")]), "WORLD_SIZE = 0: must be at least 1");
        assert_eq!(err(&[("WORLD_SIZE", "2"), ("RANK", "2")]), "RANK = 2: must be below WORLD_SIZE (2)");
        assert!(err(&[("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")]).starts_with("MASTER_PORT = 70000: "));
    }
}
