#include "VNPUStream.h"

#include "VNPUException.h"
#include "VNPUFunctions.h"

#include <c10/core/DeviceGuard.h>

#include <array>
#include <atomic>
#include <deque>
#include <mutex>
#include <vector>

namespace c10::vnpu {
namespace {

constexpr int kMaxDevices = 64;
constexpr StreamId kFirstDedicatedId = 2 * kStreamsPerPool + 1;

struct DeviceStreams {
  std::once_flag pool_once;
  std::array<vnpuStream_t, 2 * kStreamsPerPool> pool{};  // [low..., high...]
  std::array<std::atomic<uint32_t>, 2> next{};           // round-robin counters
  std::mutex dedicated_mu;                               // guards dedicated
  std::deque<vnpuStream_t> dedicated;                    // index = id - kFirstDedicatedId
};

DeviceStreams& streams_of(DeviceIndex d) {
  static std::array<DeviceStreams, kMaxDevices> all;
  return all[d];
}

thread_local std::array<StreamId, kMaxDevices> t_current{};  // 0 = default stream

DeviceIndex resolve_device(DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return device;
}

void init_pool(DeviceIndex d) {
  auto& ds = streams_of(d);
  std::call_once(ds.pool_once, [&] {
    DeviceIndex prev = ExchangeDevice(d);
    for (int i = 0; i < 2 * kStreamsPerPool; ++i) {
      VNPU_CHECK(vnpuStreamCreateWithPriority(&ds.pool[i], 0, i < kStreamsPerPool ? 0 : -1));
    }
    set_device(prev);
  });
}

}  // namespace

VNPUStream::VNPUStream(Stream stream) : stream_(stream) {
  TORCH_CHECK(stream.device_type() == DeviceType::PrivateUse1,
              "expected a vnpu stream, but got a stream on ", stream.device());
}

vnpuStream_t VNPUStream::stream() const {
  DeviceIndex d = device_index();
  StreamId id = stream_.id();
  if (id == 0) {
    vnpuStream_t s = nullptr;
    VNPU_CHECK(vnpuGetDefaultStream(d, &s));
    return s;
  }
  if (id < kFirstDedicatedId) {
    init_pool(d);
    return streams_of(d).pool[id - 1];
  }
  auto& ds = streams_of(d);
  std::lock_guard<std::mutex> g(ds.dedicated_mu);
  size_t idx = static_cast<size_t>(id - kFirstDedicatedId);
  TORCH_CHECK(idx < ds.dedicated.size(), "unknown vnpu stream id ", id, " on vnpu:", int(d));
  return ds.dedicated[idx];
}

int VNPUStream::priority() const {
  int p = 0;
  VNPU_CHECK(vnpuStreamGetPriority(stream(), &p));
  return p;
}

bool VNPUStream::query() const {
  const vnpuError_t r = vnpuStreamQuery(stream());
  if (r == vnpuErrorNotReady) return false;
  VNPU_CHECK(r);
  c10::DeviceGuard guard(Device(DeviceType::PrivateUse1, device_index()));
  raisePendingError();
  return true;
}

void VNPUStream::synchronize() const {
  check_sync("Stream.synchronize()");  // as CUDA's stream_synchronize
  VNPU_CHECK(vnpuStreamSynchronize(stream()));
}

VNPUStream getStreamFromPool(int priority, DeviceIndex device) {
  device = resolve_device(device);
  init_pool(device);
  int hi = priority < 0 ? 1 : 0;
  uint32_t k = streams_of(device).next[hi]++ % kStreamsPerPool;
  StreamId id = 1 + hi * kStreamsPerPool + static_cast<StreamId>(k);
  return VNPUStream(Stream(Stream::UNSAFE, Device(DeviceType::PrivateUse1, device), id));
}

VNPUStream getStreamFromPool(bool is_high_priority, DeviceIndex device) {
  return getStreamFromPool(is_high_priority ? -1 : 0, device);
}

VNPUStream getNewVNPUStream(int priority, DeviceIndex device) {
  device = resolve_device(device);
  DeviceIndex prev = ExchangeDevice(device);
  vnpuStream_t s = nullptr;
  vnpuError_t err = vnpuStreamCreateWithPriority(&s, 0, priority);
  set_device(prev);
  VNPU_CHECK(err);
  auto& ds = streams_of(device);
  std::lock_guard<std::mutex> g(ds.dedicated_mu);
  ds.dedicated.push_back(s);
  StreamId id = kFirstDedicatedId + static_cast<StreamId>(ds.dedicated.size() - 1);
  return VNPUStream(Stream(Stream::UNSAFE, Device(DeviceType::PrivateUse1, device), id));
}

VNPUStream getStreamFromExternal(vnpuStream_t ext, DeviceIndex device) {
  device = resolve_device(device);
  int owner = -1;
  TORCH_CHECK_VALUE(vnpuStreamCheckHandle(ext, &owner) == vnpuSuccess, "vnpu stream handle ",
                    reinterpret_cast<uintptr_t>(ext), " is not a live stream of this process (vnpuStreamCreate)");
  TORCH_CHECK_VALUE(owner == device, "vnpu stream handle ", reinterpret_cast<uintptr_t>(ext), " belongs to vnpu:",
                    owner, ", not vnpu:", int(device));
  if (StreamId known = streamIdOf(device, ext); known >= 0)
    return VNPUStream(Stream(Stream::UNSAFE, Device(DeviceType::PrivateUse1, device), known));
  auto& ds = streams_of(device);
  std::lock_guard<std::mutex> g(ds.dedicated_mu);
  ds.dedicated.push_back(ext);
  StreamId id = kFirstDedicatedId + static_cast<StreamId>(ds.dedicated.size() - 1);
  return VNPUStream(Stream(Stream::UNSAFE, Device(DeviceType::PrivateUse1, device), id));
}

VNPUStream getDefaultVNPUStream(DeviceIndex device) {
  device = resolve_device(device);
  return VNPUStream(Stream(Stream::DEFAULT, Device(DeviceType::PrivateUse1, device)));
}

VNPUStream getCurrentVNPUStream(DeviceIndex device) {
  device = resolve_device(device);
  return VNPUStream(
      Stream(Stream::UNSAFE, Device(DeviceType::PrivateUse1, device), t_current[device]));
}

void setCurrentVNPUStream(VNPUStream stream) {
  t_current[stream.device_index()] = stream.id();
}

StreamId streamIdOf(DeviceIndex device, vnpuStream_t s) {
  if (device < 0 || device >= kMaxDevices) return -1;
  vnpuStream_t def = nullptr;
  if (vnpuGetDefaultStream(device, &def) == vnpuSuccess && def == s) return 0;
  auto& ds = streams_of(device);
  init_pool(device);  // once created, never changes
  for (int i = 0; i < 2 * kStreamsPerPool; ++i) {
    if (ds.pool[i] == s) return 1 + i;
  }
  std::lock_guard<std::mutex> g(ds.dedicated_mu);
  for (size_t i = 0; i < ds.dedicated.size(); ++i) {
    if (ds.dedicated[i] == s) return kFirstDedicatedId + static_cast<StreamId>(i);
  }
  return -1;
}

std::ostream& operator<<(std::ostream& os, const VNPUStream& s) { return os << s.unwrap(); }

}  // namespace c10::vnpu
