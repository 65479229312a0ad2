// The C interface of kart's shim over PyTorch's C++ runtime: what tch does not expose.
//
// Every call that can fail returns NULL on success or an error message allocated with malloc,
// which the caller releases with kart_torch_free_string. No C++ exception crosses this interface.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kart_store kart_store;
typedef struct kart_group kart_group;
typedef struct kart_work kart_work;
typedef struct kart_nccl kart_nccl;
// An at::Tensor*, as tch's torch-sys hands them out.
typedef void* kart_tensor;

// What the runtime has: torch's version, CUDA hooks, NCCL's version ("" when not built).
const char* kart_torch_version(void);
bool kart_torch_cuda_hooks_registered(void);
int kart_torch_cuda_device_count(void);
char* kart_torch_cuda_device(int index, char** name, uint64_t* total_memory);
char* kart_torch_cuda_peak_memory(int index, bool reset, uint64_t* peak);
/* The most bytes of CPU tensors alive at once since the last reset (counting starts with the
   first call: kart's allocator is installed in front of PyTorch's then). */
char* kart_torch_cpu_peak_memory(bool reset, uint64_t* peak);
char* kart_torch_nccl_version(char** version);
char* kart_torch_gloo_device(void);
void kart_torch_free_string(char* s);

// Drops the tensor's gradient (undefined again, its memory released).
char* kart_clear_grad(kart_tensor tensor);

/* oneDNN's CPU linear layer: `weight` (out, in) reordered once into the layout oneDNN's kernels
   read, then `input` (..., in) times it, plus `bias` (NULL: none). `out` receives a new tensor. */
char* kart_onednn_pack_linear(kart_tensor weight, kart_tensor* out);
char* kart_onednn_linear(kart_tensor input, kart_tensor packed, kart_tensor bias, kart_tensor* out);

// c10d's TCPStore: the server on rank 0, clients elsewhere.
/* A TCPStore: the server (port 0: a free one) or a client of it. With `wait_workers`, the server
   returns once `world_size` clients joined. `bound_port` receives the port it listens on. */
char* kart_store_tcp(const char* host, uint16_t port, bool is_server, int world_size,
                     bool wait_workers, int64_t timeout_ms, kart_store** out, uint16_t* bound_port);
/* The store's keys under `prefix` (c10d's PrefixStore: "prefix/key"). */
kart_store* kart_store_prefix(kart_store* store, const char* prefix);
/* Sets `key` to `len` bytes of `data`. */
char* kart_store_set(kart_store* store, const char* key, const uint8_t* data, size_t len);
void kart_store_free(kart_store* store);
/* Another handle on the same store. */
kart_store* kart_store_share(kart_store* store);

// Process groups over a store: Gloo (CPU tensors) or NCCL (CUDA tensors).
char* kart_group_gloo(kart_store* store, int rank, int world_size, int64_t timeout_ms,
                      kart_group** out);
char* kart_group_nccl(kart_store* store, int rank, int world_size, int64_t timeout_ms,
                      kart_group** out);
void kart_group_free(kart_group* group);
/* Another handle on the same backend. */
kart_group* kart_group_share(kart_group* group);

// Collectives: each starts one c10d operation and hands back its work; kart_work_wait waits
// (at most timeout_ms) and frees it. `op`: 0 sum, 1 max, 2 min (what Gloo and NCCL both
// reduce with).
char* kart_all_reduce(kart_group* group, kart_tensor tensor, int op, kart_work** out);
char* kart_broadcast(kart_group* group, kart_tensor tensor, int root, kart_work** out);
char* kart_all_gather(kart_group* group, kart_tensor output, kart_tensor input, kart_work** out);
char* kart_reduce_scatter(kart_group* group, kart_tensor output, kart_tensor input, int op,
                          kart_work** out);
char* kart_barrier(kart_group* group, kart_work** out);
char* kart_work_wait(kart_work* work, int64_t timeout_ms);
void kart_work_free(kart_work* work);

// A bare NCCL communicator (vLLM's PyNcclCommunicator's kind): rank 0 draws the unique id (`len`
// must be NCCL's 128 bytes), every rank opens the communicator on CUDA device `device` with it
// and takes part in a warm-up all-reduce of one float; broadcasts use the current CUDA stream.
// Each call gives up after timeout_ms.
char* kart_nccl_unique_id(uint8_t* out, size_t len);
char* kart_nccl_init(const uint8_t* id, size_t len, int world_size, int rank, int device,
                     int64_t timeout_ms, kart_nccl** out);
char* kart_nccl_broadcast(kart_nccl* nccl, kart_tensor tensor, int root);
void kart_nccl_free(kart_nccl* nccl);

#ifdef __cplusplus
}
#endif
