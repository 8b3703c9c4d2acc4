// The device guard: the current device, streams and events. Every stream is
// the device's one in-order queue; events are the core's.
#include "adapter.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <vector>

namespace torchtpu {
namespace {

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

}  // namespace
}  // namespace torchtpu
