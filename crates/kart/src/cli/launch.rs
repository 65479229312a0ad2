//! `kart train --nproc-per-node`: one trainer process per rank on this node, started as torchrun
//! starts them. Each child gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR` and `MASTER_PORT`; with several nodes, `WORLD_SIZE` (all ranks) and `NODE_RANK`
//! come from the environment (the operator sets them on each pod). SIGTERM and SIGINT are
//! forwarded to the children, which get as long as they need (rank 0 writes a checkpoint first;
//! in a pod, the kubelet's kill at the end of the grace period bounds it); a child that fails
//! stops the others, killed after [`GRACE`], and the launcher exits with the first failure's code. Children die with the launcher (even a SIGKILLed one), and without
//! `OMP_NUM_THREADS` each gets an equal share of the node's cores.

use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::ffi::OsString;
use std::str::FromStr;
use std::time::Duration;
use tokio::process::{Child, Command};

/// How long the other children get to stop after one failed before they are killed.
const GRACE: Duration = Duration::from_secs(15);

/// Processes per node: `auto` (one per visible GPU) or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NprocPerNode {
    Auto,
    Count(usize),
}

impl FromStr for NprocPerNode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(NprocPerNode::Auto),
            n => match n.parse::<usize>() {
                Ok(0) | Err(_) => Err(format!("`{n}` is neither `auto` nor a positive number")),
                Ok(n) => Ok(NprocPerNode::Count(n)),
            },
        }
    }
}

/// The ranks of this node's children.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    nproc: usize,
    node_rank: usize,
    world_size: usize,
    master_addr: String,
    master_port: u16,
}

impl Layout {
    fn from_env(nproc: NprocPerNode) -> anyhow::Result<Layout> {
        let nproc = match nproc {
            NprocPerNode::Count(n) => n,
            NprocPerNode::Auto => match usize::try_from(tch::Cuda::device_count()).unwrap_or(0) {
                0 => {
                    tracing::warn!("--nproc-per-node auto: no CUDA device visible; starting one process");
                    1
                }
                gpus => gpus,
            },
        };
        let var = |name: &str| std::env::var(name).ok();
        let number = |name: &str, value: String| -> anyhow::Result<usize> {
            value.trim().parse().with_context(|| format!("{name} = {value}"))
        };
        let node_rank = var("NODE_RANK").map_or(Ok(0), |v| number("NODE_RANK", v))?;
        let world_size = var("WORLD_SIZE").map_or(Ok(nproc), |v| number("WORLD_SIZE", v))?;
        if world_size % nproc != 0 || world_size == 0 {
            bail!("WORLD_SIZE = {world_size}: not a multiple of --nproc-per-node ({nproc})");
        }
        if node_rank >= world_size / nproc {
            bail!(
                "NODE_RANK = {node_rank}: WORLD_SIZE {world_size} / {nproc} per node makes {} nodes",
                world_size / nproc
            );
        }
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let master_port = match var("MASTER_PORT") {
            Some(p) => p.trim().parse().with_context(|| format!("MASTER_PORT = {p}"))?,
            None if world_size == nproc => {
                kart_http::port::free_port().context("a MASTER_PORT for a run on one node")?
            }
            None => bail!("MASTER_PORT is required when the run spans several nodes"),
        };
        Ok(Layout { nproc, node_rank, world_size, master_addr, master_port })
    }
}

/// Starts `nproc` children running `kart` with `args` and `threads` CPU threads each (default:
/// `OMP_NUM_THREADS`, else an equal share of the cores), supervises them, and returns the run's
/// exit code (0 when every child succeeded).
pub fn run(nproc: NprocPerNode, args: Vec<OsString>, threads: Option<usize>) -> anyhow::Result<u8> {
    let layout = Layout::from_env(nproc)?;
    let exe = std::env::current_exe().context("the kart binary's path")?;
    let threads = match threads {
        Some(n) => n.to_string(),
        None => std::env::var("OMP_NUM_THREADS").ok().unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            (cores / layout.nproc).max(1).to_string()
        }),
    };
    tracing::info!(?layout, threads, "starting trainer ranks");
    tokio::runtime::Runtime::new()?.block_on(async move {
        let mut children = Vec::new();
        for local in 0..layout.nproc {
            let rank = layout.node_rank * layout.nproc + local;
            let mut command = Command::new(&exe);
            // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
            let child = command
                .args(&args)
                .env("OMP_NUM_THREADS", &threads)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("WORLD_SIZE", layout.world_size.to_string())
                .env("LOCAL_WORLD_SIZE", layout.nproc.to_string())
                .env("NODE_RANK", layout.node_rank.to_string())
                .env("MASTER_ADDR", &layout.master_addr)
                .env("MASTER_PORT", layout.master_port.to_string())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("start rank {rank}"))?;
            children.push((rank, child));
        }
        Ok(supervise(children).await)
    })
}

/// Waits for the children: the first failure (or a signal to the launcher) stops the others.
async fn supervise(children: Vec<(usize, Child)>) -> u8 {
    let pids: Vec<(usize, Option<u32>)> = children.iter().map(|(r, c)| (*r, c.id())).collect();
    let mut waits: FuturesUnordered<_> =
        children.into_iter().map(|(rank, mut child)| async move { (rank, child.wait().await) }).collect();
    let shutdown = kart_http::shutdown_signal();
    tokio::pin!(shutdown);
    let mut failure: Option<u8> = None;
    let mut stopping = false;
    loop {
        tokio::select! {
            next = waits.next() => {
                let Some((rank, status)) = next else { break };
                let code = match status {
                    Ok(s) => exit_code(s),
                    Err(e) => {
                        tracing::error!(rank, error = %e, "waiting for a rank failed");
                        1
                    }
                };
                if code != 0 && failure.is_none() {
                    if !stopping {
                        tracing::error!(rank, code, "a rank failed; stopping the others");
                    }
                    failure = Some(code);
                    stop(&pids, Some(GRACE));
                }
            }
            () = &mut shutdown, if !stopping => {
                stopping = true;
                stop(&pids, None);
            }
        }
    }
    failure.unwrap_or(0)
}

/// Sends SIGTERM to the children still running, and SIGKILL to those still there after
/// `kill_after` (none: they stop in their own time).
fn stop(pids: &[(usize, Option<u32>)], kill_after: Option<Duration>) {
    let pids: Vec<i32> = pids.iter().filter_map(|(_, p)| p.and_then(|p| i32::try_from(p).ok())).collect();
    for &pid in &pids {
        // SAFETY: a signal to a child of this process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let Some(grace) = kill_after else { return };
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        for pid in pids {
            // SAFETY: as above; a child already reaped makes this fail harmlessly.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
}

/// A child's exit code; a signal `n` counts as 128 + n, as a shell reports it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nproc_per_node_is_auto_or_a_positive_count() {
        assert_eq!("auto".parse::<NprocPerNode>(), Ok(NprocPerNode::Auto));
        assert_eq!("3".parse::<NprocPerNode>(), Ok(NprocPerNode::Count(3)));
        assert!("0".parse::<NprocPerNode>().unwrap_err().contains("`0`"));
        assert!("gpu".parse::<NprocPerNode>().is_err());
    }
}
