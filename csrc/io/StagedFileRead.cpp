#include "FileRead.h"

#include "../core/VNPUException.h"
#include "../core/VNPUHostAllocator.h"

#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

// Note [Staged file reads]
// What a device without direct storage access needs (a runtime whose vnpuMemcpyFromFileAsync answers
// vnpuErrorNotSupported, or VNPU_FILE_READS=0): the host reads the file
// into pinned buffers and the device copies from them. Reads and uploads overlap:
// while the stream uploads one buffer, the host reads the next; at most `slots`
// buffers are in flight (the host waits for the oldest upload before reusing
// its buffer), so host memory stays bounded by slots x chunk_bytes whatever the
// file size (plain reads, not mmap: the file's pages stay in the page cache,
// not in the process). Consecutive segments share a buffer, so many small
// tensors cost one read. Uploads alternate between the current stream and pool
// streams forked from it (joined back at the end): the vNPU's memory is paged in
// on first write, so a fresh destination costs more than the copy, and two
// workers share that. The buffers come from vnpu's caching host allocator:
// each is handed back with an event of its upload, so the call returns without
// waiting for the last uploads, and later loads reuse the buffers.

namespace at::vnpu::io {
namespace {

// Reads exactly n bytes at `offset` (retrying short reads and EINTR).
void readFully(const ReadOnlyFile& f, const std::string& path, const Segment& first, char* buf, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(f.fd, buf + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      TORCH_CHECK(false, "reading ", path, " (tensor '", first.name, "') failed at byte ", offset + done, ": ",
                  std::strerror(errno));
    }
    if (r == 0) {
      TORCH_CHECK(false, path, " ended at byte ", offset + done, " while reading tensor '", first.name,
                  "' (bytes ", first.file_offset, "..", first.file_offset + first.nbytes,
                  "): the file is truncated or was changed while being read");
    }
    done += static_cast<size_t>(r);
  }
}

}  // namespace

void readIntoDeviceStaged(const std::string& path, std::vector<Segment> segments, size_t chunk_bytes, int slots,
                          c10::vnpu::VNPUStream current, int upload_streams,
                          const std::function<void(uint64_t)>& progress, int fd) {
  TORCH_CHECK_VALUE(chunk_bytes > 0 && slots > 0 && upload_streams > 0,
                    "staged read: chunk_bytes, slots and upload_streams must be positive");
  ReadOnlyFile file(path, fd);
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.file_offset < b.file_offset; });
  at::HostAllocator* host = at::vnpu::getVNPUHostAllocator();
  // Uploads alternate between the current stream and pool streams forked from it and joined back at the end.
  ForkedStreams streams(current, upload_streams);
  uint64_t read_so_far = 0;
  std::deque<vnpuEvent_t> in_flight;  // one event per buffer whose upload may still run
  auto release_oldest = [&] {
    VNPU_CHECK(vnpuEventSynchronize(in_flight.front()));
    VNPU_CHECK(vnpuEventDestroy(in_flight.front()));
    in_flight.pop_front();
  };
  try {
    size_t i = 0;
    uint64_t within = 0;  // bytes of segments[i] already read
    while (i < segments.size()) {
      if (segments[i].nbytes == within) {  // empty tensor, or finished
        ++i;
        within = 0;
        continue;
      }
      // One buffer: the rest of segment i, then following segments while they are contiguous and fit.
      struct Piece { void* dst; size_t off, n; };
      std::vector<Piece> pieces;
      const uint64_t start = segments[i].file_offset + within;
      const Segment& first = segments[i];
      size_t filled = 0;
      while (i < segments.size() && filled < chunk_bytes) {
        const Segment& s = segments[i];
        if (s.file_offset + within != start + filled) break;  // a gap: next buffer
        const size_t n = static_cast<size_t>(std::min<uint64_t>(s.nbytes - within, chunk_bytes - filled));
        if (n > 0) pieces.push_back({static_cast<char*>(s.dst) + within, filled, n});
        filled += n;
        within += n;
        if (within == s.nbytes) {
          ++i;
          within = 0;
        }
      }
      if (filled == 0) continue;
      if (static_cast<int>(in_flight.size()) >= slots) release_oldest();
      const c10::vnpu::VNPUStream& upload = streams.next();
      vnpuStream_t stream = upload.stream();
      c10::DataPtr buf = host->allocate(filled);
      readFully(file, path, first, static_cast<char*>(buf.get()), filled, start);
      for (const Piece& p : pieces) {
        VNPU_CHECK(vnpuMemcpyAsync(p.dst, static_cast<char*>(buf.get()) + p.off, p.n, vnpuMemcpyHostToDevice,
                                   stream));
      }
      // The buffer goes back to the allocator now; it is reused only after the uploads above ran.
      host->record_event(buf.get(), buf.get_context(), upload.unwrap());
      vnpuEvent_t done = nullptr;
      VNPU_CHECK(vnpuEventCreateWithFlags(&done, vnpuEventDisableTiming));
      VNPU_CHECK(vnpuEventRecord(done, stream));
      in_flight.push_back(done);
      read_so_far += filled;
      if (progress) progress(read_so_far);
    }
  } catch (...) {
    for (vnpuEvent_t e : in_flight) (void)vnpuEventDestroy(e);
    streams.join();  // the caller frees the destinations in the current stream's order: after these uploads
    throw;
  }
  for (vnpuEvent_t e : in_flight) VNPU_CHECK(vnpuEventDestroy(e));
  streams.join();
}

}  // namespace at::vnpu::io
