// DDP's timer for tpu (c10d's TimerRegistry). DDP's logger times the
// forward, backward and communication of sampled iterations through the
// device's timer and, finding none, warns in every process. Like CPU's, it
// keeps host timestamps: when the host issued the work (fused mode records
// it then; the device runs it later).
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace c10d {
namespace {

struct HostTimer : Timer {
  explicit HostTimer(c10::Device) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    int64_t from = getTimeRef(start), to = getTimeRef(end);
    if (from == kUnsetTime || to < from) return std::nullopt;
    return to - from;
  }
};

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, HostTimer);

}  // namespace
}  // namespace c10d
