// torch.distributed's collectives as XLA programs over a group's devices:
// the operator the c10d backend calls (torchtpu/distributed.py). The core
// writes each result into its output tensor.
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("collective(str kind, str op, float scale, int root, int[] pairs, int[] devices, Tensor[] inputs, "
        "Tensor(a!)[] outputs) -> ()");
  m.impl("collective", c10::DispatchKey::PrivateUse1, TORCH_FN(collective));
}

}  // namespace torchtpu
