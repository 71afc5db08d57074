// Device memory (a fixed-capacity region per device) and pinned host memory.
#include "internal.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace vnpu::rt {
namespace {

constexpr size_t kAlignment = 4096;  // bytes; also the page size we give back to the OS

std::mutex g_pinned_mu;                     // guards g_pinned
std::map<uintptr_t, size_t> g_pinned;       // base -> bytes

size_t round_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
// Sizes above this wrap round_up() around to a tiny value: reject them first.
constexpr size_t kMaxRequest = SIZE_MAX - (kAlignment - 1);

}  // namespace

bool is_pinned(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(g_pinned_mu);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a < it->first + it->second;
}

int device_of(const void* p) {
  auto* c = static_cast<const char*>(p);
  for (Device* d : devices()) {
    if (d->mem.base != nullptr && c >= d->mem.base && c < d->mem.base + d->mem.capacity) return d->index;
  }
  int mdev = mapped_device_of(p);
  return mdev >= 0 ? mdev : ipc_device_of(p);
}

bool take_physical_locked(MemoryRegion& m, size_t n, bool contiguous,
                          std::vector<std::pair<size_t, size_t>>* extents) {
  // Best fit keeps large holes for large requests.
  auto best = m.free_.end();
  for (auto it = m.free_.begin(); it != m.free_.end(); ++it) {
    if (it->second >= n && (best == m.free_.end() || it->second < best->second)) best = it;
  }
  if (best != m.free_.end()) {
    const size_t off = best->first, len = best->second;
    m.free_.erase(best);
    if (len > n) m.free_[off + n] = len - n;
    extents->emplace_back(off, n);
    m.used_bytes += n;
    return true;
  }
  if (contiguous || m.capacity - m.used_bytes < n) return false;
  // Pieces, largest first: as few extents (mappings) as possible.
  std::vector<std::pair<size_t, size_t>> holes(m.free_.begin(), m.free_.end());
  std::sort(holes.begin(), holes.end(), [](auto& a, auto& b) { return a.second > b.second; });
  size_t need = n;
  for (auto [off, len] : holes) {
    const size_t take = std::min(len, need);
    m.free_.erase(off);
    if (len > take) m.free_[off + take] = len - take;
    extents->emplace_back(off, take);
    need -= take;
    if (need == 0) break;
  }
  m.used_bytes += n;
  return true;
}

void give_physical_locked(MemoryRegion& m, size_t off, size_t len) {
  m.used_bytes -= len;
  release_pages(m, off, len);  // give the RAM back; the pages stay the device's
  // Insert and coalesce with neighbours.
  auto next = m.free_.lower_bound(off);
  if (next != m.free_.end() && off + len == next->first) {
    len += next->second;
    next = m.free_.erase(next);
  }
  if (next != m.free_.begin()) {
    auto prevb = std::prev(next);
    if (prevb->first + prevb->second == off) {
      prevb->second += len;
      return;
    }
  }
  m.free_[off] = len;
}

void release_pages(MemoryRegion& m, size_t off, size_t len) {
  // Pages of the memfd stay allocated until removed: MADV_DONTNEED would only drop this mapping of them.
  madvise(m.base + off, len, m.fd >= 0 ? MADV_REMOVE : MADV_DONTNEED);
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuError_t vnpuMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return vnpuErrorInvalidValue;
  if (vnpuError_t e = check_unsafe_call("vnpuMalloc (a new device memory segment outside a graph's pool)"); e != vnpuSuccess)
    return e;
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  int dev = current_device();
  if (!valid_device(dev)) return vnpuErrorInvalidDevice;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  *ptr = nullptr;
  if (size == 0) return vnpuSuccess;
  // Larger sizes would wrap round_up() to 0 and "succeed" with a block of no bytes.
  if (size > kMaxRequest) return vnpuErrorMemoryAllocation;
  MemoryRegion& m = devices()[dev]->mem;
  const size_t n = round_up(size);
  std::lock_guard<std::mutex> g(m.mu);
  std::vector<std::pair<size_t, size_t>> extent;
  if (!take_physical_locked(m, n, /*contiguous=*/true, &extent)) return vnpuErrorMemoryAllocation;
  m.used_[extent[0].first] = n;
  *ptr = m.base + extent[0].first;
  return vnpuSuccess;
}

vnpuError_t vnpuFree(void* ptr) {
  if (ptr == nullptr) return vnpuSuccess;
  if (vnpuError_t e = check_unsafe_call("vnpuFree (releasing device memory, e.g. torch.vnpu.empty_cache())"); e != vnpuSuccess)
    return e;
  MemoryRegion* region = nullptr;
  for (Device* d : devices()) {
    char* c = static_cast<char*>(ptr);
    if (d->mem.base != nullptr && c >= d->mem.base && c < d->mem.base + d->mem.capacity) region = &d->mem;
  }
  if (region == nullptr) return vnpuErrorInvalidValue;  // (a vnpuMemMap address is unmapped, not freed)
  const int dev = device_of(ptr);
  // cudaFree semantics: no queued work may still touch the block. Not
  // interruptible (Note [Interruptible waits]): the block is freed below. A
  // pending kernel error is returned, but the block is freed all the same.
  vnpuError_t sync_err = vnpuErrorForkedAfterInit;  // in a bad fork: no workers to wait for
  if (!vnpuIsInBadFork()) {
    wait_device_idle(dev, /*interruptible=*/false);
    sync_err = take_device_error(dev);
  }
  MemoryRegion& m = *region;
  size_t off = static_cast<size_t>(static_cast<char*>(ptr) - m.base);
  std::lock_guard<std::mutex> g(m.mu);
  auto it = m.used_.find(off);
  if (it == m.used_.end()) return vnpuErrorInvalidValue;
  const size_t len = it->second;
  m.used_.erase(it);
  give_physical_locked(m, off, len);
  return sync_err;
}

vnpuError_t vnpuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return vnpuErrorInvalidValue;
  int dev = current_device();
  if (!valid_device(dev)) return vnpuErrorInvalidDevice;
  MemoryRegion& m = devices()[dev]->mem;
  std::lock_guard<std::mutex> g(m.mu);
  *total_bytes = m.capacity;
  *free_bytes = m.capacity - m.used_bytes;
  return vnpuSuccess;
}

vnpuError_t vnpuMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return vnpuErrorInvalidValue;
  if (vnpuError_t e = check_unsafe_call("vnpuMallocHost (pinned host memory)"); e != vnpuSuccess) return e;
  if (size == 0) {
    *ptr = nullptr;
    return vnpuSuccess;
  }
  void* p = nullptr;
  if (size > kMaxRequest) return vnpuErrorMemoryAllocation;  // see kMaxRequest
  if (posix_memalign(&p, kAlignment, round_up(size)) != 0) return vnpuErrorMemoryAllocation;
  {
    std::lock_guard<std::mutex> g(g_pinned_mu);
    g_pinned[reinterpret_cast<uintptr_t>(p)] = size;
  }
  *ptr = p;
  return vnpuSuccess;
}

vnpuError_t vnpuFreeHost(void* ptr) {
  if (ptr == nullptr) return vnpuSuccess;
  if (vnpuError_t e = check_unsafe_call("vnpuFreeHost (pinned host memory)"); e != vnpuSuccess) return e;
  {
    std::lock_guard<std::mutex> g(g_pinned_mu);
    if (g_pinned.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return vnpuErrorInvalidValue;
  }
  std::free(ptr);
  return vnpuSuccess;
}

vnpuError_t vnpuPointerGetDevice(int* device, const void* ptr) {
  if (device == nullptr) return vnpuErrorInvalidValue;
  *device = device_of(ptr);  // a range test per device first; VMM and IPC mappings after
  return vnpuSuccess;
}

vnpuError_t vnpuPointerGetAttributes(vnpuPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return vnpuErrorInvalidValue;
  *attr = {vnpuMemoryTypeUnregistered, -1, nullptr, 0};
  auto a = reinterpret_cast<uintptr_t>(ptr);
  void* map_base = nullptr;
  size_t map_size = 0;
  if (int mdev = mapped_device_of(ptr, &map_base, &map_size); mdev >= 0) {
    *attr = {vnpuMemoryTypeDevice, mdev, map_base, map_size};
    return vnpuSuccess;
  }
  if (int idev = ipc_device_of(ptr, &map_base, &map_size); idev >= 0) {
    *attr = {vnpuMemoryTypeDevice, idev, map_base, map_size};
    return vnpuSuccess;
  }
  int dev = device_of(ptr);
  if (dev >= 0) {
    MemoryRegion& m = devices()[dev]->mem;
    size_t off = static_cast<size_t>(static_cast<const char*>(ptr) - m.base);
    std::lock_guard<std::mutex> g(m.mu);
    auto it = m.used_.upper_bound(off);
    if (it != m.used_.begin()) {
      --it;
      if (off < it->first + it->second) *attr = {vnpuMemoryTypeDevice, dev, m.base + it->first, it->second};
    }
    return vnpuSuccess;
  }
  std::lock_guard<std::mutex> g(g_pinned_mu);
  auto it = g_pinned.upper_bound(a);
  if (it != g_pinned.begin()) {
    --it;
    if (a < it->first + it->second)
      *attr = {vnpuMemoryTypeHost, -1, reinterpret_cast<void*>(it->first), it->second};
  }
  return vnpuSuccess;
}
