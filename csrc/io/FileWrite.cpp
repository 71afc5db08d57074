#include "FileWrite.h"

#include "OutFile.h"

#include "../core/VNPUException.h"
#include "../core/VNPUStream.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>

// Note [Checkpoint writes]
// Each tensor's bytes go from its device memory straight into the file (the runtime's
// vnpuMemcpyToFileAsync, Note [File writes from device memory]): no pinned staging buffer and
// no second copy. The writes run on the current stream of each tensor's device, one at a time:
// writers of one file serialize on its inode lock, and a second one spins on it (measured: 3x
// slower on two cores). Consecutive small tensors
// share one batch (one event), so a model of many small tensors costs a syscall per tensor,
// not a synchronization. At most `slots` batches are queued ahead of the oldest unfinished
// one, which bounds what a Ctrl-C leaves to finish; each finished batch is checked.

namespace at::vnpu::io {
namespace {

struct Piece {
  std::shared_ptr<int64_t> wrote;  // bytes written, or -errno (the runtime writes it)
  uint64_t offset, nbytes;         // in the file
  const Source* source;
};

struct Batch {
  c10::DeviceIndex device = -1;
  vnpuStream_t stream = nullptr;
  vnpuEvent_t done = nullptr;  // recorded after the batch's writes
  uint64_t nbytes = 0;
  std::vector<Piece> pieces;
};

bool deviceFileWrites() {
  static const bool on = [] {
    const char* v = std::getenv("VNPU_FILE_WRITES");
    if (v != nullptr && std::string(v) == "0") return false;
    // Ask the runtime once: a driver without file writes answers vnpuErrorNotSupported.
    auto wrote = std::make_shared<int64_t>(0);
    return vnpuMemcpyToFileAsync(0, 0, nullptr, 0, wrote, nullptr) != vnpuErrorNotSupported;
  }();
  return on;
}

}  // namespace

void writeFromDevice(const std::string& path, const std::string& header, const std::vector<Source>& sources,
                     size_t chunk_bytes, int slots, const std::function<void(uint64_t)>& progress) {
  if (!deviceFileWrites()) {
    writeFromDeviceStaged(path, header, sources, chunk_bytes, slots, progress);
    return;
  }
  TORCH_CHECK_VALUE(chunk_bytes > 0 && slots > 0, "checkpoint write: chunk_bytes and slots must be positive");
  OutFile out(path);
  out.pwrite(header.data(), header.size(), 0, "the header");
  std::deque<Batch> in_flight;
  Batch open;  // writes queued, event not yet recorded
  uint64_t written = 0;
  auto report = [&](uint64_t n) {
    written += n;
    if (progress) progress(written);
  };
  auto finish_oldest = [&] {
    Batch b = std::move(in_flight.front());
    in_flight.pop_front();
    const vnpuError_t waited = vnpuEventSynchronize(b.done);
    VNPU_CHECK(vnpuEventDestroy(b.done));
    VNPU_CHECK(waited);
    for (const Piece& p : b.pieces) {
      const int64_t got = *p.wrote;
      TORCH_CHECK(got == static_cast<int64_t>(p.nbytes), "writing ", path, " (tensor '", p.source->name,
                  "') failed at byte ", p.offset, ": ", got < 0 ? std::strerror(static_cast<int>(-got)) : "short write");
    }
    report(b.nbytes);
  };
  auto close_open = [&] {
    if (open.pieces.empty()) return;
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, open.device));
    VNPU_CHECK(vnpuEventCreateWithFlags(&open.done, vnpuEventDisableTiming));
    const vnpuError_t recorded = vnpuEventRecord(open.done, open.stream);
    in_flight.push_back(std::move(open));
    open = Batch{};
    VNPU_CHECK(recorded);
  };
  try {
    uint64_t offset = header.size();
    for (const Source& s : sources) {
      if (s.device < 0) {  // host memory: written here, in order with nothing
        out.pwrite(static_cast<const char*>(s.src), s.nbytes, offset, "tensor '" + s.name + "'");
        offset += s.nbytes;
        report(s.nbytes);
        continue;
      }
      for (uint64_t off = 0; off < s.nbytes; off += chunk_bytes) {
        const uint64_t n = std::min<uint64_t>(chunk_bytes, s.nbytes - off);
        if (!open.pieces.empty() && (open.device != s.device || open.nbytes + n > chunk_bytes)) close_open();
        if (open.pieces.empty()) {
          if (static_cast<int>(in_flight.size()) >= slots) finish_oldest();
          open.device = s.device;
          open.stream = c10::vnpu::getCurrentVNPUStream(s.device).stream();
        }
        Piece p{std::make_shared<int64_t>(-1), offset + off, n, &s};
        VNPU_CHECK(vnpuMemcpyToFileAsync(out.fd(), p.offset, static_cast<const char*>(s.src) + off, n, p.wrote,
                                         open.stream));
        open.nbytes += n;
        open.pieces.push_back(std::move(p));
      }
      offset += s.nbytes;
    }
    close_open();
    while (!in_flight.empty()) finish_oldest();
  } catch (...) {
    // The writes still queued hold their own descriptor (of the temporary file, removed below) and result, and
    // run before anything queued later on their streams (freeing the tensors included).
    if (!open.pieces.empty()) in_flight.push_back(std::move(open));
    for (const Batch& b : in_flight) {
      if (b.done != nullptr) (void)vnpuEventDestroy(b.done);
    }
    throw;
  }
  out.commit();
}

}  // namespace at::vnpu::io
