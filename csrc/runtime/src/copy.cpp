// Copies and memset as stream tasks.
#include "internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

using namespace vnpu::rt;

namespace {

bool kind_ok(void* dst, const void* src, vnpuMemcpyKind kind) {
  bool dst_dev = device_of(dst) >= 0, src_dev = device_of(src) >= 0;
  switch (kind) {
    case vnpuMemcpyHostToHost: return !dst_dev && !src_dev;
    case vnpuMemcpyHostToDevice: return dst_dev && !src_dev;
    case vnpuMemcpyDeviceToHost: return !dst_dev && src_dev;
    case vnpuMemcpyDeviceToDevice: return dst_dev && src_dev;
  }
  return false;
}

// After a copy's host wait: a race that wait found (a rewritten pinned upload
// source, Note [Pinned uploads]) or one pending since an earlier call is raised
// here, before the caller reads what it copied (.item(), .cpu()), as a
// synchronize raises it.
vnpuError_t after_host_wait(vnpuStream_st* s, const char* name) {
  if (san::on()) {
    san::host_waited();
    if (vnpuError_t e = san::report_host_access(s, name); e != vnpuSuccess) return e;
  }
  return take_device_error(s->device);
}

vnpuError_t finish(vnpuStream_st* s, bool wait) {
  if (!wait && !launch_blocking()) return vnpuSuccess;
  // Only a synchronous copy orders the host (Note [Launch blocking and the sanitizer]).
  if (!s->wait_idle(/*interruptible=*/true, /*orders_host=*/wait)) return vnpuErrorInterrupted;
  return take_device_error(s->device);
}

// A copy into pageable host memory whose waiting caller may give up (Note
// [Interruptible waits]): the caller then owns its buffer again, so the task
// must not write it any more. The worker copies under the lock; the caller
// marks the copy abandoned under it, waiting at most for a copy in progress.
struct PendingHostCopy {
  std::mutex mu;  // guards abandoned; held by the worker while it copies
  bool abandoned = false;
};

}  // namespace

vnpuError_t vnpuMemcpyAsync(void* dst, const void* src, size_t count, vnpuMemcpyKind kind,
                            vnpuStream_t stream) {
  if (count == 0) return vnpuSuccess;
  if (dst == nullptr || src == nullptr || !kind_ok(dst, src, kind)) return vnpuErrorInvalidValue;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (auto c = capture_of(s)) {  // See Note [Stream capture] (graph.cpp)
    if (kind == vnpuMemcpyHostToDevice && !is_pinned(src)) {
      return refuse_on_capture(*c, vnpuErrorStreamCaptureUnsupported,
                               "vnpuMemcpyAsync from pageable host memory into the capturing stream (the source "
                               "would be read now, not at each replay): create or fill the device tensor before "
                               "the capture begins, and change its contents between replays");
    }
    if (kind == vnpuMemcpyDeviceToHost && !is_pinned(dst)) {
      return refuse_on_capture(*c, vnpuErrorStreamCaptureUnsupported,
                               "vnpuMemcpyAsync from the capturing stream into pageable host memory (a host read: "
                               ".cpu(), .item(), .tolist(), printing a tensor); read the results after the "
                               "capture ends, or after replay()");
    }
  }
  if (san::on()) {  // the copy declares its device ranges (Note [Sanitizer ranges])
    vnpuMemAccess acc[2];
    size_t n = 0;
    if (kind == vnpuMemcpyDeviceToHost || kind == vnpuMemcpyDeviceToDevice) acc[n++] = {src, count, 0};
    if (kind == vnpuMemcpyHostToDevice || kind == vnpuMemcpyDeviceToDevice) acc[n++] = {dst, count, 1};
    const char* name = kind == vnpuMemcpyDeviceToHost ? "memcpy DtoH"
                       : kind == vnpuMemcpyDeviceToDevice ? "memcpy DtoD"
                       : kind == vnpuMemcpyHostToDevice ? "memcpy HtoD"
                                                          : "memcpy HtoH";
    if (vnpuError_t e = san::report_host_access(s, name); e != vnpuSuccess) return e;
    if (vnpuError_t e = san::begin_task(s, name, acc, n); e != vnpuSuccess) return e;
  }
  TaskInfo info{vnpuActivityKindMemcpy, count, kind};
  if (recording()) {  // Note [Activity records]: nothing more when no profiler is on
    info.host_pinned = (kind == vnpuMemcpyHostToDevice && is_pinned(src)) ||
                       (kind == vnpuMemcpyDeviceToHost && is_pinned(dst));
    info.src_device = device_of(src);
    info.dst_device = device_of(dst);
  }
  if (kind == vnpuMemcpyHostToDevice && !is_pinned(src)) {
    // Stage pageable memory now so the caller may reuse its buffer at once.
    std::shared_ptr<char> staged(static_cast<char*>(std::malloc(count)), std::free);
    if (!staged) return vnpuErrorMemoryAllocation;
    std::memcpy(staged.get(), src, count);
    s->submit("memcpy HtoD", [dst, staged, count] { std::memcpy(dst, staged.get(), count); }, nullptr, info);
  } else if (kind == vnpuMemcpyDeviceToHost && !is_pinned(dst)) {
    auto pending = std::make_shared<PendingHostCopy>();
    s->submit("memcpy DtoH", [dst, src, count, pending] {
      std::lock_guard<std::mutex> g(pending->mu);
      if (!pending->abandoned) std::memmove(dst, src, count);
    }, nullptr, info);
    if (!s->wait_idle(/*interruptible=*/true)) {
      std::lock_guard<std::mutex> g(pending->mu);
      pending->abandoned = true;
      return vnpuErrorInterrupted;
    }
    return after_host_wait(s, "memcpy DtoH");
  } else {
    const char* name = kind == vnpuMemcpyDeviceToHost ? "memcpy DtoH"
                       : kind == vnpuMemcpyDeviceToDevice ? "memcpy DtoD"
                       : kind == vnpuMemcpyHostToDevice ? "memcpy HtoD"
                                                          : "memcpy HtoH";
    if (kind == vnpuMemcpyDeviceToHost && san::on() && !launch_blocking()) {
      // Note [Deferred host copies]; not over the source of an upload still queued (Note [Pinned buffers both ways]).
      if (capture_of(s) || san::note_download(s, dst, count)) std::memset(dst, 0xFF, count);
      // A captured copy runs at each replay, after the capture's host waits: no gate.
      const san::Gate gate = capture_of(s) ? san::Gate{} : san::gate_ticket(s);
      return finish_submission(s, s->submit(name, [dst, src, count, gate] {
        san::wait_gate(gate);
        std::memmove(dst, src, count);
      }, nullptr, info));
    }
    if (kind == vnpuMemcpyHostToDevice && san::on() && !launch_blocking()) {
      if (auto c = capture_of(s)) {  // checked per replay (vnpuGraphLaunch)
        std::lock_guard<std::mutex> nl(c->nodes_mu);
        c->san_uploads.emplace_back(src, count);
      } else {
        auto ran = san::note_upload(s, src, count);  // Note [Pinned uploads]
        return finish_submission(s, s->submit(name, [dst, src, count, ran] {
          std::memmove(dst, src, count);
          ran->store(true);
        }, nullptr, info));
      }
    }
    const int src_device = device_of(src);
    if (kind == vnpuMemcpyDeviceToDevice && src_device != s->device) {
      // Note [Errors follow peer copies]: a device's pending error stays that device's, so a copy of a failed
      // kernel's output to another device (a collective whose peer died) would hand the other device the
      // unfinished values and nothing to raise there. The copy fails instead, on the destination device.
      return finish_submission(s, s->submit(name, [dst, src, count, src_device] {
        if (peek_device_error(src_device) != vnpuSuccess) {
          throw std::runtime_error("its source, on vnpu:" + std::to_string(src_device) +
                                   ", was produced by a failed kernel (" + vnpuGetLastErrorString() +
                                   "); the copy was not made");
        }
        std::memmove(dst, src, count);
      }, nullptr, info));
    }
    return finish_submission(s, s->submit(name, [dst, src, count] { std::memmove(dst, src, count); }, nullptr,
                                          info));
  }
  return finish(s, /*wait=*/false);
}

vnpuError_t vnpuMemcpyAsyncFromHostBuffer(void* dst, std::shared_ptr<const void> src, size_t count,
                                          vnpuStream_t stream) {
  if (count == 0) return vnpuSuccess;
  if (dst == nullptr || src == nullptr || !kind_ok(dst, src.get(), vnpuMemcpyHostToDevice)) {
    return vnpuErrorInvalidValue;
  }
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (san::on()) {
    const vnpuMemAccess acc{dst, count, 1};
    if (vnpuError_t e = san::report_host_access(s, "memcpy HtoD"); e != vnpuSuccess) return e;
    if (vnpuError_t e = san::begin_task(s, "memcpy HtoD", &acc, 1); e != vnpuSuccess) return e;
  }
  TaskInfo info{vnpuActivityKindMemcpy, count, vnpuMemcpyHostToDevice};
  if (recording()) info.dst_device = device_of(dst);
  return finish_submission(
      s, s->submit("memcpy HtoD", [dst, src = std::move(src), count] { std::memcpy(dst, src.get(), count); },
                   nullptr, info));
}

vnpuError_t vnpuMemcpy(void* dst, const void* src, size_t count, vnpuMemcpyKind kind) {
  vnpuError_t e = vnpuMemcpyAsync(dst, src, count, kind, nullptr);
  if (e != vnpuSuccess) return e;
  return vnpuStreamSynchronize(nullptr);
}

vnpuError_t vnpuMemsetAsync(void* dst, int value, size_t count, vnpuStream_t stream) {
  if (count == 0) return vnpuSuccess;
  if (dst == nullptr || device_of(dst) < 0) return vnpuErrorInvalidValue;
  // (no workers in a forked child: work would never run)
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (san::on()) {
    const vnpuMemAccess acc{dst, count, 1};
    if (vnpuError_t e = san::report_host_access(s, "memset"); e != vnpuSuccess) return e;
    if (vnpuError_t e = san::begin_task(s, "memset", &acc, 1); e != vnpuSuccess) return e;
  }
  return finish_submission(s, s->submit("memset", [dst, value, count] { std::memset(dst, value, count); }, nullptr,
                                        {vnpuActivityKindMemset, count, vnpuMemcpyHostToHost, false}));
}

namespace {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif
void populate_for_write(char* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Only whole pages of the range: no RAM is committed for a free neighbour.
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
}
// The task's own duplicate of a caller's descriptor, closed with the last task holding it: the caller may close
// its descriptor at once. Null if it cannot be made (errno: EBADF if `fd` is not open, EMFILE at the limit).
std::shared_ptr<int> own_descriptor(int fd) {
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return nullptr;
  return std::shared_ptr<int>(new int(own), [](int* f) {
    ::close(*f);
    delete f;
  });
}

// What both file copies check and set up before queueing: the arguments, the stream, a capture's refusal, the
// task's own descriptor and the sanitizer's record of the device access. *s stays null for a zero-byte copy
// (nothing to queue; *result is 0).
vnpuError_t begin_file_copy(const char* name, const void* device_ptr, int write, size_t count, int fd,
                            const std::shared_ptr<int64_t>& result, vnpuStream_t stream, const char* on_capture,
                            vnpuStream_st** s, std::shared_ptr<int>* file) {
  *s = nullptr;
  if (result == nullptr || device_ptr == nullptr || fd < 0) return vnpuErrorInvalidValue;
  *result = count == 0 ? 0 : -1;
  if (count == 0) return vnpuSuccess;
  const int device = device_of(device_ptr);
  if (device < 0 || device_of(static_cast<const char*>(device_ptr) + count - 1) != device) {
    return vnpuErrorInvalidValue;
  }
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* st = resolve(stream);
  if (st == nullptr) return vnpuErrorInvalidResourceHandle;
  if (auto c = capture_of(st)) return refuse_on_capture(*c, vnpuErrorStreamCaptureUnsupported, on_capture);
  *file = own_descriptor(fd);
  if (*file == nullptr) {
    if (errno == EBADF) return vnpuErrorInvalidValue;
    // Out of descriptors (EMFILE): the copy fails as a failed read or write does, through *result; nothing queued.
    *result = -static_cast<int64_t>(errno);
    return vnpuSuccess;
  }
  if (san::on()) {
    const vnpuMemAccess acc{device_ptr, count, write};
    if (vnpuError_t e = san::report_host_access(st, name); e != vnpuSuccess) return e;
    if (vnpuError_t e = san::begin_task(st, name, &acc, 1); e != vnpuSuccess) return e;
  }
  *s = st;
  return vnpuSuccess;
}
}  // namespace

// Note [File reads into device memory]
// A real device reads storage into its memory by DMA (GPUDirect Storage); the vNPU's copy task does it with
// pread into the device range, so the bytes go from the page cache to device memory in one pass (no pinned
// staging buffer, no second copy) and the first-touch faults of fresh device memory are taken in the same pass.
// Several streams reading different ranges keep several reads in flight. The task first populates the range
// (MADV_POPULATE_WRITE: the pages are allocated in one kernel call, not one fault per page inside pread's copy),
// which makes fresh memory about 7% faster to fill; it changes no byte, and a kernel without it (EINVAL) just
// takes the faults.
vnpuError_t vnpuMemcpyFromFileAsync(void* dst, int fd, uint64_t offset, size_t count,
                                    std::shared_ptr<int64_t> bytes_read, vnpuStream_t stream) {
  vnpuStream_st* s = nullptr;
  std::shared_ptr<int> file;
  if (vnpuError_t e = begin_file_copy("memcpy FtoD", dst, 1, count, fd, bytes_read, stream,
                                      "vnpuMemcpyFromFileAsync into the capturing stream (a file is read once, not "
                                      "at each replay): load the data before the capture begins",
                                      &s, &file);
      e != vnpuSuccess || s == nullptr) {
    return e;
  }
  TaskInfo info{vnpuActivityKindMemcpy, count, vnpuMemcpyHostToDevice};
  if (recording()) info.dst_device = device_of(dst);
  // The sanitizer's host-access check (Note [Host access without protection keys]) keeps device memory closed
  // to the kernel's copies (pread gets EFAULT): read into a host buffer, then copy in user mode.
  const bool bounce = san::host_check_on();
  return finish_submission(s, s->submit("memcpy FtoD", [dst, file, offset, count, bytes_read, bounce] {
    std::unique_ptr<char[]> host(bounce ? new char[count] : nullptr);
    char* into = bounce ? host.get() : static_cast<char*>(dst);
    if (!bounce) populate_for_write(into, count);
    size_t done = 0;
    while (done < count) {
      const ssize_t r = ::pread(*file, into + done, count - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        *bytes_read = -static_cast<int64_t>(errno);
        return;
      }
      if (r == 0) break;  // the file ended
      done += static_cast<size_t>(r);
    }
    if (bounce) std::memcpy(dst, into, done);
    *bytes_read = static_cast<int64_t>(done);
  }, nullptr, info));
}

// Note [File writes from device memory]
// The mirror of Note [File reads into device memory]: the copy task pwrites the device range into the file, so
// the bytes go from device memory to the page cache in one pass, with no pinned staging buffer and no second
// copy (cuFileWrite's role). Each pwrite takes at most 2 MiB: larger ones were sporadically 5-10x slower, all
// of it in the kernel's copy into the page cache (measured on 2-core VMs: 4 and 16 MiB writes slow in 3-6 runs
// of 8, 1 and 2 MiB writes never, and no slower when fast).
namespace {
constexpr size_t kFileWriteBytes = size_t{2} << 20;
}  // namespace

vnpuError_t vnpuMemcpyToFileAsync(int fd, uint64_t offset, const void* src, size_t count,
                                  std::shared_ptr<int64_t> bytes_written, vnpuStream_t stream) {
  vnpuStream_st* s = nullptr;
  std::shared_ptr<int> file;
  if (vnpuError_t e = begin_file_copy("memcpy DtoF", src, 0, count, fd, bytes_written, stream,
                                      "vnpuMemcpyToFileAsync on the capturing stream (a file is written once, not "
                                      "at each replay): save after the capture ends",
                                      &s, &file);
      e != vnpuSuccess || s == nullptr) {
    return e;
  }
  TaskInfo info{vnpuActivityKindMemcpy, count, vnpuMemcpyDeviceToHost};
  if (recording()) info.src_device = device_of(src);
  // Under the sanitizer's host-access check the kernel cannot read device memory (EFAULT, as for reads): copy
  // to a host buffer in user mode first.
  const bool bounce = san::host_check_on();
  // Note [Errors follow peer copies]: from another device's memory, that device's pending error fails the task.
  const int peer = device_of(src) != s->device ? device_of(src) : -1;
  return finish_submission(s, s->submit("memcpy DtoF", [src, file, offset, count, bytes_written, bounce, peer] {
    if (peer >= 0 && peek_device_error(peer) != vnpuSuccess) {
      throw std::runtime_error("its source, on vnpu:" + std::to_string(peer) + ", was produced by a failed kernel (" +
                               vnpuGetLastErrorString() + "); nothing was written");
    }
    std::unique_ptr<char[]> host(bounce ? new char[count] : nullptr);
    if (bounce) std::memcpy(host.get(), src, count);
    const char* from = bounce ? host.get() : static_cast<const char*>(src);
    size_t done = 0;
    while (done < count) {
      const size_t n = std::min(count - done, kFileWriteBytes);
      const ssize_t w = ::pwrite(*file, from + done, n, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        *bytes_written = w < 0 ? -static_cast<int64_t>(errno) : -static_cast<int64_t>(EIO);
        return;
      }
      done += static_cast<size_t>(w);
    }
    *bytes_written = static_cast<int64_t>(done);
  }, nullptr, info));
}
