// PyTorch's float32 matmul setting, read for the core at each call that
// builds float32 dots or convolutions (DESIGN §10). A tpu follows it as CUDA
// does: "highest" (PyTorch's default) full float32, "high" or TF32 allowed
// (`allow_tf32`, `fp32_precision = "tf32"`) TF32-class, "medium" one
// bfloat16 pass. Read through the per-backend settings, never through
// float32MatmulPrecision(), which throws when a script sets them directly.
#include "adapter.h"

#include <ATen/Context.h>

namespace {

using at::Float32Backend;
using at::Float32Op;
using at::Float32Precision;

// The setting of `op` on `backend`, inherited from the backend's and then
// the generic one while unset.
Float32Precision resolved(Float32Backend backend, Float32Op op) {
  auto& context = at::globalContext();
  for (auto [b, o] : {std::pair{backend, op}, {backend, Float32Op::ALL}, {Float32Backend::GENERIC, Float32Op::ALL}}) {
    auto p = context.float32Precision(b, o);
    if (p == Float32Precision::IEEE || p == Float32Precision::TF32 || p == Float32Precision::BF16) return p;
  }
  return Float32Precision::IEEE;
}

}  // namespace

extern "C" int32_t tt_adapter_f32_precision() {
  // "medium" shows only in the CPU backend's (oneDNN) matmul setting.
  if (resolved(Float32Backend::MKLDNN, Float32Op::MATMUL) == Float32Precision::BF16) return TT_PRECISION_DEFAULT;
  return resolved(Float32Backend::CUDA, Float32Op::MATMUL) == Float32Precision::TF32 ? TT_PRECISION_HIGH
                                                                                       : TT_PRECISION_HIGHEST;
}
