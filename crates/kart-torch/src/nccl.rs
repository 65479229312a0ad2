//! A bare NCCL communicator opened the way vLLM's weight-transfer engine opens one
//! (`StatelessProcessGroup` + `PyNcclCommunicator`): rank 0 serves a `TCPStore`
//! ([`ProcessGroup::serve`](crate::ProcessGroup::serve)), draws NCCL's unique id and publishes it
//! under `broadcast_from/0/0` pickled as vLLM's `ncclUniqueId` (what
//! `StatelessProcessGroup.broadcast_obj` stores and the other ranks unpickle); every rank then
//! opens the communicator and takes part in one warm-up all-reduce. Tensors move with NCCL
//! broadcasts on the current CUDA stream. CUDA only: NCCL has no CPU transport.

use crate::ffi::{self, KartNccl};
use crate::group::{DistError, ServedStore, millis};
use std::ffi::{c_int, c_void};
use tch::{Device, Tensor};

/// NCCL's unique id: `ncclUniqueId.internal`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// The store key rank 0's first `broadcast_obj` uses.
pub const UNIQUE_ID_KEY: &str = "broadcast_from/0/0";

/// An NCCL communicator of which this process is rank 0.
pub struct NcclCommunicator {
    nccl: *mut KartNccl,
    world_size: usize,
    // Kept open while the communicator lives: vLLM's workers keep their store client.
    _store: ServedStore,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (not Sync).
unsafe impl Send for NcclCommunicator {}

impl NcclCommunicator {
    /// Opens the communicator as rank 0 of `served`'s ranks, on its CUDA device, once the
    /// others join (at most its timeout).
    pub fn open(served: ServedStore) -> Result<NcclCommunicator, DistError> {
        let (world_size, timeout) = (served.world_size(), served.timeout());
        let group = |message: String| DistError::Group {
            backend: crate::Backend::Nccl,
            rank: 0,
            world_size,
            message,
        };
        let Device::Cuda(device) = served.device() else {
            return Err(group("NCCL moves CUDA tensors: the device is the CPU".into()));
        };
        let mut id = [0u8; UNIQUE_ID_BYTES];
        // SAFETY: `id` has the length passed.
        ffi::check(unsafe { ffi::kart_nccl_unique_id(id.as_mut_ptr(), id.len()) }).map_err(group)?;
        served.set(UNIQUE_ID_KEY, &pickled_unique_id(&id))?;
        let mut nccl = std::ptr::null_mut();
        // SAFETY: valid arguments; on success the shim stores an owned communicator in `nccl`.
        ffi::check(unsafe {
            ffi::kart_nccl_init(
                id.as_ptr(),
                id.len(),
                world_size as c_int,
                0,
                device as c_int,
                millis(timeout),
                &mut nccl,
            )
        })
        .map_err(group)?;
        tracing::info!(world_size, device, "NCCL communicator opened");
        Ok(NcclCommunicator { nccl, world_size, _store: served })
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Sends `tensor` (contiguous, on the communicator's device) from this rank to every other.
    pub fn broadcast(&self, tensor: &mut Tensor) -> Result<(), DistError> {
        let raw = tensor.as_mut_ptr() as *mut c_void;
        // SAFETY: the communicator and the tensor are live for the call, which waits.
        ffi::check(unsafe { ffi::kart_nccl_broadcast(self.nccl, raw, 0) })
            .map_err(|message| DistError::Collective { op: "ncclBroadcast", rank: 0, message })
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        // SAFETY: owned and released once.
        unsafe { ffi::kart_nccl_free(self.nccl) };
    }
}

/// `id` as `pickle.dumps` writes vLLM's `ncclUniqueId` (a ctypes structure, reduced to
/// `_ctypes._unpickle(cls, (__dict__, bytes))`), in protocol 3.
pub fn pickled_unique_id(id: &[u8; UNIQUE_ID_BYTES]) -> Vec<u8> {
    let mut out = b"\x80\x03c_ctypes\n_unpickle\n".to_vec();
    out.extend_from_slice(b"cvllm.distributed.device_communicators.pynccl_wrapper\nncclUniqueId\n");
    out.extend_from_slice(&[b'}', b'C', UNIQUE_ID_BYTES as u8]);
    out.extend_from_slice(id);
    out.extend_from_slice(b"\x86\x86R.");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The pickle loads, with Python's own `pickle`, as vLLM's `ncclUniqueId` holding the id.
    #[test]
    fn the_unique_id_unpickles_as_vllms_nccl_unique_id() {
        let id: [u8; UNIQUE_ID_BYTES] = std::array::from_fn(|i| (i * 7 % 256) as u8);
        let script = r#"
import ctypes, pickle, sys, types
path = "vllm.distributed.device_communicators.pynccl_wrapper"
for i in range(1, 5):
    sys.modules[".".join(path.split(".")[:i])] = types.ModuleType(path)
class ncclUniqueId(ctypes.Structure):  # vllm/distributed/device_communicators/pynccl_wrapper.py
    _fields_ = [("internal", ctypes.c_byte * 128)]
ncclUniqueId.__module__ = path
sys.modules[path].ncclUniqueId = ncclUniqueId
value = pickle.loads(sys.stdin.buffer.read())
assert type(value) is ncclUniqueId, type(value)
sys.stdout.buffer.write(bytes(value.internal))
"#;
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&pickled_unique_id(&id)).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout, id);
    }

    #[test]
    fn a_cpu_device_is_refused() {
        let served =
            crate::ProcessGroup::serve("127.0.0.1", 0, 2, Device::Cpu, Duration::from_secs(1)).unwrap();
        let err = NcclCommunicator::open(served).err().unwrap().to_string();
        assert!(err.contains("NCCL moves CUDA tensors"), "{err}");
    }
}
