// VNPUStream: a c10::Stream on a vNPU device (mirrors c10/cuda/CUDAStream.h).
//
// Threads and state:
//  * The current stream is per host thread and per device (thread-local),
//    initially the device's default stream (id 0).
//  * Each device has a global pool of kStreamsPerPool streams per priority,
//    handed out round-robin; pool streams are created lazily, once, and live
//    for the whole process. getNewVNPUStream creates a dedicated stream.
//
// Note [StreamId assignment]
//  id 0                              default stream
//  id 1 .. kStreamsPerPool           pool, priority 0 (low)
//  id kStreamsPerPool+1 .. 2*k       pool, priority -1 (high)
//  id > 2*kStreamsPerPool            dedicated streams (getNewVNPUStream)
#pragma once

#include <vnpu/runtime.h>

#include <c10/core/Stream.h>

#include <ostream>

namespace c10::vnpu {

constexpr int kStreamsPerPool = 8;

class VNPUStream {
 public:
  // Throws if `stream` is not a vnpu stream.
  explicit VNPUStream(Stream stream);

  bool operator==(const VNPUStream& other) const noexcept { return stream_ == other.stream_; }
  bool operator!=(const VNPUStream& other) const noexcept { return !(*this == other); }
  operator Stream() const noexcept { return stream_; }
  Stream unwrap() const noexcept { return stream_; }

  DeviceIndex device_index() const noexcept { return stream_.device_index(); }
  Device device() const noexcept { return stream_.device(); }
  StreamId id() const noexcept { return stream_.id(); }
  // Runtime handle (never null).
  vnpuStream_t stream() const;
  int priority() const;
  // True if all submitted work has completed.
  bool query() const;
  // Waits for all submitted work; raises pending kernel errors (RuntimeError).
  // Reported by the sync debug mode, as CUDAStream::synchronize.
  void synchronize() const;

 private:
  Stream stream_;
};

// A pool stream; priority 0 (low) or -1 (high). device -1 = current device.
VNPUStream getStreamFromPool(bool is_high_priority = false, DeviceIndex device = -1);
VNPUStream getStreamFromPool(int priority, DeviceIndex device = -1);
// A new dedicated stream with `priority`.
VNPUStream getNewVNPUStream(int priority = 0, DeviceIndex device = -1);
// A stream created outside torch (a live vnpuStream_t of this process, e.g. another library's), as
// CUDA's getStreamFromExternal: it gets a dedicated id; torch never destroys it. Throws (ValueError) for a
// handle that is no live stream, or one of another device than `device`.
VNPUStream getStreamFromExternal(vnpuStream_t ext, DeviceIndex device);
VNPUStream getDefaultVNPUStream(DeviceIndex device = -1);
VNPUStream getCurrentVNPUStream(DeviceIndex device = -1);
// Makes `stream` current for its device on this thread.
void setCurrentVNPUStream(VNPUStream stream);

// The StreamId of runtime stream `s` of `device` (default, pool or
// dedicated), or -1 for a stream not made through this file.
StreamId streamIdOf(DeviceIndex device, vnpuStream_t s);

std::ostream& operator<<(std::ostream& os, const VNPUStream& s);

}  // namespace c10::vnpu
