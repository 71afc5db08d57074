// Device utilization (NVML's utilization.gpu, what torch.cuda.utilization reads).
//
// Note [Busy time]
// A device is busy while at least one of its streams' workers runs a kernel,
// copy or memset (not an event record or wait: those only order work). The
// runtime keeps, per device, the recent busy intervals in a ring (adjacent ones
// merged when the gap is under kMergeNs, which bounds the ring's use at high
// task rates), and answers the share of the last second (kWindowNs) that they
// cover, as NVML reports the share of its sample period. Workers pay a mutex
// per task start and end, on the device's own lock.
#include "internal.h"

#include <algorithm>
#include <array>
#include <memory>
#include <vector>
#include <mutex>

namespace vnpu::rt {
namespace {

constexpr int64_t kWindowNs = 1'000'000'000;
constexpr int64_t kMergeNs = 20'000;
constexpr size_t kRing = 8192;

struct BusyTracker {
  std::mutex mu;
  int running = 0;             // busy tasks executing now
  int64_t since_ns = 0;        // start of the current busy interval (running > 0)
  std::array<std::pair<int64_t, int64_t>, kRing> ring{};  // closed intervals [start, end), oldest overwritten
  size_t next = 0, count = 0;
};

BusyTracker& tracker(int device) {
  // One per visible device, made when a worker first runs (the devices are discovered by then).
  static const auto* trackers = [] {
    auto* v = new std::vector<std::unique_ptr<BusyTracker>>();
    for (size_t i = 0; i < devices().size(); ++i) v->push_back(std::make_unique<BusyTracker>());
    return v;
  }();
  return *(*trackers)[device];
}

bool counts(vnpuActivityKind kind) { return kind != vnpuActivityKindSync; }

}  // namespace

void busy_begin(int device, vnpuActivityKind kind) {
  if (!counts(kind)) return;
  BusyTracker& b = tracker(device);
  std::lock_guard<std::mutex> g(b.mu);
  if (b.running++ > 0) return;
  const int64_t now = activity_now_ns();
  if (b.count > 0) {  // a short gap after the previous interval: continue it
    auto& last = b.ring[(b.next + kRing - 1) % kRing];
    if (now - last.second < kMergeNs) {
      b.since_ns = last.first;
      b.next = (b.next + kRing - 1) % kRing;
      --b.count;
      return;
    }
  }
  b.since_ns = now;
}

void busy_end(int device, vnpuActivityKind kind) {
  if (!counts(kind)) return;
  BusyTracker& b = tracker(device);
  std::lock_guard<std::mutex> g(b.mu);
  if (--b.running > 0) return;
  b.ring[b.next] = {b.since_ns, activity_now_ns()};
  b.next = (b.next + 1) % kRing;
  b.count = std::min(b.count + 1, kRing);
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuError_t vnpuDeviceGetUtilization(int device, unsigned* percent) {
  if (percent == nullptr) return vnpuErrorInvalidValue;
  if (!valid_device(device)) return vnpuErrorInvalidDevice;
  BusyTracker& b = tracker(device);
  const int64_t now = activity_now_ns();
  const int64_t from = now - kWindowNs;
  int64_t busy = 0;
  {
    std::lock_guard<std::mutex> g(b.mu);
    for (size_t i = 0; i < b.count; ++i) {
      const auto& iv = b.ring[(b.next + kRing - 1 - i) % kRing];
      if (iv.second <= from) break;  // older ones end earlier still
      busy += iv.second - std::max(iv.first, from);
    }
    if (b.running > 0) busy += now - std::max(b.since_ns, from);
  }
  *percent = static_cast<unsigned>(std::min<int64_t>(100, (busy * 100 + kWindowNs / 2) / kWindowNs));
  return vnpuSuccess;
}
