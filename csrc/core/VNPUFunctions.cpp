#include "VNPUFunctions.h"

#include "VNPUException.h"

namespace c10::vnpu {

DeviceIndex device_count() noexcept {
  int n = 0;
  if (vnpuGetDeviceCount(&n) != vnpuSuccess) {
    // As torch.cuda.device_count() with a broken driver: 0 devices and a
    // warning; using a device then raises the same message.
    try {
      TORCH_WARN_ONCE("vNPU initialization: ", vnpuGetConfigurationErrorString(), ". No vnpu devices are available.");
    } catch (...) {  // warnings turned into errors must not escape a noexcept query
    }
    return 0;
  }
  return static_cast<DeviceIndex>(n);
}

void check_device_index(DeviceIndex device) {
  const char* config_error = vnpuGetConfigurationErrorString();
  TORCH_CHECK(*config_error == '\0', "vNPU is not available: ", config_error);
  TORCH_CHECK(device >= 0 && device < device_count(), "Invalid device ordinal: vnpu:", int(device),
              ". Expected an index in [0, ", int(device_count()),
              "); set VNPU_DEVICE_COUNT or VNPU_VISIBLE_DEVICES for more devices.");
}

DeviceIndex current_device() {
  int d = 0;
  VNPU_CHECK(vnpuGetDevice(&d));
  return static_cast<DeviceIndex>(d);
}

void set_device(DeviceIndex device) {
  check_device_index(device);
  VNPU_CHECK(vnpuSetDevice(device));
}

DeviceIndex ExchangeDevice(DeviceIndex device) {
  DeviceIndex prev = current_device();
  if (device != prev) set_device(device);
  return prev;
}

void device_synchronize(DeviceIndex device) {
  if (device < 0) {
    VNPU_CHECK(vnpuDeviceSynchronize());
    return;
  }
  DeviceIndex prev = ExchangeDevice(device);
  vnpuError_t err = vnpuDeviceSynchronize();
  set_device(prev);
  VNPU_CHECK(err);
}

bool is_in_bad_fork() { return vnpuIsInBadFork() != 0; }

std::atomic<int>& sync_debug_mode_state() {
  static std::atomic<int> mode{static_cast<int>(SyncDebugMode::L_DISABLED)};
  return mode;
}

void set_sync_debug_mode(SyncDebugMode mode) {
  sync_debug_mode_state().store(static_cast<int>(mode), std::memory_order_relaxed);
}

namespace {
thread_local bool sync_reported = false;
}  // namespace

SyncReportedGuard::SyncReportedGuard() : prev_(sync_reported) { sync_reported = true; }
SyncReportedGuard::~SyncReportedGuard() { sync_reported = prev_; }

void warn_or_error_on_sync(const std::string& what, bool as_on_cuda) {
  const SyncDebugMode mode = get_sync_debug_mode();
  if (mode == SyncDebugMode::L_DISABLED || sync_reported) return;
  // vnpu-only waits: a warning in "warn" only, so code clean under CUDA's "error" (even with warnings
  // turned into errors) runs unchanged.
  if (mode == SyncDebugMode::L_ERROR && !as_on_cuda) return;
  if (mode == SyncDebugMode::L_ERROR && as_on_cuda) {
    TORCH_CHECK(false, "called a synchronizing vnpu operation: ", what,
                ". torch.vnpu.set_sync_debug_mode(\"warn\") reports it without raising, \"default\" allows it.");
  }
  TORCH_WARN("called a synchronizing vnpu operation: ", what);
}

}  // namespace c10::vnpu
