//! The memory tensors took at most: on a CUDA device from PyTorch's caching allocator (what
//! `torch.cuda.max_memory_allocated` reads), on the CPU from a counting allocator placed in front
//! of PyTorch's CPU allocator. The figure to put beside a step time; unlike the process's resident
//! memory, it leaves out what the C allocator keeps after tensors are freed.

use crate::ffi;
use std::ffi::c_int;

/// The most bytes of tensors held at once on CUDA device `index` since the last reset; with
/// `reset`, starts a new measurement. An error without CUDA support or for a device that is not
/// there.
pub fn cuda_peak(index: usize, reset: bool) -> Result<u64, String> {
    let mut peak = 0u64;
    let index = c_int::try_from(index).map_err(|e| e.to_string())?;
    // SAFETY: plain values in, one u64 written on success.
    ffi::check(unsafe { ffi::kart_torch_cuda_peak_memory(index, reset, &mut peak) })?;
    Ok(peak)
}

/// The most bytes of CPU tensors alive at once since the last reset; with `reset`, starts a new
/// measurement from the bytes alive now. The first call starts the counting: tensors allocated
/// before it are not counted.
pub fn cpu_peak(reset: bool) -> u64 {
    let mut peak = 0u64;
    // SAFETY: one u64 written.
    let error = unsafe { ffi::kart_torch_cpu_peak_memory(reset, &mut peak) };
    if let Err(message) = ffi::check(error) {
        unreachable!("reading a counter cannot fail: {message}");
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_is_an_error_not_a_crash() {
        let gpus = tch::Cuda::device_count() as usize;
        assert!(cuda_peak(gpus + 7, false).is_err());
        if gpus > 0 {
            let before = cuda_peak(0, true).unwrap();
            let _t = tch::Tensor::zeros([1 << 20], (tch::Kind::Float, tch::Device::Cuda(0)));
            assert!(cuda_peak(0, false).unwrap() >= (4 << 20), "peak after reset from {before}");
        }
    }
}
