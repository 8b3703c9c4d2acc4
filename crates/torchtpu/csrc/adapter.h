// Declarations shared by the adapter's files, one per extension point.
#pragma once
#include "ffi.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <optional>

namespace torchtpu {

// device.cpp: the current device (per thread), the count, the core's errors.
extern thread_local constinit c10::DeviceIndex current_device;
// Throws the PyTorch exception matching a core status (no-op on TT_OK).
void check(int status);
c10::DeviceIndex device_count();
// Throws PyTorch's "Invalid device index" unless 0 <= index < device_count().
void check_index(c10::DeviceIndex index);

// allocator.cpp
c10::Allocator* tpu_allocator();
// Moves a storage to a new allocation of nbytes, keeping its contents.
void resize_storage(const c10::Storage& storage, size_t nbytes);

// host_allocator.cpp: pinned host memory.
c10::Allocator* pinned_allocator();
bool is_pinned(const void* data);

// generator.cpp
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// 64 random bits from `gen`, or from the device's default tpu generator.
uint64_t draw_seed(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

// dispatch.cpp
// The marshalled form of a tensor argument (a tpu view or a CPU tensor).
TtTensor describe(const at::Tensor& t);
// A tpu storage owning the core's storage handle of a result.
c10::Storage adopt_storage(const TtResult& r);

}  // namespace torchtpu
