// The tpu devices as the adapter's other parts see them: how many there are,
// which one is current (per thread, as CUDA's), and the core's errors raised
// as PyTorch's exceptions.
#include "adapter.h"

namespace torchtpu {

thread_local constinit c10::DeviceIndex current_device = 0;

void check(int status) {
  if (status == TT_OK) return;
  std::string msg = tt_last_error();
  switch (status) {
    case TT_ERR_VALUE: TORCH_CHECK_VALUE(false, msg);
    case TT_ERR_INDEX: TORCH_CHECK_INDEX(false, msg);
    case TT_ERR_TYPE: TORCH_CHECK_TYPE(false, msg);
    case TT_ERR_NOT_IMPLEMENTED: TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case TT_ERR_LINALG: TORCH_CHECK_LINALG(false, msg);
    case TT_ERR_OUT_OF_MEMORY: TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    default: TORCH_CHECK(false, msg);
  }
}

c10::DeviceIndex device_count() {
  int32_t n = 0;
  // deviceCount() must never throw: an unusable plugin reads as no device.
  return tt_device_count(&n) == TT_OK ? static_cast<c10::DeviceIndex>(n) : 0;
}

void check_index(c10::DeviceIndex index) {
  auto n = device_count();
  TORCH_CHECK(index >= 0 && index < n, "Invalid device index ", static_cast<int>(index),
              ": torchtpu has ", static_cast<int>(n), " device(s)");
}

}  // namespace torchtpu
