// Device management functions of the PyTorch layer (mirrors c10/cuda/CUDAFunctions.h).
// Snake_case functions throw c10::Error; device_count() never throws.
#pragma once

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <string>

namespace c10::vnpu {

// Number of visible vNPU devices (VNPU_DEVICE_COUNT / VNPU_VISIBLE_DEVICES); 0 on failure.
DeviceIndex device_count() noexcept;
DeviceIndex current_device();
// Throws if `device` is not in [0, device_count()).
void set_device(DeviceIndex device);
// Sets `device` and returns the previous one.
DeviceIndex ExchangeDevice(DeviceIndex device);
// Waits for all work on `device` (-1: current); raises pending kernel errors.
void device_synchronize(DeviceIndex device = -1);
// Throws the CUDA-style "invalid device ordinal" error for bad indices.
void check_device_index(DeviceIndex device);
// True in a child forked after the runtime was initialized (then vnpu must not be used).
bool is_in_bad_fork();

// torch.vnpu.set_sync_debug_mode (c10/cuda's SyncDebugMode): what a host wait
// the program could avoid does. Checked where CUDA checks (blocking copies,
// .item(), Stream.synchronize(), ops whose output depends on the data), not in
// synchronize()/Event.synchronize(), which are asked for explicitly.
enum class SyncDebugMode { L_DISABLED = 0, L_WARN, L_ERROR };
std::atomic<int>& sync_debug_mode_state();
inline SyncDebugMode get_sync_debug_mode() {
  return static_cast<SyncDebugMode>(sync_debug_mode_state().load(std::memory_order_relaxed));
}
void set_sync_debug_mode(SyncDebugMode mode);
// Warns or raises ("called a synchronizing vnpu operation: <what>") per the mode.
// `as_on_cuda`: false for waits only vnpu makes (an op's first call with new
// layouts, ...): those warn in "warn" only, so code clean under CUDA's "error" runs.
void warn_or_error_on_sync(const std::string& what, bool as_on_cuda = true);
inline void check_sync(const char* what, bool as_on_cuda = true) {
  if (C10_UNLIKELY(get_sync_debug_mode() != SyncDebugMode::L_DISABLED)) warn_or_error_on_sync(what, as_on_cuda);
}
// While alive, the calling thread's waits are not reported: they belong to an
// operation reported already (a synchronous op copying its outputs back).
class SyncReportedGuard {
 public:
  SyncReportedGuard();
  ~SyncReportedGuard();
  SyncReportedGuard(const SyncReportedGuard&) = delete;
  SyncReportedGuard& operator=(const SyncReportedGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace c10::vnpu
