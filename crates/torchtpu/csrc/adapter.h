// Shared declarations of the C++ adapter (device.cpp, dispatch.cpp).
#pragma once
#include "ffi.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <optional>

namespace torchtpu {

// Throws the PyTorch exception matching a core status (no-op on TT_OK).
void check(int status);
c10::DeviceIndex device_count();
c10::Allocator* tpu_allocator();
// 64 random bits from `gen`, or from the device's default tpu generator.
uint64_t draw_seed(const std::optional<at::Generator>& gen, c10::DeviceIndex device);
// Moves a storage to a new allocation of nbytes, keeping its contents.
void resize_storage(const c10::Storage& storage, size_t nbytes);
// The marshalled form of a tensor argument (a tpu view or a CPU tensor).
TtTensor describe(const at::Tensor& t);
// A tpu storage owning the core's storage handle of a result.
c10::Storage adopt_storage(const TtResult& r);

}  // namespace torchtpu
