// oneDNN's linear layer with weights reordered once: the operators PyTorch registers for
// Inductor's CPU inference (`mkldnn::_reorder_linear_weight`, `mkldnn::_linear_pointwise`),
// reached through the dispatcher since ATen's headers do not declare them.
#include "kart_torch.h"
#include "error.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

namespace {

// The registered operator `name`; throws when this torch was built without oneDNN.
c10::OperatorHandle op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// Runs the boxed operator on `stack` and hands its single tensor result to the caller.
kart_tensor call(const c10::OperatorHandle& handle, torch::jit::Stack& stack) {
  handle.callBoxed(stack);
  return new at::Tensor(std::move(stack.at(0)).toTensor());
}

}  // namespace

extern "C" {

char* kart_onednn_pack_linear(kart_tensor weight, kart_tensor* out) {
  return kart::guarded([&] {
    static const c10::OperatorHandle reorder = op("mkldnn::_reorder_linear_weight");
    torch::jit::Stack stack{*static_cast<at::Tensor*>(weight), c10::IValue()};
    *out = call(reorder, stack);
  });
}

char* kart_onednn_linear(kart_tensor input, kart_tensor packed, kart_tensor bias, kart_tensor* out) {
  return kart::guarded([&] {
    static const c10::OperatorHandle linear = op("mkldnn::_linear_pointwise");
    c10::IValue b = bias ? c10::IValue(*static_cast<at::Tensor*>(bias)) : c10::IValue();
    torch::jit::Stack stack{*static_cast<at::Tensor*>(input), *static_cast<at::Tensor*>(packed), std::move(b),
                            c10::IValue("none"), c10::IValue(c10::List<std::optional<at::Scalar>>()),
                            c10::IValue()};
    *out = call(linear, stack);
  });
}

}  // extern "C"
