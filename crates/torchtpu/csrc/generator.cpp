// The tpu generators: where ops draw their 64-bit seeds.
#include "adapter.h"

#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace torchtpu {
namespace {

// A counter-based generator, as CUDA's: its state is a seed and an offset
// (16 bytes, CUDA's layout), and each op draws Philox's output for the
// current offset (its subsequence), then moves the offset on. DTensor gives
// each shard of a random op its own stream by moving the offset of exactly
// this layout (`_PhiloxState`), and restores it after, as on CUDA.
struct Generator : c10::GeneratorImpl {
  explicit Generator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::empty({kStateSize}, at::TensorOptions().dtype(at::kByte));
    auto offset = static_cast<int64_t>(offset_);
    std::memcpy(state.data_ptr<uint8_t>(), &seed_, sizeof seed_);
    std::memcpy(state.data_ptr<uint8_t>() + sizeof seed_, &offset, sizeof offset);
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == at::kByte && state.numel() == kStateSize && state.is_contiguous() &&
                    state.device().is_cpu(),
                "RNG state must be a contiguous CPU torch.ByteTensor of ", kStateSize,
                " bytes (seed, offset), got ", state.numel());
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    int64_t offset = 0;
    std::memcpy(&seed_, bytes, sizeof seed_);
    std::memcpy(&offset, bytes + sizeof seed_, sizeof offset);
    offset_ = static_cast<uint64_t>(offset);
  }

  // The next op's 64-bit key (XLA expands it on the device).
  uint64_t next_key() {
    at::Philox4_32 philox(seed_, offset_);
    offset_ += kOffsetPerDraw;
    uint64_t high = philox();
    return (high << 32) | philox();
  }

 private:
  static constexpr int64_t kStateSize = 16;
  // CUDA moves its offset in multiples of 4 (one Philox block per thread).
  static constexpr uint64_t kOffsetPerDraw = 4;

  Generator* clone_impl() const override {
    auto* copy = new Generator(device_.index(), seed_);
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
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
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<Generator>()->next_key();
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
