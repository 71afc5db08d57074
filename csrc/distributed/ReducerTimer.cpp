// DDP's reducer times forward, backward compute and communication per
// iteration with a device Timer (c10d::TimerRegistry); CUDA registers one on
// CUDA events. Without one for vnpu, DDP warns "Time stats are currently only
// collected for CPU and CUDA devices" and reports no runtime statistics.
// This one records torch.Event-style device events on the current stream.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <optional>

namespace c10d::vnpu {
namespace {

class VNPUTimer final : public Timer {
 public:
  explicit VNPUTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // host timestamp
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::PrivateUse1);
    auto& ev = events_[static_cast<size_t>(event)];
    if (!ev) ev.emplace(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
    ev->record(impl.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto& a = events_[static_cast<size_t>(start)];
    auto& b = events_[static_cast<size_t>(end)];
    // Events never recorded (no backward yet, no_sync iterations): no measurement.
    if (!a || !b || !a->was_marked_for_recording() || !b->was_marked_for_recording()) return std::nullopt;
    // Called at the start of an iteration, when the previous one's work is (nearly) done.
    a->synchronize();
    b->synchronize();
    double ms = a->elapsedTime(*b);
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Device device_;
  std::array<std::optional<c10::Event>, 5> events_;
};

}  // namespace

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, VNPUTimer)

}  // namespace c10d::vnpu
