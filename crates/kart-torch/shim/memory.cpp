// The most bytes of tensors held at once: on a CUDA device from PyTorch's caching allocator, on
// the CPU from a counting allocator kart installs in front of PyTorch's CPU allocator.
#include "kart_torch.h"
#include "error.hpp"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#ifdef KART_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace {

// Counts the bytes of the CPU tensors alive and their peak; the memory itself comes from the
// allocator it replaces. Its data pointers are their own contexts, as PyTorch's raw interface
// (`raw_allocate`, used by oneDNN's scratch buffers) requires: the inner allocation and its size
// are found again by address when the memory is freed.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // nothing allocated, nothing to count
    c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_.emplace(data, Block{std::move(inner), n});
    }
    auto now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    auto peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &CountingCpuAllocator::release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  uint64_t peak(bool reset) {
    auto peak = static_cast<uint64_t>(peak_.load());
    if (reset) peak_.store(current_.load());
    return peak;
  }

  static CountingCpuAllocator* instance;

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes = 0;
  };

  static void release(void* data) {
    auto* self = instance;
    Block block;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto found = self->blocks_.find(data);
      if (found == self->blocks_.end()) return;
      block = std::move(found->second);
      self->blocks_.erase(found);
    }
    self->current_.fetch_sub(static_cast<int64_t>(block.bytes));
    // `block.inner` frees the memory through the inner allocator's deleter on leaving scope.
  }

  c10::Allocator* inner_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

CountingCpuAllocator* CountingCpuAllocator::instance = nullptr;

CountingCpuAllocator* counting() {
  static std::once_flag once;
  std::call_once(once, [] {
    CountingCpuAllocator::instance = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(CountingCpuAllocator::instance, /*priority=*/1);
  });
  return CountingCpuAllocator::instance;
}

}  // namespace

extern "C" {

char* kart_torch_cpu_peak_memory(bool reset, uint64_t* peak) {
  return kart::guarded([&] { *peak = counting()->peak(reset); });
}

// The most bytes of tensors the caching allocator held on device `index` at once since the last
// reset, and a reset when asked.
char* kart_torch_cuda_peak_memory(int index, bool reset, uint64_t* peak) {
#ifdef KART_CUDA
  return kart::guarded([&] {
    auto device = static_cast<c10::DeviceIndex>(index);
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    *peak = static_cast<uint64_t>(
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
    if (reset) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  });
#else
  (void)index, (void)reset, (void)peak;
  return kart::error("kart was built without CUDA headers");
#endif
}

}  // extern "C"
