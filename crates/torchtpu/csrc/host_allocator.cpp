// The pinned host allocator: host memory for `pin_memory()` and
// DataLoader(pin_memory=True), registered with the plugin for direct
// transfers (page-locked on GPUs; the CPU plugin reads host memory as it is)
// and known to `is_pinned()`.
#include "adapter.h"

#include <c10/core/impl/alloc_cpu.h>

#include <map>
#include <mutex>

namespace torchtpu {
namespace {

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

PinnedAllocator allocator;

}  // namespace

c10::Allocator* pinned_allocator() { return &allocator; }

bool is_pinned(const void* data) { return PinnedAllocator::contains(data); }

}  // namespace torchtpu
