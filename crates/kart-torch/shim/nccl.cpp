// A bare NCCL communicator (no c10d process group), the kind vLLM's PyNcclCommunicator opens:
// rank 0 draws the unique id, the ranks meet through it, and broadcasts go on the current CUDA
// stream. Waits poll the stream and the communicator's error state up to a deadline, so a peer
// that never comes is an error (the communicator is then aborted), not a hang. NCCL's functions
// are those of the libnccl libtorch_cuda loaded, found at run time as PyNcclCommunicator finds
// them (kart links no NCCL of its own).
#include "kart_torch.h"
#include "error.hpp"

#ifdef KART_CUDA
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <stdexcept>
#include <thread>

struct kart_nccl {
  ncclComm_t comm;
  int device;
  int64_t timeout_ms;
};

namespace {

using Clock = std::chrono::steady_clock;

// The NCCL calls used here, from the loaded libnccl.
struct Nccl {
  decltype(&ncclGetErrorString) errorString;
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclCommInitRankConfig) commInitRankConfig;
  decltype(&ncclCommGetAsyncError) commGetAsyncError;
  decltype(&ncclCommAbort) commAbort;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclBroadcast) broadcast;
};

template <typename F>
F symbol(const char* name) {
  void* found = dlsym(RTLD_DEFAULT, name);
  if (found == nullptr) {
    throw std::runtime_error(std::string("no ") + name + " in the loaded libraries (libtorch_cuda's libnccl)");
  }
  return reinterpret_cast<F>(found);
}

const Nccl& nccl() {
  static const Nccl loaded{
      symbol<decltype(&ncclGetErrorString)>("ncclGetErrorString"),
      symbol<decltype(&ncclGetUniqueId)>("ncclGetUniqueId"),
      symbol<decltype(&ncclCommInitRankConfig)>("ncclCommInitRankConfig"),
      symbol<decltype(&ncclCommGetAsyncError)>("ncclCommGetAsyncError"),
      symbol<decltype(&ncclCommAbort)>("ncclCommAbort"),
      symbol<decltype(&ncclAllReduce)>("ncclAllReduce"),
      symbol<decltype(&ncclBroadcast)>("ncclBroadcast"),
  };
  return loaded;
}

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw std::runtime_error(std::string(what) + ": " + nccl().errorString(result));
  }
}

// Waits until the communicator's last call completed on the host (non-blocking init or enqueue).
void settle(ncclComm_t comm, Clock::time_point deadline, const char* what) {
  for (;;) {
    ncclResult_t state;
    check(nccl().commGetAsyncError(comm, &state), what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      throw std::runtime_error(std::string(what) + ": " + nccl().errorString(state));
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error(std::string(what) + ": the other ranks did not join in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Waits until `stream` drained: the collective reached every rank.
void drained(ncclComm_t comm, c10::Stream stream, Clock::time_point deadline, const char* what) {
  for (;;) {
    if (stream.query()) return;  // a CUDA error throws
    ncclResult_t state;
    check(nccl().commGetAsyncError(comm, &state), what);
    if (state != ncclSuccess && state != ncclInProgress) {
      throw std::runtime_error(std::string(what) + ": " + nccl().errorString(state));
    }
    if (Clock::now() > deadline) {
      throw std::runtime_error(std::string(what) + ": timed out waiting for the other ranks");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

ncclDataType_t data_type(at::ScalarType type) {
  switch (type) {
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kHalf: return ncclFloat16;
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    default: throw std::invalid_argument(std::string("NCCL cannot move ") + c10::toString(type));
  }
}

Clock::time_point deadline(int64_t timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

}  // namespace

extern "C" {

char* kart_nccl_unique_id(uint8_t* out, size_t len) {
  return kart::guarded([&] {
    if (len != sizeof(ncclUniqueId)) {
      throw std::invalid_argument("an NCCL unique id has " + std::to_string(sizeof(ncclUniqueId)) +
                                  " bytes, not " + std::to_string(len));
    }
    ncclUniqueId id;
    check(nccl().getUniqueId(&id), "ncclGetUniqueId");
    std::memcpy(out, id.internal, sizeof(id.internal));
  });
}

char* kart_nccl_init(const uint8_t* id_bytes, size_t len, int world_size, int rank, int device,
                     int64_t timeout_ms, kart_nccl** out) {
  return kart::guarded([&] {
    if (len != sizeof(ncclUniqueId)) throw std::invalid_argument("wrong NCCL unique id size");
    ncclUniqueId id;
    std::memcpy(id.internal, id_bytes, sizeof(id.internal));
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    auto until = deadline(timeout_ms);
    try {
      check(nccl().commInitRankConfig(&comm, world_size, id, rank, &config), "ncclCommInitRank");
      settle(comm, until, "ncclCommInitRank");
      // The warm-up PyNcclCommunicator makes every rank take part in: one float summed.
      auto data = at::zeros({1}, at::TensorOptions().device(at::kCUDA, device).dtype(at::kFloat));
      auto stream = c10::cuda::getCurrentCUDAStream(device);
      check(nccl().allReduce(data.data_ptr(), data.data_ptr(), 1, ncclFloat32, ncclSum, comm,
                             stream.stream()),
            "ncclAllReduce (warm-up)");
      settle(comm, until, "ncclAllReduce (warm-up)");
      drained(comm, stream.unwrap(), until, "ncclAllReduce (warm-up)");
    } catch (...) {
      if (comm != nullptr) nccl().commAbort(comm);
      throw;
    }
    *out = new kart_nccl{comm, device, timeout_ms};
  });
}

char* kart_nccl_broadcast(kart_nccl* self, kart_tensor t, int root) {
  return kart::guarded([&] {
    at::Tensor& tensor = *static_cast<at::Tensor*>(t);
    if (!tensor.is_cuda() || !tensor.is_contiguous()) {
      throw std::invalid_argument("NCCL broadcasts contiguous CUDA tensors");
    }
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(self->device));
    auto stream = c10::cuda::getCurrentCUDAStream(self->device);
    auto until = deadline(self->timeout_ms);
    check(nccl().broadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           data_type(tensor.scalar_type()), root, self->comm, stream.stream()),
          "ncclBroadcast");
    settle(self->comm, until, "ncclBroadcast");
    drained(self->comm, stream.unwrap(), until, "ncclBroadcast");
  });
}

void kart_nccl_free(kart_nccl* self) {
  // Aborting does not wait for peers that may be gone; nothing is in flight between calls.
  nccl().commAbort(self->comm);
  delete self;
}

}  // extern "C"

#else

extern "C" {

static char* without_nccl() {
  return kart::error("kart was built without NCCL (no CUDA headers at build time)");
}

char* kart_nccl_unique_id(uint8_t*, size_t) { return without_nccl(); }

char* kart_nccl_init(const uint8_t*, size_t, int, int, int, int64_t, kart_nccl**) {
  return without_nccl();
}

char* kart_nccl_broadcast(kart_nccl*, kart_tensor, int) { return without_nccl(); }

void kart_nccl_free(kart_nccl*) {}

}  // extern "C"

#endif
