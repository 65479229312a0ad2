// What the loaded PyTorch runtime offers: its version, CUDA support, devices, NCCL and Gloo.
#include "kart_torch.h"
#include "error.hpp"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#ifdef KART_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif

extern "C" {

void kart_torch_free_string(char* s) { std::free(s); }

const char* kart_torch_version(void) { return TORCH_VERSION; }

// libtorch_cuda registers its CUDA hooks when it is loaded, GPU or not; without it the default
// interface answers "not built".
bool kart_torch_cuda_hooks_registered(void) {
  try {
    return at::detail::getCUDAHooks().isBuilt();
  } catch (...) {
    return false;
  }
}

int kart_torch_cuda_device_count(void) {
  try {
    return at::detail::getCUDAHooks().deviceCount();
  } catch (...) {
    return 0;
  }
}

char* kart_torch_cuda_device(int index, char** name, uint64_t* total_memory) {
#ifdef KART_CUDA
  return kart::guarded([&] {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);
    *name = kart::copy(prop->name);
    *total_memory = prop->totalGlobalMem;
  });
#else
  (void)index, (void)name, (void)total_memory;
  return kart::error("kart was built without CUDA headers");
#endif
}

char* kart_torch_nccl_version(char** version) {
#ifdef KART_CUDA
  return kart::guarded([&] { *version = kart::copy(c10d::getNcclVersion()); });
#else
  (void)version;
  return kart::error("kart was built without NCCL (no CUDA headers at build time)");
#endif
}

// Gloo is compiled into libtorch_cpu; it is usable when it can open a transport device (the
// gloo headers at build time are Debian's, so no gloo method is called from here).
char* kart_torch_gloo_device(void) {
  return kart::guarded([&] {
    if (!c10d::ProcessGroupGloo::createDefaultDevice()) throw std::runtime_error("no Gloo device");
  });
}

}  // extern "C"
