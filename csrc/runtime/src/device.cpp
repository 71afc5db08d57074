// Devices: discovery from the environment, current device, properties, fork safety.
#include "internal.h"

#include <pthread.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace vnpu::rt {
namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
constexpr int kMaxDevices = 64;
constexpr size_t kDefaultCapacity = size_t(8) << 30;

void on_fork_child() {
  if (g_initialized.load()) g_bad_fork.store(true);
}

std::vector<int> visible_physical_ids(int physical_count) {
  std::vector<int> ids;
  const char* vis = std::getenv("VNPU_VISIBLE_DEVICES");
  if (vis == nullptr) {
    for (int i = 0; i < physical_count; ++i) ids.push_back(i);
    return ids;
  }
  // Like CUDA_VISIBLE_DEVICES: stop at the first invalid or repeated entry.
  std::stringstream ss(vis);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long id = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || id < 0 || id >= physical_count) break;
    bool repeated = false;
    for (int x : ids) repeated |= (x == id);
    if (repeated) break;
    ids.push_back(static_cast<int>(id));
  }
  return ids;
}

std::vector<Device*>* create_devices() {
  pthread_atfork(nullptr, nullptr, on_fork_child);
  int physical = 2;
  if (const char* c = std::getenv("VNPU_DEVICE_COUNT")) {
    physical = std::atoi(c);
    if (physical < 0) physical = 0;
    if (physical > kMaxDevices) physical = kMaxDevices;
  }
  size_t capacity = parse_bytes(std::getenv("VNPU_MEMORY_PER_DEVICE"), kDefaultCapacity);
  auto* list = new std::vector<Device*>();
  for (int phys : visible_physical_ids(physical)) {
    auto* d = new Device();
    d->index = static_cast<int>(list->size());
    d->physical = phys;
    d->mem.capacity = capacity;
    void* base = mmap(nullptr, capacity == 0 ? 4096 : capacity, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      delete d;
      break;  // address space exhausted: expose the devices we could map
    }
    d->mem.base = static_cast<char*>(base);
    if (capacity > 0) d->mem.free_[0] = capacity;
    auto* s = new vnpuStream_st();
    s->device = d->index;
    s->is_default = true;
    d->default_stream = s;
    d->streams.push_back(s);
    list->push_back(d);
  }
  g_initialized.store(true);
  return list;
}

}  // namespace

std::vector<Device*>& devices() {
  static std::vector<Device*>* list = create_devices();  // never freed: see internal.h
  return *list;
}

bool launch_blocking() {
  static const bool blocking = [] {
    const char* v = std::getenv("VNPU_LAUNCH_BLOCKING");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return blocking;
}

int& current_device() {
  thread_local int device = 0;
  return device;
}

bool valid_device(int device) {
  return device >= 0 && device < static_cast<int>(devices().size());
}

size_t parse_bytes(const char* text, size_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || v < 0) return fallback;
  size_t mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = size_t(1) << 10; break;
    case 'm': case 'M': mult = size_t(1) << 20; break;
    case 'g': case 'G': mult = size_t(1) << 30; break;
    case 't': case 'T': mult = size_t(1) << 40; break;
    case '\0': break;
    default: return fallback;
  }
  return static_cast<size_t>(v * static_cast<double>(mult));
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

int vnpuIsInBadFork() { return g_bad_fork.load() ? 1 : 0; }

vnpuError_t vnpuGetDeviceCount(int* count) {
  if (count == nullptr) return vnpuErrorInvalidValue;
  *count = static_cast<int>(devices().size());
  return vnpuSuccess;
}

vnpuError_t vnpuSetDevice(int device) {
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  if (!valid_device(device)) return vnpuErrorInvalidDevice;
  current_device() = device;
  return vnpuSuccess;
}

vnpuError_t vnpuGetDevice(int* device) {
  if (device == nullptr) return vnpuErrorInvalidValue;
  *device = current_device();
  return vnpuSuccess;
}

vnpuError_t vnpuGetDeviceProperties(vnpuDeviceProp* prop, int device) {
  if (prop == nullptr) return vnpuErrorInvalidValue;
  if (!valid_device(device)) return vnpuErrorInvalidDevice;
  Device* d = devices()[device];
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "vNPU (virtual, physical id %d)", d->physical);
  prop->totalGlobalMem = d->mem.capacity;
  unsigned hw = std::thread::hardware_concurrency();
  prop->multiProcessorCount = hw == 0 ? 1 : static_cast<int>(hw);
  prop->major = 1;
  prop->minor = 0;
  return vnpuSuccess;
}

vnpuError_t vnpuDeviceSynchronize() {
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  int dev = current_device();
  if (!valid_device(dev)) return vnpuErrorInvalidDevice;
  Device* d = devices()[dev];
  {
    // Held while waiting so no stream is destroyed under us.
    std::lock_guard<std::mutex> g(d->streams_mu);
    for (auto* s : d->streams) s->wait_idle();
  }
  return take_device_error(dev);
}
