// What kart needs of autograd beyond tch: dropping a tensor's gradient (tch can only zero it).
#include "kart_torch.h"
#include "error.hpp"

#include <ATen/core/Tensor.h>

extern "C" {

char* kart_clear_grad(kart_tensor t) {
  return kart::guarded([&] { static_cast<at::Tensor*>(t)->mutable_grad().reset(); });
}

}  // extern "C"
