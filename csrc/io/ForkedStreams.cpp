#include "ForkedStreams.h"

#include "../core/VNPUException.h"

namespace at::vnpu::io {

namespace {
void link(vnpuStream_t from, vnpuStream_t to) {  // `to` waits for the work queued on `from` so far
  vnpuEvent_t e = nullptr;
  VNPU_CHECK(vnpuEventCreateWithFlags(&e, vnpuEventDisableTiming));
  VNPU_CHECK(vnpuEventRecord(e, from));
  VNPU_CHECK(vnpuStreamWaitEvent(to, e, 0));
  VNPU_CHECK(vnpuEventDestroy(e));
}
}  // namespace

ForkedStreams::ForkedStreams(c10::vnpu::VNPUStream current, int count) : streams_{current} {
  for (int k = 1; k < count; ++k) {
    streams_.push_back(c10::vnpu::getStreamFromPool(false, current.device_index()));
    link(current.stream(), streams_.back().stream());
  }
}

const c10::vnpu::VNPUStream& ForkedStreams::next() { return streams_[next_++ % streams_.size()]; }

void ForkedStreams::join() {
  for (size_t k = 1; k < streams_.size(); ++k) link(streams_[k].stream(), streams_[0].stream());
}

}  // namespace at::vnpu::io
