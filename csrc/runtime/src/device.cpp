// Devices: discovery from the environment, initialization, current device, properties, fork safety.
//
// Note [Discovery and initialization]
// Discovery (the first call of any kind) reads the VNPU_* variables, creates
// the device objects and reserves each device's address range with no access
// and no backing. Initialization (vnpuInit, or the first call that needs a
// context: allocating device memory, starting a stream's work, VMM calls)
// backs that range with the device's physical pages. Only initialization
// counts for fork(): a child forked after it cannot use the runtime (the
// parent's stream workers do not exist there, and its device memory is a
// shared mapping of the parent's pages), while a child forked after mere
// discovery (vnpuGetDeviceCount, vnpuGetDeviceProperties, vnpuSetDevice)
// initializes a runtime of its own, as torch.cuda's device_count() leaves
// CUDA usable in a child.
#include "internal.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <sstream>

namespace vnpu::rt {
namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
std::mutex g_init_mu;  // serializes initialize()
constexpr int kMaxDevices = 64;
constexpr size_t kDefaultCapacity = size_t(8) << 30;
std::string g_config_error;     // written once, during discovery
std::string g_config_warnings;  // written once, during discovery
bool g_launch_blocking = false;  // VNPU_LAUNCH_BLOCKING, read during discovery
bool g_ipc = true;               // VNPU_IPC, read during discovery

// Note [Boolean environment variables]
// One rule for every boolean VNPU_* variable, PyTorch's own (c10::utils::check_env
// in torch 2.13): "1" is on, "0" is off, unset keeps the default. Anything else
// ("true", "yes", " 1", "2", "") is not understood: the default applies and the
// value is reported, never silently taken either way.
bool parse_flag(const char* name, bool default_value, std::string* warning) {
  const char* v = std::getenv(name);
  if (v == nullptr) return default_value;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  if (warning != nullptr) {
    *warning = std::string("Ignoring invalid value for boolean flag ") + name + ": '" + v +
               "'; valid values are 0 or 1 (as PyTorch's own flags). Using the default (" +
               (default_value ? "1" : "0") + ").";
  }
  return default_value;
}

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

size_t region_bytes(const MemoryRegion& m) { return m.capacity == 0 ? 4096 : m.capacity; }

// Backs a device's reserved range with its physical pages: a memfd mapped shared
// (so vnpuMemMap can map the same pages elsewhere), or private anonymous memory
// if memfd is unavailable (then the VMM calls report vnpuErrorNotSupported).
void back_region(MemoryRegion& m, int physical) {
  const size_t bytes = region_bytes(m);
  std::random_device rd;
  const uint64_t nonce = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
  int fd = memfd_create(memfd_name(physical, nonce).c_str(), MFD_CLOEXEC);
  if (fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
        mmap(m.base, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) != MAP_FAILED) {
      m.fd = fd;
      m.nonce = nonce;
      return;
    }
    close(fd);
  }
  // MAP_FIXED over our own reservation cannot fail for lack of address space.
  mmap(m.base, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
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
  std::string warning;
  g_launch_blocking = parse_flag("VNPU_LAUNCH_BLOCKING", false, &warning);
  if (!warning.empty()) g_config_warnings += warning + "\n";
  warning.clear();
  if (parse_flag("VNPU_SANITIZE", false, &warning)) {
    san::g_on.store(true);
    san::setup_host_check();  // check 4: See Note [Protection keys] (host_access.cpp)
  }
  if (!warning.empty()) g_config_warnings += warning + "\n";
  warning.clear();
  g_ipc = parse_flag("VNPU_IPC", true, &warning);
  if (!warning.empty()) g_config_warnings += warning + "\n";
  int physical = 2;
  if (const char* c = std::getenv("VNPU_DEVICE_COUNT")) {
    char* end = nullptr;
    long n = std::strtol(c, &end, 10);
    if (end == c || *end != '\0' || n < 0 || n > kMaxDevices) {
      g_config_error = std::string("VNPU_DEVICE_COUNT=") + c + " is not a device count; use an integer in [0, " +
                       std::to_string(kMaxDevices) + "]";
      return list;
    }
    physical = static_cast<int>(n);
  }
  size_t capacity = kDefaultCapacity;
  if (const char* m = std::getenv("VNPU_MEMORY_PER_DEVICE"); m != nullptr && *m != '\0') {
    if (!parse_bytes_strict(m, &capacity)) {
      g_config_error = std::string("VNPU_MEMORY_PER_DEVICE=") + m +
                       " is not a size; use bytes or a number with a K/M/G/T suffix, e.g. 8G or 512M";
      return list;
    }
  }
  for (int phys : visible_physical_ids(physical)) {
    auto* d = new Device();
    d->index = static_cast<int>(list->size());
    d->physical = phys;
    d->mem.capacity = capacity;
    // Address space only (no access, no backing): see Note [Discovery and initialization].
    void* base = mmap(nullptr, region_bytes(d->mem), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      const int index = d->index;
      delete d;
      for (Device* x : *list) munmap(x->mem.base, region_bytes(x->mem));
      list->clear();  // (their default streams have no worker yet)
      g_config_error = "cannot reserve " + std::to_string(capacity) + " bytes of address space for vnpu:" +
                       std::to_string(index) + " (VNPU_MEMORY_PER_DEVICE); lower it or VNPU_DEVICE_COUNT";
      break;
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
  return list;
}

}  // namespace

std::vector<Device*>& devices() {
  static std::vector<Device*>* list = create_devices();  // never freed: see internal.h
  return *list;
}

vnpuError_t initialize() {
  if (g_bad_fork.load()) return vnpuErrorForkedAfterInit;
  if (g_initialized.load(std::memory_order_acquire)) return vnpuSuccess;
  std::vector<Device*>& list = devices();
  std::lock_guard<std::mutex> g(g_init_mu);
  if (!g_initialized.load()) {
    for (Device* d : list) back_region(d->mem, d->physical);
    if (san::on()) san::protect_devices();  // Note [Protection keys] (host_access.cpp)
    g_initialized.store(true, std::memory_order_release);
  }
  return vnpuSuccess;
}

bool launch_blocking() {
  devices();
  return g_launch_blocking;
}

bool ipc_enabled() {
  devices();
  return g_ipc;
}

bool wait_device_idle(int device, bool interruptible) {
  Device* d = devices()[device];
  std::vector<vnpuStream_st*> streams;
  {
    // Copied, not held while waiting: a wait-interrupt hook may take other
    // locks (the GIL) that a thread creating a stream holds. Stream objects
    // are never freed, so the copies stay valid.
    std::lock_guard<std::mutex> g(d->streams_mu);
    streams = d->streams;
  }
  for (auto* s : streams) {
    if (!s->wait_idle(interruptible)) return false;
  }
  return true;
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

vnpuError_t vnpuInit(unsigned flags) {
  if (flags != 0) return vnpuErrorInvalidValue;
  return initialize();
}

int vnpuIsInitialized() { return g_initialized.load() && !g_bad_fork.load() ? 1 : 0; }

const char* vnpuGetConfigurationWarningString() {
  devices();
  return g_config_warnings.c_str();
}

vnpuError_t vnpuGetEnvFlag(const char* name, int default_value, int* value) {
  if (name == nullptr || value == nullptr) return vnpuErrorInvalidValue;
  const char* v = std::getenv(name);
  *value = parse_flag(name, default_value != 0, nullptr) ? 1 : 0;
  const bool understood = v == nullptr || std::strcmp(v, "1") == 0 || std::strcmp(v, "0") == 0;
  return understood ? vnpuSuccess : vnpuErrorInvalidValue;
}

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

vnpuError_t vnpuDeviceWaitIdle(int device) {
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  if (!valid_device(device)) return vnpuErrorInvalidDevice;
  if (!vnpuIsInitialized()) return vnpuSuccess;  // nothing was ever queued
  // While a graph is being captured the host must not wait (the capture
  // would fail); captured work is recorded, not run, and runs under the modes
  // of its replay.
  if (any_capture()) return vnpuSuccess;
  return wait_device_idle(device, /*interruptible=*/true) ? vnpuSuccess : vnpuErrorInterrupted;
}

vnpuError_t vnpuDeviceSynchronize() {
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  int dev = current_device();
  if (!valid_device(dev)) return vnpuErrorInvalidDevice;
  if (vnpuError_t e = check_device_not_capturing(dev, "vnpuDeviceSynchronize (torch.vnpu.synchronize())"); e != vnpuSuccess)
    return e;
  if (!wait_device_idle(dev, /*interruptible=*/true)) return vnpuErrorInterrupted;
  if (san::on()) {
    san::host_waited();
    if (vnpuError_t e = san::report_host_access(nullptr, "vnpuDeviceSynchronize"); e != vnpuSuccess) return e;
  }
  return take_device_error(dev);
}
