// The device allocator: a tpu storage's DataPtr holds the core's storage
// handle and a unique, never-dereferenced address (DESIGN §3); its statistics
// are the core's. No operator semantics live here.
#include "adapter.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>

namespace torchtpu {
namespace {

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

}  // namespace

c10::Allocator* tpu_allocator() { return &allocator; }

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

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, torchtpu::tpu_allocator());
