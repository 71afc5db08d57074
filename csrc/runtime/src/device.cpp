// Devices: discovery from the environment, current device, properties, fork safety.
#include "internal.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <sstream>

namespace vnpu::rt {
namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
constexpr int kMaxDevices = 64;
constexpr size_t kDefaultCapacity = size_t(8) << 30;
std::string g_config_error;  // written once, before g_initialized is set

// Parses "8G", "512M", "1.5g", "64MB", "1073741824" (decimal digits with an
// optional fraction, then an optional K/M/G/T and B); false on anything else,
// including sizes that do not fit in 63 bits or round to 0 bytes from a
// nonzero number.
bool parse_bytes_strict(const char* text, size_t* out) {
  const char* p = text;
  int digits = 0, dots = 0;
  for (; (*p >= '0' && *p <= '9') || *p == '.'; ++p) (*p == '.' ? dots : digits) += 1;
  if (digits == 0 || dots > 1) return false;
  const double v = std::strtod(std::string(text, p).c_str(), nullptr);
  double mult = 1;
  switch (*p) {
    case 'k': case 'K': mult = 0x1p10; ++p; break;
    case 'm': case 'M': mult = 0x1p20; ++p; break;
    case 'g': case 'G': mult = 0x1p30; ++p; break;
    case 't': case 'T': mult = 0x1p40; ++p; break;
    default: break;
  }
  if (*p == 'B' || *p == 'b') ++p;
  if (*p != '\0') return false;
  const double bytes = v * mult;
  if (!(bytes < 0x1p63) || (v > 0 && bytes < 1)) return false;
  *out = static_cast<size_t>(bytes);
  return true;
}

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
  auto* list = new std::vector<Device*>();
  int physical = 2;
  if (const char* c = std::getenv("VNPU_DEVICE_COUNT")) {
    char* end = nullptr;
    long n = std::strtol(c, &end, 10);
    if (end == c || *end != '\0' || n < 0 || n > kMaxDevices) {
      g_config_error = std::string("VNPU_DEVICE_COUNT=") + c + " is not a device count; use an integer in [0, " +
                       std::to_string(kMaxDevices) + "]";
      g_initialized.store(true);
      return list;
    }
    physical = static_cast<int>(n);
  }
  size_t capacity = kDefaultCapacity;
  if (const char* m = std::getenv("VNPU_MEMORY_PER_DEVICE"); m != nullptr && *m != '\0') {
    if (!parse_bytes_strict(m, &capacity)) {
      g_config_error = std::string("VNPU_MEMORY_PER_DEVICE=") + m +
                       " is not a size; use bytes or a number with a K/M/G/T suffix, e.g. 8G or 512M";
      g_initialized.store(true);
      return list;
    }
  }
  for (int phys : visible_physical_ids(physical)) {
    auto* d = new Device();
    d->index = static_cast<int>(list->size());
    d->physical = phys;
    d->mem.capacity = capacity;
    if (!reserve_region(d->mem, phys)) {
      const int index = d->index;
      delete d;
      for (Device* x : *list) {
        munmap(x->mem.base, x->mem.capacity == 0 ? 4096 : x->mem.capacity);
        if (x->mem.fd >= 0) close(x->mem.fd);
      }
      list->clear();  // (their default streams have no worker yet)
      g_config_error = "cannot reserve " + std::to_string(capacity) + " bytes of address space for vnpu:" +
                       std::to_string(index) + " (VNPU_MEMORY_PER_DEVICE); lower it or VNPU_DEVICE_COUNT";
      break;
    }
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

}  // namespace vnpu::rt

using namespace vnpu::rt;

int vnpuIsInBadFork() { return g_bad_fork.load() ? 1 : 0; }

vnpuError_t vnpuGetDeviceCount(int* count) {
  if (count == nullptr) return vnpuErrorInvalidValue;
  *count = static_cast<int>(devices().size());
  return g_config_error.empty() ? vnpuSuccess : vnpuErrorInvalidConfiguration;
}

const char* vnpuGetConfigurationErrorString() {
  devices();
  return g_config_error.c_str();
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
