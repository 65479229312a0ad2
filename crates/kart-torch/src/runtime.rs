//! What the loaded libtorch offers: the report `kart doctor` prints.

use crate::ffi;
use serde::Serialize;
use std::ffi::CStr;

/// The PyTorch runtime of this process.
#[derive(Debug, Clone, Serialize)]
pub struct Runtime {
    /// The version of the torch kart was built against (and loads).
    pub torch_version: String,
    pub cuda: CudaSupport,
    /// The CUDA devices this process sees.
    pub devices: Vec<CudaDevice>,
    /// NCCL's version, or why NCCL cannot be used.
    pub nccl: Availability,
    /// Whether Gloo can open a transport device.
    pub gloo: Availability,
}

/// Whether libtorch's CUDA half is in this process. `at::hasCUDA()` cannot tell: it is false on
/// a machine without a GPU even when CUDA support is loaded.
#[derive(Debug, Clone, Serialize)]
pub struct CudaSupport {
    /// `libtorch_cuda.so` is mapped into the process.
    pub library_mapped: bool,
    /// Its hooks are registered with ATen (what makes CUDA tensors work where a GPU is).
    pub hooks_registered: bool,
    /// Both: the binary can use GPUs where a driver and devices are.
    pub loaded: bool,
}

/// One visible CUDA device.
#[derive(Debug, Clone, Serialize)]
pub struct CudaDevice {
    pub index: usize,
    pub name: String,
    pub total_memory_bytes: u64,
}

/// Whether a communication backend can be used: a version or `true`, or the reason it cannot.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    Available(String),
    Unavailable(String),
}

impl Availability {
    /// Whether the backend can be used.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available(_))
    }
}

impl Runtime {
    /// Probes this process's libtorch.
    pub fn probe() -> Runtime {
        // SAFETY: a static NUL-terminated string.
        let torch_version =
            unsafe { CStr::from_ptr(ffi::kart_torch_version()) }.to_string_lossy().into_owned();
        let library_mapped = std::fs::read_to_string("/proc/self/maps")
            .is_ok_and(|maps| maps.lines().any(|l| l.contains("/libtorch_cuda.so")));
        // SAFETY: plain queries of ATen's hook registry.
        let hooks_registered = unsafe { ffi::kart_torch_cuda_hooks_registered() };
        let count = unsafe { ffi::kart_torch_cuda_device_count() }.max(0);
        let devices = (0..count).filter_map(device).collect();
        let mut version = std::ptr::null_mut();
        // SAFETY: on success the shim stores a string it allocated in `version`.
        let nccl = match ffi::check(unsafe { ffi::kart_torch_nccl_version(&mut version) }) {
            Ok(()) => Availability::Available(ffi::take_string(version)),
            Err(reason) => Availability::Unavailable(reason),
        };
        let gloo = match ffi::check(unsafe { ffi::kart_torch_gloo_device() }) {
            Ok(()) => Availability::Available("tcp".into()),
            Err(reason) => Availability::Unavailable(reason),
        };
        Runtime {
            torch_version,
            cuda: CudaSupport {
                library_mapped,
                hooks_registered,
                loaded: library_mapped && hooks_registered,
            },
            devices,
            nccl,
            gloo,
        }
    }
}

fn device(index: i32) -> Option<CudaDevice> {
    let (mut name, mut memory) = (std::ptr::null_mut(), 0u64);
    // SAFETY: on success the shim stores a string it allocated in `name`.
    match ffi::check(unsafe { ffi::kart_torch_cuda_device(index, &mut name, &mut memory) }) {
        Ok(()) => Some(CudaDevice {
            index: index as usize,
            name: ffi::take_string(name),
            total_memory_bytes: memory,
        }),
        Err(e) => {
            tracing::warn!(index, error = %e, "cannot read a CUDA device's properties");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CUDA wheel's libtorch_cuda is linked and registers its hooks on a machine without a
    /// GPU too; Gloo is always there.
    #[test]
    fn cuda_support_is_loaded_without_a_gpu() {
        let runtime = Runtime::probe();
        assert!(runtime.torch_version.starts_with("2."), "{runtime:?}");
        assert!(runtime.gloo.is_available(), "{runtime:?}");
        assert_eq!(runtime.devices.len(), tch::Cuda::device_count() as usize, "{runtime:?}");
        if torch_has_cuda() {
            assert!(runtime.cuda.loaded, "{runtime:?}");
            assert!(runtime.nccl.is_available(), "{runtime:?}");
        }
    }

    /// Whether the linked torch is a CUDA build (libtorch_cuda beside libtorch_cpu).
    fn torch_has_cuda() -> bool {
        std::fs::read_to_string("/proc/self/maps").is_ok_and(|maps| {
            maps.lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .filter(|p| p.ends_with("/libtorch_cpu.so"))
                .any(|p| std::path::Path::new(p).with_file_name("libtorch_cuda.so").exists())
        })
    }
}
