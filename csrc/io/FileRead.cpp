#include "FileRead.h"

#include "../core/VNPUException.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <cstdlib>
#include <memory>
#include <string>

// Note [Checkpoint reads]
// Each tensor's bytes go from the file straight into its device memory (the runtime's
// vnpuMemcpyFromFileAsync, Note [File reads into device memory]): no host copy of the
// checkpoint, so host memory does not grow with the file. Chunks alternate between the
// current stream and pool streams forked from it (joined back at the end), so several
// reads run at once; the vNPU's memory is paged in on first write, and the workers share
// that too. At most `slots` chunks are queued ahead of the oldest unfinished one, which
// bounds how much a Ctrl-C (raised from the progress callback) leaves to finish, and each
// finished chunk is checked (a short read names the file and the tensor).

namespace at::vnpu::io {

ReadOnlyFile::ReadOnlyFile(const std::string& path, int open_fd) {
  fd = open_fd >= 0 ? ::fcntl(open_fd, F_DUPFD_CLOEXEC, 0) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    TORCH_CHECK(false, "cannot open ", path, ": ", std::strerror(errno));
  }
#ifdef POSIX_FADV_SEQUENTIAL
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd >= 0) ::close(fd);
}

namespace {

struct Chunk {
  vnpuEvent_t done = nullptr;      // recorded after the read
  std::shared_ptr<int64_t> got;    // bytes read, or -errno (the runtime writes it)
  uint64_t offset = 0, nbytes = 0;  // in the file
  const Segment* segment = nullptr;
};

bool deviceFileReads() {
  static const bool on = [] {
    const char* v = std::getenv("VNPU_FILE_READS");
    if (v != nullptr && std::string(v) == "0") return false;
    // Ask the runtime once: a driver without file reads answers vnpuErrorNotSupported.
    auto got = std::make_shared<int64_t>(0);
    return vnpuMemcpyFromFileAsync(nullptr, 0, 0, 0, got, nullptr) != vnpuErrorNotSupported;
  }();
  return on;
}

}  // namespace

void readIntoDevice(const std::string& path, std::vector<Segment> segments, size_t chunk_bytes, int slots,
                    c10::vnpu::VNPUStream current, int upload_streams,
                    const std::function<void(uint64_t)>& progress, int fd) {
  if (!deviceFileReads()) {
    readIntoDeviceStaged(path, std::move(segments), chunk_bytes, slots, current, upload_streams, progress, fd);
    return;
  }
  TORCH_CHECK_VALUE(chunk_bytes > 0 && slots > 0 && upload_streams > 0,
                    "checkpoint read: chunk_bytes, slots and upload_streams must be positive");
  ReadOnlyFile file(path, fd);
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.file_offset < b.file_offset; });
  // A read of less than one chunk per stream (one tensor of a few MiB, as from_pretrained and torch.load ask
  // for) is split over the streams all the same (4 KiB multiples, at least 64 KiB each): every stream works on it.
  uint64_t total = 0;
  for (const Segment& s : segments) total += s.nbytes;
  const uint64_t per_stream = (total + upload_streams - 1) / upload_streams;
  if (per_stream < chunk_bytes) chunk_bytes = std::max<uint64_t>(64 << 10, (per_stream + 4095) / 4096 * 4096);
  // Reads alternate between the current stream and pool streams forked from it and joined back at the end, so
  // that work queued on the current stream afterwards is ordered after every read.
  ForkedStreams streams(current, upload_streams);
  std::deque<Chunk> in_flight;
  uint64_t read_so_far = 0;
  auto finish_oldest = [&] {
    Chunk c = in_flight.front();
    in_flight.pop_front();
    const vnpuError_t waited = vnpuEventSynchronize(c.done);
    VNPU_CHECK(vnpuEventDestroy(c.done));
    VNPU_CHECK(waited);
    const int64_t got = *c.got;
    if (got < 0) {
      TORCH_CHECK(false, "reading ", path, " (tensor '", c.segment->name, "') failed at byte ", c.offset, ": ",
                  std::strerror(static_cast<int>(-got)));
    }
    if (static_cast<uint64_t>(got) != c.nbytes) {
      TORCH_CHECK(false, path, " ended at byte ", c.offset + got, " while reading tensor '", c.segment->name,
                  "' (bytes ", c.segment->file_offset, "..", c.segment->file_offset + c.segment->nbytes,
                  "): the file is truncated or was changed while being read");
    }
    read_so_far += c.nbytes;
    if (progress) progress(read_so_far);
  };
  try {
    for (const Segment& s : segments) {
      for (uint64_t off = 0; off < s.nbytes; off += chunk_bytes) {
        if (static_cast<int>(in_flight.size()) >= slots) finish_oldest();
        Chunk c;
        c.offset = s.file_offset + off;
        c.nbytes = std::min<uint64_t>(chunk_bytes, s.nbytes - off);
        c.segment = &s;
        c.got = std::make_shared<int64_t>(-1);
        vnpuStream_t stream = streams.next().stream();
        VNPU_CHECK(vnpuMemcpyFromFileAsync(static_cast<char*>(s.dst) + off, file.fd, c.offset, c.nbytes, c.got,
                                           stream));
        VNPU_CHECK(vnpuEventCreateWithFlags(&c.done, vnpuEventDisableTiming));
        const vnpuError_t recorded = vnpuEventRecord(c.done, stream);
        in_flight.push_back(c);
        VNPU_CHECK(recorded);
      }
    }
    while (!in_flight.empty()) finish_oldest();
  } catch (...) {
    // The reads still queued hold their own file descriptor and result; the caller frees the destinations in
    // the current stream's order, after them.
    for (const Chunk& c : in_flight) (void)vnpuEventDestroy(c.done);
    streams.join();
    throw;
  }
  streams.join();
}

}  // namespace at::vnpu::io
