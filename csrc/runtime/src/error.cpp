// Error codes, messages and the per-device asynchronous ("sticky until reported") error.
#include "internal.h"

namespace vnpu::rt {
namespace {
thread_local std::string t_last_message;
}

void set_last_error_message(std::string msg) { t_last_message = std::move(msg); }

void record_device_error(int device, vnpuError_t err, std::string msg) {
  Device* d = devices()[device];
  std::lock_guard<std::mutex> g(d->err_mu);
  if (d->error == vnpuSuccess) {  // keep the first failure: later ones are usually consequences
    d->error = err;
    d->error_msg = std::move(msg);
  }
}

vnpuError_t take_device_error(int device) {
  // The current device may be invalid (e.g. 0 when no device is visible):
  // such a device has no pending error, and devices()[device] would be out of bounds.
  if (!valid_device(device)) return vnpuSuccess;
  Device* d = devices()[device];
  std::lock_guard<std::mutex> g(d->err_mu);
  vnpuError_t e = d->error;
  if (e != vnpuSuccess) {
    t_last_message = std::move(d->error_msg);
    d->error_msg.clear();
    d->error = vnpuSuccess;
  }
  return e;
}

vnpuError_t peek_device_error(int device) {
  if (!valid_device(device)) return vnpuSuccess;  // see take_device_error
  Device* d = devices()[device];
  std::lock_guard<std::mutex> g(d->err_mu);
  if (d->error != vnpuSuccess) t_last_message = d->error_msg;
  return d->error;
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

const char* vnpuGetErrorString(vnpuError_t error) {
  switch (error) {
    case vnpuSuccess: return "no error";
    case vnpuErrorInvalidValue: return "invalid argument";
    case vnpuErrorMemoryAllocation: return "out of memory";
    case vnpuErrorInvalidDevice: return "invalid device ordinal";
    case vnpuErrorNotReady: return "device not ready";
    case vnpuErrorInvalidResourceHandle: return "invalid resource handle";
    case vnpuErrorLaunchFailure: return "kernel failed on the device";
    case vnpuErrorInvalidConfiguration: return "invalid configuration (see vnpuGetConfigurationErrorString)";
    case vnpuErrorForkedAfterInit:
      return "the vNPU runtime cannot be used in a process forked after it was initialized";
    case vnpuErrorMapBufferObjectFailed:
      return "the exporting process's device memory could not be mapped (process gone, or no permission)";
    case vnpuErrorNotSupported:
      return "operation not supported (device memory is not shareable: VNPU_IPC=0, or memfd unavailable)";
    case vnpuErrorInterrupted: return "the wait was interrupted (the work waited for continues)";
    case vnpuErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case vnpuErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case vnpuErrorStreamCaptureIsolation:
      return "operation would make the capture depend on work outside it";
    case vnpuErrorStreamCaptureUnjoined: return "capture unjoined: a stream that joined it was not joined back";
    case vnpuErrorStreamCaptureWrongThread:
      return "attempt to end a capture begun by another thread";
    case vnpuErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case vnpuErrorIllegalState: return "operation not permitted in the stream's current state";
    case vnpuErrorStreamRace: return "sanitizer: access not ordered after a conflicting access of another stream";
    case vnpuErrorUseAfterFree: return "sanitizer: access to freed device memory";
    case vnpuErrorHostAccess: return "sanitizer: host code accessed device memory directly";
  }
  return "unknown error";
}

const char* vnpuGetLastErrorString() { return t_last_message.c_str(); }

vnpuError_t vnpuGetLastError() { return take_device_error(current_device()); }
vnpuError_t vnpuPeekAtLastError() { return peek_device_error(current_device()); }
vnpuError_t vnpuDevicePeekError(int device) { return peek_device_error(device); }
