// c10d's TCPStore rendezvous, Gloo and NCCL process groups, and the collectives training uses.
#include "kart_torch.h"
#include "error.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef KART_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

struct kart_store {
  c10::intrusive_ptr<c10d::Store> store;
};
struct kart_group {
  c10::intrusive_ptr<c10d::Backend> backend;
};
struct kart_work {
  c10::intrusive_ptr<c10d::Work> work;
};

namespace {

at::Tensor& tensor(kart_tensor t) { return *static_cast<at::Tensor*>(t); }

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0: return c10d::ReduceOp::SUM;
    case 1: return c10d::ReduceOp::MAX;
    case 2: return c10d::ReduceOp::MIN;
  }
  throw std::invalid_argument("unknown reduce op " + std::to_string(op));
}

void started(c10::intrusive_ptr<c10d::Work> work, kart_work** out) {
  *out = new kart_work{std::move(work)};
}

}  // namespace

extern "C" {

char* kart_store_tcp(const char* host, uint16_t port, bool is_server, int world_size,
                     bool wait_workers, int64_t timeout_ms, kart_store** out, uint16_t* bound_port) {
  return kart::guarded([&] {
    c10d::TCPStoreOptions options;
    options.port = port;
    options.isServer = is_server;
    options.numWorkers = world_size;
    options.waitWorkers = wait_workers;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    *bound_port = store->getPort();
    *out = new kart_store{store};
  });
}

kart_store* kart_store_prefix(kart_store* store, const char* prefix) {
  return new kart_store{c10::make_intrusive<c10d::PrefixStore>(prefix, store->store)};
}

char* kart_store_set(kart_store* store, const char* key, const uint8_t* data, size_t len) {
  return kart::guarded([&] { store->store->set(key, std::vector<uint8_t>(data, data + len)); });
}

void kart_store_free(kart_store* store) { delete store; }

kart_store* kart_store_share(kart_store* store) { return new kart_store{store->store}; }

char* kart_group_gloo(kart_store* store, int rank, int world_size, int64_t timeout_ms,
                      kart_group** out) {
  return kart::guarded([&] {
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store->store, rank, world_size, options);
    *out = new kart_group{backend};
  });
}

char* kart_group_nccl(kart_store* store, int rank, int world_size, int64_t timeout_ms,
                      kart_group** out) {
#ifdef KART_CUDA
  return kart::guarded([&] {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(timeout_ms);
    auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store->store, rank, world_size, options);
    *out = new kart_group{backend};
  });
#else
  (void)store, (void)rank, (void)world_size, (void)timeout_ms, (void)out;
  return kart::error("kart was built without NCCL (no CUDA headers at build time)");
#endif
}

void kart_group_free(kart_group* group) { delete group; }

kart_group* kart_group_share(kart_group* group) { return new kart_group{group->backend}; }

char* kart_all_reduce(kart_group* group, kart_tensor t, int op, kart_work** out) {
  return kart::guarded([&] {
    std::vector<at::Tensor> tensors{tensor(t)};
    c10d::AllreduceOptions options;
    options.reduceOp = reduce_op(op);
    started(group->backend->allreduce(tensors, options), out);
  });
}

char* kart_broadcast(kart_group* group, kart_tensor t, int root, kart_work** out) {
  return kart::guarded([&] {
    std::vector<at::Tensor> tensors{tensor(t)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    started(group->backend->broadcast(tensors, options), out);
  });
}

char* kart_all_gather(kart_group* group, kart_tensor output, kart_tensor input, kart_work** out) {
  return kart::guarded(
      [&] { started(group->backend->_allgather_base(tensor(output), tensor(input)), out); });
}

char* kart_reduce_scatter(kart_group* group, kart_tensor output, kart_tensor input, int op,
                          kart_work** out) {
  return kart::guarded([&] {
    c10d::ReduceScatterOptions options;
    options.reduceOp = reduce_op(op);
    started(group->backend->_reduce_scatter_base(tensor(output), tensor(input), options), out);
  });
}

char* kart_barrier(kart_group* group, kart_work** out) {
  return kart::guarded([&] { started(group->backend->barrier(), out); });
}

char* kart_work_wait(kart_work* work, int64_t timeout_ms) {
  char* error = kart::guarded([&] {
    if (!work->work->wait(std::chrono::milliseconds(timeout_ms))) {
      throw std::runtime_error("timed out after " + std::to_string(timeout_ms) + " ms");
    }
  });
  delete work;
  return error;
}

void kart_work_free(kart_work* work) { delete work; }

}  // extern "C"
