// Shareable device memory and inter-process handles (CUDA IPC).
//
// Note [Shareable device memory]
// Each device's memory is one range of `capacity` bytes, from initialization
// on (Note [Discovery and initialization]) a MAP_SHARED mapping of a memfd
// sized to the capacity (vmm.cpp maps the same pages elsewhere):
// untouched pages cost nothing (as with MAP_NORESERVE), freed pages go back
// with MADV_REMOVE, and another process of the same user can map the same
// pages by opening /proc/<exporter pid>/fd/<memfd> (the memfd's name carries a
// random nonce, checked on open, so a recycled pid or fd number is never
// mapped by mistake). Faulting a page in costs ~1.4x an anonymous page (shmem);
// steady-state access is the same. VNPU_IPC=0 forbids exporting (then
// vnpuIpcGetMemHandle reports vnpuErrorNotSupported). Only the linear range
// is exported: vnpuMemMap-ped ranges (expandable segments) are refused.
//
// Threads: g_ipc_mu guards g_maps (mappings of other processes' memory).
#include "internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace vnpu::rt {
namespace {

constexpr uint64_t kHandleMagic = 0x766e7075697063ull;  // "vnpuipc"

// The layout behind vnpuIpcMemHandle_t::reserved.
struct HandleData {
  uint64_t magic;
  int64_t pid;
  int32_t fd;
  int32_t physical;
  uint64_t nonce;
  uint64_t capacity;  // bytes of the exporter's range
  uint64_t offset;    // of the exported address in that range
};
static_assert(sizeof(HandleData) <= sizeof(vnpuIpcMemHandle_t::reserved), "handle too large");

struct Mapping {
  char* base = nullptr;
  size_t size = 0;
  int refs = 0;
  int device = 0;  // the opener's current device when first opened: the device its addresses belong to
};
std::mutex g_ipc_mu;                                     // guards g_maps
std::map<std::pair<int64_t, uint64_t>, Mapping> g_maps;  // (pid, nonce) -> mapping

}  // namespace

int ipc_device_of(const void* p, void** base, size_t* size) {
  auto* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> g(g_ipc_mu);
  for (auto& [key, m] : g_maps) {
    if (c >= m.base && c < m.base + m.size) {
      if (base != nullptr) *base = m.base;
      if (size != nullptr) *size = m.size;
      return m.device;
    }
  }
  return -1;
}

std::string memfd_name(int physical, uint64_t nonce) {
  return "vnpu-device" + std::to_string(physical) + "-" + std::to_string(nonce);
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuError_t vnpuIpcGetMemHandle(vnpuIpcMemHandle_t* handle, void* devPtr) {
  if (handle == nullptr) return vnpuErrorInvalidValue;
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  int dev = device_of(devPtr);
  if (dev < 0) return vnpuErrorInvalidValue;
  MemoryRegion& m = devices()[dev]->mem;
  if (!ipc_enabled() || m.fd < 0) return vnpuErrorNotSupported;
  char* p = static_cast<char*>(devPtr);
  if (p < m.base || p >= m.base + (m.capacity == 0 ? 4096 : m.capacity)) {
    // A vnpuMemMap-ped address (expandable segments): its pages are not at one offset of the memfd; or
    // another process's memory opened here (not ours to export, as with CUDA).
    set_last_error_message("vnpuIpcGetMemHandle: the address is in a vnpuMemMap mapping or in another "
                           "process's memory opened with vnpuIpcOpenMemHandle, not in this process's linear "
                           "device memory; only vnpuMalloc memory can be exported");
    return vnpuErrorInvalidValue;
  }
  HandleData h{};
  h.magic = kHandleMagic;
  h.pid = getpid();
  h.fd = m.fd;
  h.physical = devices()[dev]->physical;
  h.nonce = m.nonce;
  h.capacity = m.capacity == 0 ? 4096 : m.capacity;
  h.offset = static_cast<uint64_t>(static_cast<char*>(devPtr) - m.base);
  std::memset(handle->reserved, 0, sizeof(handle->reserved));
  std::memcpy(handle->reserved, &h, sizeof(h));
  return vnpuSuccess;
}

vnpuError_t vnpuIpcOpenMemHandle(void** devPtr, vnpuIpcMemHandle_t handle, unsigned /*flags*/) {
  if (devPtr == nullptr) return vnpuErrorInvalidValue;
  HandleData h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != kHandleMagic || h.offset >= h.capacity) return vnpuErrorInvalidValue;
  if (h.pid == getpid()) {  // our own memory
    for (Device* d : devices()) {
      if (d->mem.fd >= 0 && d->mem.nonce == h.nonce) {
        *devPtr = d->mem.base + h.offset;
        return vnpuSuccess;
      }
    }
    return vnpuErrorInvalidValue;
  }
  std::lock_guard<std::mutex> g(g_ipc_mu);
  auto key = std::make_pair(h.pid, h.nonce);
  auto it = g_maps.find(key);
  if (it == g_maps.end()) {
    const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
    char target[256] = {0};
    ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    if (n <= 0 || std::string(target) != "/memfd:" + memfd_name(h.physical, h.nonce) + " (deleted)") {
      set_last_error_message("vnpuIpcOpenMemHandle: " + path + " is not the exporter's device memory "
                             "(the exporting process is gone, or no permission to inspect it)");
      return vnpuErrorMapBufferObjectFailed;
    }
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      set_last_error_message("vnpuIpcOpenMemHandle: cannot open " + path + ": " + std::strerror(errno));
      return vnpuErrorMapBufferObjectFailed;
    }
    void* base = mmap(nullptr, h.capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
      set_last_error_message(std::string("vnpuIpcOpenMemHandle: mmap failed: ") + std::strerror(errno));
      return vnpuErrorMapBufferObjectFailed;
    }
    it = g_maps.emplace(key, Mapping{static_cast<char*>(base), h.capacity, 0, current_device()}).first;
  }
  ++it->second.refs;
  *devPtr = it->second.base + h.offset;
  return vnpuSuccess;
}

vnpuError_t vnpuIpcCloseMemHandle(void* devPtr) {
  auto* p = static_cast<char*>(devPtr);
  for (Device* d : devices()) {
    if (p >= d->mem.base && p < d->mem.base + d->mem.capacity) return vnpuSuccess;  // our own memory
  }
  std::lock_guard<std::mutex> g(g_ipc_mu);
  for (auto it = g_maps.begin(); it != g_maps.end(); ++it) {
    Mapping& m = it->second;
    if (p >= m.base && p < m.base + m.size) {
      if (--m.refs == 0) {
        munmap(m.base, m.size);
        g_maps.erase(it);
      }
      return vnpuSuccess;
    }
  }
  return vnpuErrorInvalidValue;
}
