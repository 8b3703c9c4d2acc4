// Nested tensors (torch.nested's strided layout) on tpu: PyTorch's
// NestedTensorImpl over a tpu buffer, its sizes, strides and offsets on the
// host. PyTorch registers its nested kernels per backend (NestedTensorCPU,
// NestedTensorCUDA), none for PrivateUse1, yet takes nested fast paths on
// PrivateUse1 devices: nn.TransformerEncoder in eval mode without grad packs
// a padded batch by its padding mask, runs its layers on the packed tokens
// and pads the result back.
//
// Views and metadata run PyTorch's own nested kernels on the tpu buffer
// (they only rearrange sizes, strides and offsets, so a view shares its
// base's storage as on CPU); moving a nested tensor between devices copies
// its buffer. Every other op runs PyTorch's nested CPU kernel through the
// counted fallback, with CPU's values: the packed sizes change with every
// batch's padding, so a program per batch would cost more than the copies.
#include "adapter.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_nested_view_from_buffer_native.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty_like_native.h>
#include <torch/library.h>

namespace torchtpu {
namespace {

constexpr c10::DispatchKey kNestedCpu = c10::DispatchKey::NestedTensorCPU;

// PyTorch's nested _to_copy takes the buffer, which a non-contiguous nested
// tensor (a transpose's result) does not have; copying its whole storage
// keeps its strides and offsets, which is what the fallback's moves need.
at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                   std::optional<at::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<at::MemoryFormat> memory_format) {
  const auto* nt = at::native::get_nested_tensor_impl(self);
  if (at::native::nested_tensor_impl_is_contiguous(nt) || memory_format.value_or(c10::MemoryFormat::Preserve) !=
                                                              c10::MemoryFormat::Preserve) {
    return at::native::_to_copy_nested(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
  }
  auto storage = at::_to_copy(nt->get_unsafe_storage_as_tensor(), dtype, layout, device, pin_memory, non_blocking,
                              std::nullopt);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(storage, nt->get_nested_sizes().clone(),
                                                               nt->get_nested_strides().clone(),
                                                               nt->get_storage_offsets().clone());
}

void on_buffer(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(kNestedCpu), stack);
}

void on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check(tt_fallback(c10::toString(op.operator_name()).c_str()));
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true, kNestedCpu);
}

}  // namespace
}  // namespace torchtpu

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_to_copy", TORCH_FN(torchtpu::to_copy));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_nested));
  m.impl("copy_", TORCH_FN(at::native::copy_nested_));
  for (const char* name :
       {"alias", "detach", "values", "view", "unbind.int", "select.int", "narrow", "chunk", "split_with_sizes",
        "transpose.int", "squeeze", "squeeze.dim", "squeeze.dims", "unsqueeze", "is_same_size",
        "_nested_tensor_size", "_nested_tensor_strides", "_nested_tensor_storage_offsets"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&torchtpu::on_buffer>());
  }
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torchtpu::on_cpu>());
}

// A nested view of a dense tpu buffer (torch.nested's views are made of it).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_view_from_buffer", TORCH_FN(at::native::_nested_view_from_buffer));
}
