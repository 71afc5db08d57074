#include "VNPUException.h"

#include <string>

namespace c10::vnpu {

void throw_runtime_error(vnpuError_t err, const char* expr, const char* file, const char* func,
                         int line) {
  std::string where = std::string(" (") + expr + " at " + file + ":" + std::to_string(line) + ")";
  switch (err) {
    case vnpuErrorLaunchFailure: {
      // As on CUDA, an asynchronous kernel failure surfaces as RuntimeError
      // carrying the kernel's name and its own message.
      TORCH_CHECK(false, "vNPU error: ", vnpuGetLastErrorString(),
                  "\nvNPU kernel errors are reported asynchronously at the next synchronizing "
                  "call; set VNPU_LAUNCH_BLOCKING=1 to raise them at the failing call.");
    }
    case vnpuErrorMemoryAllocation:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "vNPU out of memory", where);
    case vnpuErrorForkedAfterInit:
      TORCH_CHECK(false,
                  "Cannot re-initialize vNPU in forked subprocess. To use vNPU with "
                  "multiprocessing, you must use the 'spawn' start method");
    case vnpuErrorInvalidDevice:
      TORCH_CHECK(false, "vNPU error: invalid device ordinal", where);
    default:
      TORCH_CHECK(false, "vNPU error: ", vnpuGetErrorString(err), where);
  }
}

}  // namespace c10::vnpu
