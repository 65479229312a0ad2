//! The shim's C interface (`shim/kart_torch.h`) and the conversion of its errors.

use std::ffi::{CStr, c_char, c_int, c_void};

#[repr(C)]
pub struct KartStore {
    _private: [u8; 0],
}
#[repr(C)]
pub struct KartGroup {
    _private: [u8; 0],
}
#[repr(C)]
pub struct KartWork {
    _private: [u8; 0],
}
#[repr(C)]
pub struct KartNccl {
    _private: [u8; 0],
}

unsafe extern "C" {
    pub fn kart_torch_free_string(s: *mut c_char);
    pub fn kart_clear_grad(tensor: *mut c_void) -> *mut c_char;
    pub fn kart_onednn_pack_linear(weight: *mut c_void, out: *mut *mut c_void) -> *mut c_char;
    pub fn kart_onednn_linear(
        input: *mut c_void,
        packed: *mut c_void,
        bias: *mut c_void,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    pub fn kart_torch_version() -> *const c_char;
    pub fn kart_torch_cuda_hooks_registered() -> bool;
    pub fn kart_torch_cuda_device_count() -> c_int;
    pub fn kart_torch_cuda_device(
        index: c_int,
        name: *mut *mut c_char,
        total_memory: *mut u64,
    ) -> *mut c_char;
    pub fn kart_torch_cuda_peak_memory(index: c_int, reset: bool, peak: *mut u64) -> *mut c_char;
    pub fn kart_torch_cpu_peak_memory(reset: bool, peak: *mut u64) -> *mut c_char;
    pub fn kart_torch_nccl_version(version: *mut *mut c_char) -> *mut c_char;
    pub fn kart_torch_gloo_device() -> *mut c_char;

    pub fn kart_store_tcp(
        host: *const c_char,
        port: u16,
        is_server: bool,
        world_size: c_int,
        wait_workers: bool,
        timeout_ms: i64,
        out: *mut *mut KartStore,
        bound_port: *mut u16,
    ) -> *mut c_char;
    pub fn kart_store_prefix(store: *mut KartStore, prefix: *const c_char) -> *mut KartStore;
    pub fn kart_store_set(
        store: *mut KartStore,
        key: *const c_char,
        data: *const u8,
        len: usize,
    ) -> *mut c_char;
    pub fn kart_store_free(store: *mut KartStore);
    pub fn kart_store_share(store: *mut KartStore) -> *mut KartStore;
    pub fn kart_group_gloo(
        store: *mut KartStore,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        out: *mut *mut KartGroup,
    ) -> *mut c_char;
    pub fn kart_group_nccl(
        store: *mut KartStore,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        out: *mut *mut KartGroup,
    ) -> *mut c_char;
    pub fn kart_group_free(group: *mut KartGroup);
    pub fn kart_group_share(group: *mut KartGroup) -> *mut KartGroup;

    pub fn kart_all_reduce(
        group: *mut KartGroup,
        tensor: *mut c_void,
        op: c_int,
        out: *mut *mut KartWork,
    ) -> *mut c_char;
    pub fn kart_broadcast(
        group: *mut KartGroup,
        tensor: *mut c_void,
        root: c_int,
        out: *mut *mut KartWork,
    ) -> *mut c_char;
    pub fn kart_all_gather(
        group: *mut KartGroup,
        output: *mut c_void,
        input: *mut c_void,
        out: *mut *mut KartWork,
    ) -> *mut c_char;
    pub fn kart_reduce_scatter(
        group: *mut KartGroup,
        output: *mut c_void,
        input: *mut c_void,
        op: c_int,
        out: *mut *mut KartWork,
    ) -> *mut c_char;
    pub fn kart_barrier(group: *mut KartGroup, out: *mut *mut KartWork) -> *mut c_char;
    pub fn kart_work_wait(work: *mut KartWork, timeout_ms: i64) -> *mut c_char;
    pub fn kart_work_free(work: *mut KartWork);

    pub fn kart_nccl_unique_id(out: *mut u8, len: usize) -> *mut c_char;
    pub fn kart_nccl_init(
        id: *const u8,
        len: usize,
        world_size: c_int,
        rank: c_int,
        device: c_int,
        timeout_ms: i64,
        out: *mut *mut KartNccl,
    ) -> *mut c_char;
    pub fn kart_nccl_broadcast(nccl: *mut KartNccl, tensor: *mut c_void, root: c_int) -> *mut c_char;
    pub fn kart_nccl_free(nccl: *mut KartNccl);
}

/// The shim's error (`NULL` is success), released.
pub fn check(error: *mut c_char) -> Result<(), String> {
    if error.is_null() {
        return Ok(());
    }
    Err(take_string(error))
}

/// A string the shim allocated, copied and released.
pub fn take_string(s: *mut c_char) -> String {
    // SAFETY: the shim hands out NUL-terminated strings from malloc, released here once.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    unsafe { kart_torch_free_string(s) };
    text
}
