// The tpu device as c10 sees it: allocator, device guard, hooks, generator.
// No operator semantics live here; storage lifetime and data belong to Rust.
#include "adapter.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <map>
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
  // Nothing is cached: a dropped buffer goes back to the plugin at once.
  void emptyCache(c10::MempoolId_t) override {}
  // Buffers outlive the programs that read them (see record_stream).
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    TtMemoryStats s{};
    check(tt_memory_stats(device, &s));
    c10::CachingDeviceAllocator::DeviceStats out;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& stats, const TtStat& from) {
      auto& stat = stats[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      stat.current = from.current;
      stat.peak = from.peak;
      stat.allocated = from.allocated;
      stat.freed = from.freed;
    };
    // Every live buffer is an allocation of its own, active and requested.
    for (auto* stats : {&out.allocation, &out.segment, &out.active}) fill(*stats, s.buffers);
    for (auto* stats : {&out.allocated_bytes, &out.active_bytes, &out.requested_bytes}) fill(*stats, s.bytes);
    fill(out.reserved_bytes, s.reserved);
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { tt_memory_reset_accumulated(device); }
  void resetPeakStats(c10::DeviceIndex device) override { tt_memory_reset_peak(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    int64_t free = 0, total = 0;
    check(tt_memory_info(device, &free, &total));
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }
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
  // Streams: every stream maps onto the device's one in-order queue, so work
  // on any stream is ordered after all work issued before it (what CUDA
  // code asks of streams and events, and more). Ids only tell streams apart.
  c10::Stream getStream(c10::Device d) const override {
    d = indexed(d);
    auto& ids = current_streams();
    return stream(d, d.index() < static_cast<c10::DeviceIndex>(ids.size()) ? ids[d.index()] : 0);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return stream(indexed(d), 0); }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return stream(indexed(d), next_stream_id++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    auto& ids = current_streams();
    if (s.device_index() >= static_cast<c10::DeviceIndex>(ids.size())) ids.resize(s.device_index() + 1, 0);
    ids[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    check(tt_synchronize(index));
  }
  void synchronizeStream(const c10::Stream& s) const override {
    synchronizeDevice(s.device_index());
  }
  bool queryStream(const c10::Stream&) const override {
    uint8_t idle = 0;
    check(tt_idle(&idle));
    return idle;
  }

  // Events mark all work issued before them (see events in ffi.h).
  void record(void** event, const c10::Stream& s, c10::DeviceIndex device,
              c10::EventFlag flag) const override {
    TORCH_CHECK(device == -1 || device == s.device_index(), "Event device index ", static_cast<int>(device),
                " does not match recording stream's device index ", static_cast<int>(s.device_index()), ".");
    void* recorded = nullptr;
    check(tt_event_record(flag == c10::EventFlag::BACKEND_DEFAULT, &recorded));
    if (*event) tt_event_destroy(*event);
    *event = recorded;
  }
  // The queue is in order: work issued after this already waits for the event.
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* event) const override { return event == nullptr || tt_event_query(event); }
  void synchronizeEvent(void* event) const override {
    if (event) check(tt_event_synchronize(event));
  }
  double elapsedTime(void* start, void* end, c10::DeviceIndex /*device*/) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    double ms = 0;
    check(tt_event_elapsed_ms(start, end, &ms));
    return ms;
  }
  void destroyEvent(void* event, c10::DeviceIndex /*device*/) const noexcept override {
    if (event) tt_event_destroy(event);
  }

 private:
  static c10::Stream stream(c10::Device d, c10::StreamId id) { return c10::Stream(c10::Stream::UNSAFE, d, id); }
  static c10::Device indexed(c10::Device d) { return d.has_index() ? d : c10::Device(kType, current_device); }
  static std::vector<c10::StreamId>& current_streams() {
    thread_local std::vector<c10::StreamId> ids;
    return ids;
  }
  static inline std::atomic<c10::StreamId> next_stream_id{1};
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

// ---------------------------------------------------------------- pinned host memory

// Host memory for `pin_memory()` and DataLoader(pin_memory=True): registered
// with the plugin for direct transfers (page-locked on GPUs; the CPU plugin
// reads host memory as it is) and known to `is_pinned()`.
struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::Device host(c10::DeviceType::CPU);
    if (nbytes == 0) return {nullptr, nullptr, &release, host};
    void* data = c10::alloc_cpu(nbytes);
    int status = tt_host_pin(data, nbytes);
    if (status != TT_OK) {
      c10::free_cpu(data);
      check(status);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      live[data] = nbytes;
    }
    return {data, data, &release, host};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static bool contains(const void* p) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = live.upper_bound(p);
    if (it == live.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
  }

 private:
  static void release(void* data) {
    if (!data) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      live.erase(data);
    }
    tt_host_unpin(data);  // a deleter cannot throw; unmapping fails only for unknown memory
    c10::free_cpu(data);
  }
  static inline std::mutex mutex;
  static inline std::map<const void*, size_t> live;
};

PinnedAllocator pinned_allocator;

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
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::contains(data); }
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
