#include "FileWrite.h"
#include "OutFile.h"

#include "../core/VNPUException.h"
#include "../core/VNPUHostAllocator.h"
#include "../core/VNPUStream.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

// Note [Staged file writes]
// What a device without direct storage access needs (a runtime whose
// vnpuMemcpyToFileAsync answers vnpuErrorNotSupported, or VNPU_FILE_WRITES=0;
// the direct path is Note [Checkpoint writes]): the device copies into pinned
// buffers and the host writes them out. Downloads run ahead of the writes by
// at most `slots` buffers, so host memory stays bounded by slots x chunk_bytes
// however large the checkpoint (a copy per tensor would hold each tensor's
// bytes in fresh, page-faulted host memory first). Consecutive small tensors
// share a buffer and one write. The buffers are the pinned buffers of vnpu's
// caching host allocator, reused across saves.

namespace at::vnpu::io {
namespace {

struct Pending {
  c10::DataPtr buf;
  size_t n;
  vnpuEvent_t done;  // null: host sources only, nothing to wait for
  std::string what;
};

}  // namespace

void writeFromDeviceStaged(const std::string& path, const std::string& header, const std::vector<Source>& sources,
                           size_t chunk_bytes, int slots, const std::function<void(uint64_t)>& progress) {
  TORCH_CHECK_VALUE(chunk_bytes > 0 && slots > 0, "staged write: chunk_bytes and slots must be positive");
  OutFile out(path);
  out.pwrite(header.data(), header.size(), 0, "the header");
  at::HostAllocator* host = at::vnpu::getVNPUHostAllocator();
  std::deque<Pending> in_flight;
  uint64_t total = 0, staged = 0, written = 0;
  for (const Source& s : sources) total += s.nbytes;
  auto write_oldest = [&] {
    Pending& p = in_flight.front();
    if (p.done != nullptr) {
      VNPU_CHECK(vnpuEventSynchronize(p.done));
      VNPU_CHECK(vnpuEventDestroy(p.done));
      p.done = nullptr;
    }
    out.pwrite(static_cast<const char*>(p.buf.get()), p.n, header.size() + written, p.what);
    written += p.n;
    in_flight.pop_front();  // the buffer goes back to the host allocator
    if (progress) progress(written);
  };
  try {
    size_t i = 0;
    uint64_t within = 0;  // bytes of sources[i] already staged
    while (i < sources.size()) {
      if (sources[i].nbytes == within) {
        ++i;
        within = 0;
        continue;
      }
      if (static_cast<int>(in_flight.size()) >= slots) write_oldest();
      const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, total - staged));
      Pending p{host->allocate(want), 0, nullptr, "tensor '" + sources[i].name + "'"};
      char* buf = static_cast<char*>(p.buf.get());
      std::vector<c10::DeviceIndex> used;
      while (i < sources.size() && p.n < want) {
        const Source& s = sources[i];
        const size_t n = static_cast<size_t>(std::min<uint64_t>(s.nbytes - within, want - p.n));
        const char* src = static_cast<const char*>(s.src) + within;
        if (s.device < 0) {
          std::memcpy(buf + p.n, src, n);
        } else {
          c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, s.device));
          vnpuStream_t stream = c10::vnpu::getCurrentVNPUStream(s.device).stream();
          VNPU_CHECK(vnpuMemcpyAsync(buf + p.n, src, n, vnpuMemcpyDeviceToHost, stream));
          if (std::find(used.begin(), used.end(), s.device) == used.end()) used.push_back(s.device);
        }
        p.n += n;
        staged += n;
        within += n;
        if (within == s.nbytes) {
          ++i;
          within = 0;
        }
      }
      if (!used.empty()) {
        // One event after the downloads: with several devices, their streams join on the last one's.
        vnpuStream_t last = c10::vnpu::getCurrentVNPUStream(used.back()).stream();
        for (size_t k = 0; k + 1 < used.size(); ++k) {
          vnpuEvent_t e = nullptr;
          VNPU_CHECK(vnpuEventCreateWithFlags(&e, vnpuEventDisableTiming));
          VNPU_CHECK(vnpuEventRecord(e, c10::vnpu::getCurrentVNPUStream(used[k]).stream()));
          VNPU_CHECK(vnpuStreamWaitEvent(last, e, 0));
          VNPU_CHECK(vnpuEventDestroy(e));
        }
        VNPU_CHECK(vnpuEventCreateWithFlags(&p.done, vnpuEventDisableTiming));
        VNPU_CHECK(vnpuEventRecord(p.done, last));
      }
      in_flight.push_back(std::move(p));
    }
    while (!in_flight.empty()) write_oldest();
  } catch (...) {
    // Downloads still queued write into buffers owned here: wait for them before the buffers are released.
    for (Pending& p : in_flight) {
      if (p.done != nullptr) {
        (void)vnpuEventSynchronize(p.done);
        (void)vnpuEventDestroy(p.done);
      }
    }
    throw;
  }
  out.commit();
}

}  // namespace at::vnpu::io
