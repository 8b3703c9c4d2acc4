// The tpu generators: where ops draw their 64-bit seeds.
#include "adapter.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>

#include <map>
#include <mutex>
#include <optional>
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

// Seeds set before the default generators exist: making them needs the
// device count, which starts the runtime, and seeding must not (a
// distributed group must start it first on GPUs; a launcher picks the CPU
// plugin's device count after `seed_everything`). As CUDA defers seeds until
// its initialisation, they are applied when the generators are made.
std::mutex deferred_mutex;
bool generators_made = false;
std::optional<uint64_t> deferred_all;
std::map<c10::DeviceIndex, uint64_t> deferred_one;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> gens;
    std::lock_guard<std::mutex> lock(deferred_mutex);
    for (c10::DeviceIndex i = 0; i < std::max<c10::DeviceIndex>(device_count(), 1); ++i) {
      gens.push_back(at::make_generator<Generator>(i));
      auto one = deferred_one.find(i);
      if (one != deferred_one.end()) {
        gens.back().set_current_seed(one->second);
      } else if (deferred_all) {
        gens.back().set_current_seed(*deferred_all);
      } else {
        gens.back().seed();
      }
    }
    generators_made = true;
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

// Keeps `seed` for tpu:`device` (-1: every device; -2: this thread's
// current one, read without starting the runtime) until the default
// generators are made; false if they already are.
extern "C" bool tt_seed_when_made(int32_t device, uint64_t seed) {
  std::lock_guard<std::mutex> lock(torchtpu::deferred_mutex);
  if (torchtpu::generators_made) return false;
  if (device == -2) device = torchtpu::current_device;
  if (device < 0) {
    torchtpu::deferred_all = seed;
    torchtpu::deferred_one.clear();
  } else {
    torchtpu::deferred_one[static_cast<c10::DeviceIndex>(device)] = seed;
  }
  return true;
}

// tpu:`device`'s default generator as a torch.Generator (a new reference),
// for torch.tpu.manual_seed and friends on every torch (2.11 has no
// torch._C._accelerator_getDefaultGenerator); null with a Python error set.
extern "C" void* tt_default_generator(int32_t device) {
  HANDLE_TH_ERRORS
  return THPGenerator_initDefaultGenerator(torchtpu::default_generator(static_cast<c10::DeviceIndex>(device)));
  END_HANDLE_TH_ERRORS
}
