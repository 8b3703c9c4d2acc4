// The tpu generators: where ops draw their 64-bit seeds.
#include "adapter.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>

#include <mutex>
#include <vector>

namespace torchtpu {
namespace {

// A CPU-style generator (mt19937 state, seed, get/set_state) tagged with the
// tpu device: ops draw 64-bit seeds from it and XLA expands them on device.
struct Generator : at::CPUGeneratorImpl {
  explicit Generator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> gens;
    for (c10::DeviceIndex i = 0; i < std::max<c10::DeviceIndex>(device_count(), 1); ++i) {
      gens.push_back(at::make_generator<Generator>(i));
      gens.back().seed();
    }
    return gens;
  }();
  if (index < 0) index = current_device;
  check_index(index);
  return generators[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<Generator>(index < 0 ? current_device : index);
}

uint64_t draw_seed(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  auto generator = gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK(generator.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'tpu' device type for generator but found '",
              generator.device().type(), "'");
  auto* impl = generator.get<Generator>();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return impl->random64();
}

}  // namespace torchtpu

extern "C" uint64_t tt_adapter_default_seed(int32_t device) {
  return torchtpu::draw_seed(std::nullopt, static_cast<c10::DeviceIndex>(device));
}

// tpu:`device`'s default generator as a torch.Generator (a new reference),
// for torch.tpu.manual_seed and friends on every torch (2.11 has no
// torch._C._accelerator_getDefaultGenerator); null with a Python error set.
extern "C" void* tt_default_generator(int32_t device) {
  HANDLE_TH_ERRORS
  return THPGenerator_initDefaultGenerator(torchtpu::default_generator(static_cast<c10::DeviceIndex>(device)));
  END_HANDLE_TH_ERRORS
}
