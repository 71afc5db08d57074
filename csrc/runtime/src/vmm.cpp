// Virtual memory management: physical allocation handles mapped into reserved
// address ranges (the CUDA driver's cuMemAddressReserve / cuMemCreate / cuMemMap).
//
// Note [Physical memory and mappings]
// A device's memory is `capacity` bytes of physical pages: a memfd created at
// initialization (Note [Discovery and initialization], device.cpp), mapped in
// full at the device's linear range, where vnpuMalloc hands out contiguous
// blocks. vnpuMemCreate takes pages of the same memfd from the same free list
// (so both count against the capacity), but from anywhere: a handle is a list
// of extents, contiguous or not. vnpuMemMap maps a handle's extents one after
// the other into a reserved range (mmap MAP_SHARED|MAP_FIXED of the memfd), so
// the range reads and writes those very pages; vnpuMemUnmap puts the
// no-access reservation back. This is what lets the caching allocator's
// expandable segments grow one virtual range page by page and satisfy a large
// request from scattered free memory (vnpuMalloc needs one contiguous hole).
// A handle's pages go back to the free list when it is released and no longer
// mapped.
//
// Threads: g_vmm_mu guards g_reservations (and every mapping and handle
// reference count in it); a device's MemoryRegion::mu guards its free list.
// Lock order: g_vmm_mu, then MemoryRegion::mu. No lock is held while waiting
// for a device.
#include "internal.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>

struct vnpuMemHandle_st {
  int device = 0;
  size_t size = 0;                                   // bytes
  std::vector<std::pair<size_t, size_t>> extents;    // (physical offset, bytes), in mapping order
  int refs = 1;                                      // the handle itself + one per mapping
};

namespace vnpu::rt {
namespace {

constexpr size_t kGranularity = size_t(2) << 20;  // bytes, CUDA's usual granularity

struct Mapping {
  size_t size = 0;  // bytes
  vnpuMemHandle_st* handle = nullptr;
};

struct Reservation {
  size_t size = 0;                     // bytes
  std::map<uintptr_t, Mapping> maps;   // start -> mapping
};

std::mutex g_vmm_mu;                           // guards g_reservations
std::map<uintptr_t, Reservation> g_reservations;  // start -> reservation

bool aligned(size_t n) { return n % kGranularity == 0; }

// The reservation holding [p, p + n), or end().
std::map<uintptr_t, Reservation>::iterator find_reservation(uintptr_t p, size_t n) {
  auto it = g_reservations.upper_bound(p);
  if (it == g_reservations.begin()) return g_reservations.end();
  --it;
  if (p + n > it->first + it->second.size || p + n < p) return g_reservations.end();
  return it;
}

// Drops one reference; the last one returns the pages. Needs g_vmm_mu.
void unref(vnpuMemHandle_st* h) {
  if (--h->refs > 0) return;
  MemoryRegion& m = devices()[h->device]->mem;
  {
    std::lock_guard<std::mutex> g(m.mu);
    for (auto [off, len] : h->extents) give_physical_locked(m, off, len);
  }
  delete h;
}

bool remap_no_access(uintptr_t p, size_t n) {
  return mmap(reinterpret_cast<void*>(p), n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
              -1, 0) != MAP_FAILED;
}

}  // namespace

int mapped_device_of(const void* p, void** base, size_t* size) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> g(g_vmm_mu);
  auto r = find_reservation(a, 1);
  if (r == g_reservations.end()) return -1;
  auto m = r->second.maps.upper_bound(a);
  if (m == r->second.maps.begin()) return -1;
  --m;
  if (a >= m->first + m->second.size) return -1;
  if (base != nullptr) *base = reinterpret_cast<void*>(m->first);
  if (size != nullptr) *size = m->second.size;
  return m->second.handle->device;
}

void for_each_mapping(const std::function<void(void*, size_t)>& f) {
  std::lock_guard<std::mutex> g(g_vmm_mu);
  for (auto& [start, r] : g_reservations)
    for (auto& [p, m] : r.maps) f(reinterpret_cast<void*>(p), m.size);
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuError_t vnpuMemGetAllocationGranularity(size_t* granularity, const vnpuMemAllocationProp* prop,
                                            vnpuMemAllocationGranularityFlags option) {
  if (granularity == nullptr || prop == nullptr) return vnpuErrorInvalidValue;
  if (option != vnpuMemAllocationGranularityMinimum && option != vnpuMemAllocationGranularityRecommended)
    return vnpuErrorInvalidValue;
  if (!valid_device(prop->device)) return vnpuErrorInvalidDevice;
  *granularity = kGranularity;
  return vnpuSuccess;
}

vnpuError_t vnpuMemAddressReserve(void** ptr, size_t size, size_t alignment, void* /*addr*/,
                                  unsigned long long flags) {
  if (ptr == nullptr || size == 0 || !aligned(size) || flags != 0) return vnpuErrorInvalidValue;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return vnpuErrorInvalidValue;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  const size_t align = std::max(alignment, kGranularity);
  // Over-reserve, then trim to an aligned start.
  const size_t span = size + align;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return vnpuErrorMemoryAllocation;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned_start = (start + align - 1) / align * align;
  if (aligned_start > start) munmap(raw, aligned_start - start);
  const uintptr_t end = aligned_start + size;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
  {
    std::lock_guard<std::mutex> g(g_vmm_mu);
    g_reservations[aligned_start].size = size;
  }
  *ptr = reinterpret_cast<void*>(aligned_start);
  return vnpuSuccess;
}

vnpuError_t vnpuMemAddressFree(void* ptr, size_t size) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> g(g_vmm_mu);
  auto it = g_reservations.find(a);
  if (it == g_reservations.end() || it->second.size != size) return vnpuErrorInvalidValue;
  if (!it->second.maps.empty()) return vnpuErrorInvalidValue;  // unmap first
  munmap(ptr, size);
  g_reservations.erase(it);
  return vnpuSuccess;
}

vnpuError_t vnpuMemCreate(vnpuMemGenericAllocationHandle_t* handle, size_t size, const vnpuMemAllocationProp* prop,
                          unsigned long long flags) {
  if (handle == nullptr || prop == nullptr || size == 0 || !aligned(size) || flags != 0)
    return vnpuErrorInvalidValue;
  if (!valid_device(prop->device)) return vnpuErrorInvalidDevice;
  if (vnpuError_t e = check_unsafe_call("vnpuMemCreate (device memory for an expandable segment)"); e != vnpuSuccess)
    return e;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  MemoryRegion& m = devices()[prop->device]->mem;
  if (m.fd < 0) return vnpuErrorNotSupported;  // private anonymous memory cannot be mapped twice
  auto* h = new vnpuMemHandle_st();
  h->device = prop->device;
  h->size = size;
  {
    std::lock_guard<std::mutex> g(m.mu);
    if (!take_physical_locked(m, size, /*contiguous=*/false, &h->extents)) {
      delete h;
      return vnpuErrorMemoryAllocation;
    }
  }
  *handle = h;
  return vnpuSuccess;
}

vnpuError_t vnpuMemRelease(vnpuMemGenericAllocationHandle_t handle) {
  if (handle == nullptr) return vnpuErrorInvalidValue;
  std::lock_guard<std::mutex> g(g_vmm_mu);
  unref(handle);  // the pages stay while mapped (CUDA semantics)
  return vnpuSuccess;
}

vnpuError_t vnpuMemMap(void* ptr, size_t size, size_t offset, vnpuMemGenericAllocationHandle_t handle,
                       unsigned long long flags) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  if (handle == nullptr || size == 0 || !aligned(size) || !aligned(offset) || flags != 0 || a % kGranularity != 0)
    return vnpuErrorInvalidValue;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  if (offset > handle->size || size > handle->size - offset) return vnpuErrorInvalidValue;
  std::lock_guard<std::mutex> g(g_vmm_mu);
  auto r = find_reservation(a, size);
  if (r == g_reservations.end()) return vnpuErrorInvalidValue;
  auto& maps = r->second.maps;
  auto next = maps.lower_bound(a);
  if (next != maps.end() && next->first < a + size) return vnpuErrorInvalidValue;  // overlaps a mapping
  if (next != maps.begin() && std::prev(next)->first + std::prev(next)->second.size > a)
    return vnpuErrorInvalidValue;
  const MemoryRegion& m = devices()[handle->device]->mem;
  // The handle's bytes [offset, offset + size), extent by extent.
  size_t skip = offset, done = 0;
  for (auto [off, len] : handle->extents) {
    if (done == size) break;
    if (skip >= len) {
      skip -= len;
      continue;
    }
    const size_t n = std::min(len - skip, size - done);
    void* at = reinterpret_cast<void*>(a + done);
    if (mmap(at, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m.fd, static_cast<off_t>(off + skip)) ==
        MAP_FAILED) {
      remap_no_access(a, done + n);
      return vnpuErrorMemoryAllocation;
    }
    done += n;
    skip = 0;
  }
  if (san::on()) san::protect(ptr, size);  // Note [Protection keys] (host_access.cpp)
  maps[a] = Mapping{size, handle};
  ++handle->refs;
  return vnpuSuccess;
}

vnpuError_t vnpuMemUnmap(void* ptr, size_t size) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  if (size == 0 || !aligned(size)) return vnpuErrorInvalidValue;
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  if (vnpuError_t e = check_unsafe_call("vnpuMemUnmap (releasing device memory)"); e != vnpuSuccess) return e;
  std::set<int> devs;
  {
    // The range must be exactly a run of whole mappings.
    std::lock_guard<std::mutex> g(g_vmm_mu);
    auto r = find_reservation(a, size);
    if (r == g_reservations.end()) return vnpuErrorInvalidValue;
    uintptr_t p = a;
    for (auto it = r->second.maps.find(a); p < a + size; ++it) {
      if (it == r->second.maps.end() || it->first != p) return vnpuErrorInvalidValue;
      devs.insert(it->second.handle->device);
      p += it->second.size;
    }
    if (p != a + size) return vnpuErrorInvalidValue;
  }
  // Queued work may still use the pages: wait for it (no lock held, no error
  // consumed), so that no kernel ever touches a range that lost its mapping.
  for (int d : devs) wait_device_idle(d, /*interruptible=*/false);
  std::lock_guard<std::mutex> g(g_vmm_mu);
  auto r = find_reservation(a, size);
  if (r == g_reservations.end()) return vnpuErrorInvalidValue;
  auto& maps = r->second.maps;
  for (auto it = maps.find(a); it != maps.end() && it->first < a + size;) {
    unref(it->second.handle);
    it = maps.erase(it);
  }
  if (san::on()) san::unprotect(ptr, size);
  remap_no_access(a, size);
  return vnpuSuccess;
}
