//! c10d process groups: a `TCPStore` rendezvous at rank 0, then Gloo (CPU tensors) or NCCL (CUDA
//! tensors), and the collectives training needs. Every call has a timeout; a peer that died or
//! hangs is an error here, not an abort or a hang.

use crate::Ranks;
use crate::ffi::{self, KartGroup, KartStore, KartWork};
use std::ffi::{CString, c_int, c_void};
use std::marker::PhantomData;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// A failed rendezvous or collective.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("rendezvous at {addr}:{port} (rank {rank} of {world_size}, timeout {timeout:?}): {message}")]
    Rendezvous { addr: String, port: u16, rank: usize, world_size: usize, timeout: Duration, message: String },
    #[error("{backend:?} process group (rank {rank} of {world_size}): {message}")]
    Group { backend: Backend, rank: usize, world_size: usize, message: String },
    #[error("{op} (rank {rank}): {message}")]
    Collective { op: &'static str, rank: usize, message: String },
}

/// Which c10d backend carries the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Gloo, for CPU tensors.
    Gloo,
    /// NCCL, for CUDA tensors.
    Nccl,
}

impl Backend {
    /// The backend for tensors on `device`: NCCL on a GPU, Gloo on the CPU.
    pub fn for_device(device: Device) -> Backend {
        if device.is_cuda() { Backend::Nccl } else { Backend::Gloo }
    }
}

/// How a reduction combines the ranks' tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    fn code(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        }
    }
}

/// The ranks of a run joined in one c10d process group.
pub struct ProcessGroup {
    group: *mut KartGroup,
    store: *mut KartStore,
    rank: usize,
    world_size: usize,
    backend: Backend,
    device: Device,
    timeout: Duration,
}

// SAFETY: c10d's stores and backends may be used from any thread; a ProcessGroup is used by one
// thread at a time (it is not Sync), so collectives are issued in one order.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the run `ranks` describe: rank 0 serves the store at `MASTER_ADDR:MASTER_PORT`,
    /// every rank waits (at most `timeout`) for the others, then opens the backend for `device`'s
    /// tensors. Collectives time out after `timeout` too.
    pub fn join(ranks: &Ranks, device: Device, timeout: Duration) -> Result<ProcessGroup, DistError> {
        let rendezvous = |message: String| DistError::Rendezvous {
            addr: ranks.master_addr.clone(),
            port: ranks.master_port,
            rank: ranks.rank,
            world_size: ranks.world_size,
            timeout,
            message,
        };
        let (store, _) = Store::tcp(
            &ranks.master_addr,
            ranks.master_port,
            ranks.is_leader(),
            ranks.world_size,
            true,
            timeout,
        )
        .map_err(rendezvous)?;
        ProcessGroup::open(store, ranks.rank, ranks.world_size, device, timeout)
    }

    /// Serves, as rank 0 of `world_size`, a store other programs join at `host:port` (0: a free
    /// port) to form a group with this process; it does not wait for them.
    pub fn serve(
        host: &str,
        port: u16,
        world_size: usize,
        device: Device,
        timeout: Duration,
    ) -> Result<ServedStore, DistError> {
        let (store, port) = Store::tcp(host, port, true, world_size, false, timeout).map_err(|message| {
            DistError::Rendezvous { addr: host.into(), port, rank: 0, world_size, timeout, message }
        })?;
        Ok(ServedStore { store, port, world_size, device, timeout })
    }

    /// Serves a group that other programs join by `name`, the way `torch.distributed` forms one
    /// from a `tcp://host:port` init method and a group name (SGLang's and verl's
    /// `init_custom_process_group`): the store of [`ProcessGroup::serve`], its keys under `name`,
    /// then `name/` and the backend's device type, as `_new_process_group_helper` prefixes them.
    /// The group opens with [`ServedStore::open`], once the others are told the port.
    pub fn serve_named(
        host: &str,
        port: u16,
        world_size: usize,
        name: &str,
        device: Device,
        timeout: Duration,
    ) -> Result<ServedStore, DistError> {
        let device_type = if device.is_cuda() { "cuda" } else { "cpu" };
        [name.to_string(), format!("{name}/"), format!("{device_type}/")]
            .iter()
            .try_fold(ProcessGroup::serve(host, port, world_size, device, timeout)?, |served, prefix| {
                served.prefixed(prefix)
            })
    }

    /// Opens the backend for `device`'s tensors over `store`; every rank waits (at most
    /// `timeout`) for the others.
    fn open(
        store: Store,
        rank: usize,
        world_size: usize,
        device: Device,
        timeout: Duration,
    ) -> Result<ProcessGroup, DistError> {
        let backend = Backend::for_device(device);
        let timeout_ms = millis(timeout);
        let mut group = std::ptr::null_mut();
        let (r, w) = (rank as c_int, world_size as c_int);
        // SAFETY: the store is live; on success the shim stores an owned group in `group`.
        ffi::check(unsafe {
            match backend {
                Backend::Gloo => ffi::kart_group_gloo(store.0, r, w, timeout_ms, &mut group),
                Backend::Nccl => ffi::kart_group_nccl(store.0, r, w, timeout_ms, &mut group),
            }
        })
        .map_err(|message| DistError::Group { backend, rank, world_size, message })?;
        tracing::info!(rank, world_size, ?backend, "process group joined");
        Ok(ProcessGroup { group, store: store.release(), rank, world_size, backend, device, timeout })
    }

    /// Another handle on the same group, for a part of the program that issues collectives of
    /// its own (a model's layer shards). The handles must be used from one thread, so that every
    /// rank issues its collectives in one order.
    pub fn share(&self) -> ProcessGroup {
        ProcessGroup {
            // SAFETY: both are live; the shim returns new owning handles on the same objects.
            group: unsafe { ffi::kart_group_share(self.group) },
            store: unsafe { ffi::kart_store_share(self.store) },
            ..*self
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The device this group's tensors live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Starts reducing `tensor` across the ranks in place.
    pub fn start_all_reduce<'t>(&self, tensor: &'t mut Tensor, op: ReduceOp) -> Result<Work<'t>, DistError> {
        let raw = tensor.as_mut_ptr() as *mut c_void;
        // SAFETY: `raw` is a live at::Tensor that the returned work borrows.
        self.started("all_reduce", |out| unsafe { ffi::kart_all_reduce(self.group, raw, op.code(), out) })
    }

    /// Reduces `tensor` across the ranks in place.
    pub fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        self.start_all_reduce(tensor, op)?.wait()
    }

    /// Overwrites `tensor` on every rank with rank `root`'s.
    pub fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        let raw = tensor.as_mut_ptr() as *mut c_void;
        // SAFETY: `raw` is a live at::Tensor borrowed until the wait.
        self.started("broadcast", |out| unsafe { ffi::kart_broadcast(self.group, raw, root as c_int, out) })?
            .wait()
    }

    /// Fills `output` (world size times `input`'s elements, rank order) with every rank's `input`.
    pub fn all_gather(&self, output: &mut Tensor, input: &Tensor) -> Result<(), DistError> {
        let (raw_out, raw_in) = (output.as_mut_ptr() as *mut c_void, input.as_ptr() as *mut c_void);
        // SAFETY: both tensors are live and borrowed until the wait; c10d only reads `input`.
        self.started("all_gather", |out| unsafe { ffi::kart_all_gather(self.group, raw_out, raw_in, out) })?
            .wait()
    }

    /// Reduces `input` (world size chunks) across the ranks and leaves this rank's chunk in
    /// `output`.
    pub fn reduce_scatter(&self, output: &mut Tensor, input: &Tensor, op: ReduceOp) -> Result<(), DistError> {
        let (raw_out, raw_in) = (output.as_mut_ptr() as *mut c_void, input.as_ptr() as *mut c_void);
        // SAFETY: as in all_gather.
        self.started("reduce_scatter", |out| unsafe {
            ffi::kart_reduce_scatter(self.group, raw_out, raw_in, op.code(), out)
        })?
        .wait()
    }

    /// Waits until every rank reaches this call.
    pub fn barrier(&self) -> Result<(), DistError> {
        // SAFETY: the group is live.
        self.started("barrier", |out| unsafe { ffi::kart_barrier(self.group, out) })?.wait()
    }

    /// `root`'s bytes on every rank (`bytes` is read on `root` only).
    pub fn broadcast_bytes(&self, bytes: &[u8], root: usize) -> Result<Vec<u8>, DistError> {
        let mut len = Tensor::from_slice(&[bytes.len() as i64]).to_device(self.device);
        self.broadcast(&mut len, root)?;
        let len = len.int64_value(&[0]) as usize;
        let mut buffer = if self.rank == root {
            Tensor::from_slice(bytes).to_device(self.device)
        } else {
            Tensor::zeros([len as i64], (Kind::Uint8, self.device))
        };
        self.broadcast(&mut buffer, root)?;
        Vec::<u8>::try_from(buffer.to_device(Device::Cpu)).map_err(|e| DistError::Collective {
            op: "broadcast",
            rank: self.rank,
            message: e.to_string(),
        })
    }

    fn started<'t>(
        &self,
        op: &'static str,
        start: impl FnOnce(*mut *mut KartWork) -> *mut std::ffi::c_char,
    ) -> Result<Work<'t>, DistError> {
        let mut work = std::ptr::null_mut();
        ffi::check(start(&mut work)).map_err(|message| DistError::Collective {
            op,
            rank: self.rank,
            message,
        })?;
        Ok(Work { work, op, rank: self.rank, timeout: self.timeout, _tensor: PhantomData })
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("backend", &self.backend)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: both are owned here and released once, the group before its store.
        unsafe {
            ffi::kart_group_free(self.group);
            ffi::kart_store_free(self.store);
        }
    }
}

/// An owned c10d store handle.
struct Store(*mut KartStore);

// SAFETY: c10d stores may be used from any thread.
unsafe impl Send for Store {}

impl Store {
    /// A `TCPStore`, served here when `serve`; returns it with the port it uses.
    fn tcp(
        host: &str,
        port: u16,
        serve: bool,
        world_size: usize,
        wait_workers: bool,
        timeout: Duration,
    ) -> Result<(Store, u16), String> {
        let host = CString::new(host).map_err(|e| e.to_string())?;
        let (mut store, mut bound) = (std::ptr::null_mut(), 0u16);
        // SAFETY: valid arguments; on success the shim stores an owned store in `store`.
        ffi::check(unsafe {
            ffi::kart_store_tcp(
                host.as_ptr(),
                port,
                serve,
                world_size as c_int,
                wait_workers,
                millis(timeout),
                &mut store,
                &mut bound,
            )
        })?;
        Ok((Store(store), bound))
    }

    /// This store's keys under `prefix`.
    fn prefixed(self, prefix: &str) -> Result<Store, String> {
        let prefix = CString::new(prefix).map_err(|e| e.to_string())?;
        // SAFETY: the store is live; the prefix store holds its own reference to it.
        Ok(Store(unsafe { ffi::kart_store_prefix(self.0, prefix.as_ptr()) }))
    }

    /// The raw handle, no longer released here.
    fn release(self) -> *mut KartStore {
        std::mem::ManuallyDrop::new(self).0
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: owned and released once.
        unsafe { ffi::kart_store_free(self.0) };
    }
}

/// A store served by [`ProcessGroup::serve`], before the other ranks joined: what they join
/// through it is opened from here ([`ServedStore::open`], or
/// [`NcclCommunicator::open`](crate::NcclCommunicator::open)).
pub struct ServedStore {
    store: Store,
    port: u16,
    world_size: usize,
    device: Device,
    timeout: Duration,
}

impl ServedStore {
    /// The port the store listens on: what the other ranks are told.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The ranks, this one included.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The device of the tensors the group moves.
    pub fn device(&self) -> Device {
        self.device
    }

    /// How long to wait for the others, at the rendezvous and at each collective.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same store with its keys under `prefix` (c10d's `PrefixStore`).
    pub fn prefixed(self, prefix: &str) -> Result<ServedStore, DistError> {
        let (world_size, device) = (self.world_size, self.device);
        let store = self.store.prefixed(prefix).map_err(|message| DistError::Group {
            backend: Backend::for_device(device),
            rank: 0,
            world_size,
            message,
        })?;
        Ok(ServedStore { store, ..self })
    }

    /// Sets `key` to `value` in the store.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), DistError> {
        let rendezvous = |message: String| DistError::Rendezvous {
            addr: "the served store".into(),
            port: self.port,
            rank: 0,
            world_size: self.world_size,
            timeout: self.timeout,
            message,
        };
        let key = CString::new(key).map_err(|e| rendezvous(e.to_string()))?;
        // SAFETY: the store is live; the shim copies the bytes.
        ffi::check(unsafe { ffi::kart_store_set(self.store.0, key.as_ptr(), value.as_ptr(), value.len()) })
            .map_err(rendezvous)
    }

    /// Opens a c10d group of the backend for the device's tensors, as rank 0, once the other
    /// ranks join (at most the timeout).
    pub fn open(self) -> Result<ProcessGroup, DistError> {
        ProcessGroup::open(self.store, 0, self.world_size, self.device, self.timeout)
    }
}

/// A collective in flight; it borrows its tensors until it is waited on.
#[must_use = "a collective completes only when waited on"]
pub struct Work<'t> {
    work: *mut KartWork,
    op: &'static str,
    rank: usize,
    timeout: Duration,
    _tensor: PhantomData<&'t mut Tensor>,
}

impl Work<'_> {
    /// Waits for the collective (at most the group's timeout).
    pub fn wait(self) -> Result<(), DistError> {
        let (op, rank) = (self.op, self.rank);
        let work = std::mem::ManuallyDrop::new(self);
        // SAFETY: the work is owned; kart_work_wait releases it.
        ffi::check(unsafe { ffi::kart_work_wait(work.work, millis(work.timeout)) })
            .map_err(|message| DistError::Collective { op, rank, message })
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        // SAFETY: owned and released once (wait() does not run this).
        unsafe { ffi::kart_work_free(self.work) };
    }
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kart_testing::free_port;
    use std::thread;

    /// Runs `body` on `world` ranks (threads of this process, each with its own group).
    fn on_ranks<T: Send + 'static>(
        world: usize,
        body: impl Fn(ProcessGroup) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let port = free_port();
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let body = body.clone();
                thread::spawn(move || {
                    let ranks = Ranks::loopback(rank, world, port);
                    let group = ProcessGroup::join(&ranks, Device::Cpu, Duration::from_secs(120)).unwrap();
                    body(group)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn gloo_collectives_combine_every_rank() {
        let results = on_ranks(3, |g| {
            let r = g.rank() as f32;
            let mut sum = Tensor::from_slice(&[r, 10.0 * r]);
            g.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
            let mut max = Tensor::from_slice(&[r]);
            g.all_reduce(&mut max, ReduceOp::Max).unwrap();
            let mut root = Tensor::from_slice(&[r + 1.0]);
            g.broadcast(&mut root, 2).unwrap();
            let mut gathered = Tensor::zeros([6], (Kind::Float, Device::Cpu));
            g.all_gather(&mut gathered, &Tensor::from_slice(&[r, -r])).unwrap();
            let mut mine = Tensor::zeros([2], (Kind::Float, Device::Cpu));
            g.reduce_scatter(
                &mut mine,
                &Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]),
                ReduceOp::Sum,
            )
            .unwrap();
            let bytes = g.broadcast_bytes(if g.rank() == 1 { b"from rank 1" } else { b"" }, 1).unwrap();
            g.barrier().unwrap();
            let v = |t: &Tensor| Vec::<f32>::try_from(t).unwrap();
            (g.rank(), v(&sum), v(&max), v(&root), v(&gathered), v(&mine), bytes)
        });
        for (rank, sum, max, root, gathered, mine, bytes) in results {
            assert_eq!(sum, vec![3.0, 30.0]);
            assert_eq!(max, vec![2.0]);
            assert_eq!(root, vec![3.0]);
            assert_eq!(gathered, vec![0.0, 0.0, 1.0, -1.0, 2.0, -2.0]);
            let chunk = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
            assert_eq!(mine, vec![3.0 * chunk[2 * rank], 3.0 * chunk[2 * rank + 1]]);
            assert_eq!(bytes, b"from rank 1");
        }
    }

    /// A rank that leaves makes its peers' next collective fail within the timeout.
    #[test]
    fn a_missing_peer_is_an_error_not_a_hang() {
        let port = free_port();
        let ranks = move |rank| Ranks::loopback(rank, 2, port);
        let peer = thread::spawn(move || {
            let g = ProcessGroup::join(&ranks(1), Device::Cpu, Duration::from_secs(15)).unwrap();
            g.barrier().unwrap();
        });
        let g = ProcessGroup::join(&ranks(0), Device::Cpu, Duration::from_secs(15)).unwrap();
        g.barrier().unwrap();
        peer.join().unwrap();
        let started = std::time::Instant::now();
        let err = g.all_reduce(&mut Tensor::from_slice(&[1.0f32]), ReduceOp::Sum).unwrap_err().to_string();
        assert!(err.starts_with("all_reduce (rank 0): "), "{err}");
        assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
    }

    #[test]
    fn a_rendezvous_nobody_joins_times_out() {
        let ranks = Ranks { world_size: 2, master_port: free_port(), ..Ranks::single() };
        let err =
            ProcessGroup::join(&ranks, Device::Cpu, Duration::from_millis(500)).err().unwrap().to_string();
        let expected =
            format!("rendezvous at 127.0.0.1:{} (rank 0 of 2, timeout 500ms): ", ranks.master_port);
        assert!(err.starts_with(&expected), "{err}");
    }
}
