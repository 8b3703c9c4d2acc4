// The operators of torch.distributed's transports (torchtpu/distributed.py):
// collectives as XLA programs over a group's devices (the core writes each
// result into its output tensor), and host memory for gloo to work in place.
#include "adapter.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace torchtpu {
namespace {

std::vector<TtTensor> describe_all(at::TensorList tensors) {
  std::vector<TtTensor> described;
  described.reserve(tensors.size());
  for (const auto& t : tensors) described.push_back(describe(t));
  return described;
}

void collective(c10::string_view kind, c10::string_view op, double scale, int64_t root, at::IntArrayRef pairs,
                at::IntArrayRef devices, at::TensorList inputs, at::TensorList outputs) {
  TORCH_CHECK(inputs.size() == outputs.size(), "torchtpu: a collective needs one output per input");
  const std::string k(kind), o(op);
  const auto ins = describe_all(inputs), outs = describe_all(outputs);
  check(tt_collective(k.c_str(), o.c_str(), scale, root, pairs.data(), static_cast<int64_t>(pairs.size()),
                      devices.data(), static_cast<int64_t>(devices.size()), ins.data(), outs.data(),
                      static_cast<int64_t>(ins.size())));
}

int64_t host_alias(const at::Tensor& self, c10::string_view access) {
  const TtTensor t = describe(self);
  const std::string a(access);
  uint64_t address = 0;
  check(tt_host_alias(&t, a.c_str(), &address));
  return static_cast<int64_t>(address);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("collective(str kind, str op, float scale, int root, int[] pairs, int[] devices, Tensor[] inputs, "
        "Tensor(a!)[] outputs) -> ()");
  m.impl("collective", c10::DispatchKey::PrivateUse1, TORCH_FN(collective));
  // The host address of a tpu tensor's elements for gloo to work on in place, or 0.
  m.def("host_alias(Tensor self, str access) -> int");
  m.impl("host_alias", c10::DispatchKey::PrivateUse1, TORCH_FN(host_alias));
}

}  // namespace torchtpu
