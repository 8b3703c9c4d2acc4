// The tpu device as c10 sees it: allocator, device guard, hooks, generator.
// No operator semantics live here; storage lifetime and data belong to Rust.
#include "adapter.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <mutex>
#include <vector>

namespace torchtpu {

void check(int status) {
  if (status == TT_OK) return;
  std::string msg = tt_last_error();
  switch (status) {
    case TT_ERR_VALUE: TORCH_CHECK_VALUE(false, msg);
    case TT_ERR_INDEX: TORCH_CHECK_INDEX(false, msg);
    case TT_ERR_TYPE: TORCH_CHECK_TYPE(false, msg);
    case TT_ERR_NOT_IMPLEMENTED: TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case TT_ERR_LINALG: TORCH_CHECK_LINALG(false, msg);
    default: TORCH_CHECK(false, msg);
  }
}

c10::DeviceIndex device_count() {
  int32_t n = 0;
  // deviceCount() must never throw: an unusable plugin reads as no device.
  return tt_device_count(&n) == TT_OK ? static_cast<c10::DeviceIndex>(n) : 0;
}

namespace {

thread_local c10::DeviceIndex current_device = 0;

void check_index(c10::DeviceIndex index) {
  auto n = device_count();
  TORCH_CHECK(index >= 0 && index < n, "Invalid device index ", static_cast<int>(index),
              ": torchtpu has ", static_cast<int>(n), " device(s)");
}

// ---------------------------------------------------------------- allocator

struct Allocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device device(c10::DeviceType::PrivateUse1, current_device);
    if (nbytes == 0) return {nullptr, nullptr, &tt_storage_release, device};
    void* storage = nullptr;
    uint64_t addr = 0;
    check(tt_storage_new(static_cast<int64_t>(nbytes), current_device, &storage, &addr));
    return {reinterpret_cast<void*>(addr), storage, &tt_storage_release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu memory is not host-addressable; copy tensors with copy_()");
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    return {};
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex) override {}
};

Allocator allocator;

// ---------------------------------------------------------------- guard

struct Guard final : c10::impl::DeviceGuardImplInterface {
  static constexpr auto kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, current_device}; }
  void setDevice(c10::Device d) const override {
    if (d.index() == current_device) return;  // every op's guard lands here
    check_index(d.index());
    current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    check(tt_synchronize(index));
  }
  void synchronizeStream(const c10::Stream& s) const override {
    synchronizeDevice(s.device_index());
  }
  bool queryStream(const c10::Stream&) const override { return true; }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// ---------------------------------------------------------------- generator

// A CPU-style generator (mt19937 state, seed, get/set_state) tagged with the
// tpu device: ops draw 64-bit seeds from it and XLA expands them on device.
struct Generator : at::CPUGeneratorImpl {
  explicit Generator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

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

// ---------------------------------------------------------------- hooks

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_index(d);
    current_device = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<Generator>(index < 0 ? current_device : index);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return {c10::DeviceType::PrivateUse1, current_device};
  }
  // Host memory needs no pinning for PJRT's transfers: `pin_memory()` and
  // non_blocking copies to the host (which allocate "pinned" results) use
  // ordinary CPU memory.
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage(storage, nbytes);
  }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

}  // namespace

c10::Allocator* tpu_allocator() { return &allocator; }

uint64_t draw_seed(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  auto generator = gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK(generator.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'tpu' device type for generator but found '",
              generator.device().type(), "'");
  auto* impl = generator.get<Generator>();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return impl->random64();
}

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  auto device = storage.device();
  c10::DataPtr fresh;
  if (nbytes == 0 || impl->data_ptr().get_context() == nullptr) {
    const c10::DeviceGuard guard(device);
    fresh = allocator.allocate(nbytes);
  } else {
    void* handle = nullptr;
    uint64_t addr = 0;
    check(tt_storage_resize(impl->data_ptr().get_context(), static_cast<int64_t>(nbytes),
                            &handle, &addr));
    fresh = {reinterpret_cast<void*>(addr), handle, &tt_storage_release, device};
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

}  // namespace torchtpu

extern "C" uint64_t tt_adapter_default_seed(int32_t device) {
  return torchtpu::draw_seed(std::nullopt, static_cast<c10::DeviceIndex>(device));
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, torchtpu::tpu_allocator());
