#include "VNPUException.h"

#include <atomic>
#include <string>

namespace c10::vnpu {

namespace {

std::atomic<InterruptRaiser> g_interrupt_raiser{nullptr};
std::atomic<SanitizerRaiser> g_sanitizer_raiser{nullptr};
thread_local int t_no_interrupt_depth = 0;

// Runtime errors become torch.AcceleratorError (a RuntimeError) in Python, as
// C10_CUDA_CHECK's do for CUDA errors.
[[noreturn]] void throw_accelerator_error(vnpuError_t err, const char* func, const char* file, int line,
                                          const std::string& msg) {
  throw c10::AcceleratorError({func, file, static_cast<uint32_t>(line)}, static_cast<int32_t>(err), msg);
}

}  // namespace

void throw_runtime_error(vnpuError_t err, const char* expr, const char* file, const char* func,
                         int line) {
  std::string where = std::string(" (") + expr + " at " + file + ":" + std::to_string(line) + ")";
  switch (err) {
    case vnpuErrorStreamRace:
    case vnpuErrorUseAfterFree:
    case vnpuErrorHostAccess:
      if (SanitizerRaiser raise = g_sanitizer_raiser.load()) raise(err, nullptr);
      TORCH_CHECK(false, "vNPU error: ", vnpuGetErrorString(err), where);
    case vnpuErrorInterrupted:
      if (InterruptRaiser raise = g_interrupt_raiser.load()) raise();
      TORCH_CHECK(false, "vNPU: a wait for the device was interrupted; the work waited for continues", where);
    case vnpuErrorLaunchFailure:
      // As on CUDA, an asynchronous kernel failure surfaces at the next
      // synchronizing call, carrying the kernel's name and its own message.
    {
      // Under VNPU_LAUNCH_BLOCKING=1 the error is already raised at the failing call: no hint.
      static const bool blocking = [] {
        int v = 0;
        return vnpuGetEnvFlag("VNPU_LAUNCH_BLOCKING", 0, &v) == vnpuSuccess && v == 1;
      }();
      throw_accelerator_error(err, func, file, line,
                              std::string("vNPU error: ") + vnpuGetLastErrorString() +
                                  (blocking ? std::string()
                                            : std::string("\nvNPU kernel errors are reported asynchronously at the "
                                                          "next synchronizing call; set VNPU_LAUNCH_BLOCKING=1 to "
                                                          "raise them at the failing call.")));
    }
    case vnpuErrorMemoryAllocation:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "vNPU out of memory", where);
    case vnpuErrorForkedAfterInit:
      TORCH_CHECK(false,
                  "Cannot re-initialize vNPU in forked subprocess. To use vNPU with "
                  "multiprocessing, you must use the 'spawn' start method");
    case vnpuErrorStreamCaptureUnsupported:
    case vnpuErrorStreamCaptureInvalidated:
    case vnpuErrorStreamCaptureIsolation:
    case vnpuErrorStreamCaptureWrongThread:
    case vnpuErrorStreamCaptureUnjoined:
    case vnpuErrorCapturedEvent:
    case vnpuErrorIllegalState:
      // Graph capture (CUDA's codes): the runtime's message names the call and what to do.
      throw_accelerator_error(err, func, file, line,
                              std::string("vNPU error: ") + vnpuGetErrorString(err) + ": " + vnpuGetLastErrorString() +
                                  where);
    case vnpuErrorInvalidDevice:
      throw_accelerator_error(err, func, file, line, "vNPU error: invalid device ordinal" + where);
    default:
      throw_accelerator_error(err, func, file, line, std::string("vNPU error: ") + vnpuGetErrorString(err) + where);
  }
}

void set_interrupt_raiser(InterruptRaiser raiser) { g_interrupt_raiser.store(raiser); }
void set_sanitizer_raiser(SanitizerRaiser raiser) { g_sanitizer_raiser.store(raiser); }

NoInterruptGuard::NoInterruptGuard() { ++t_no_interrupt_depth; }
NoInterruptGuard::~NoInterruptGuard() { --t_no_interrupt_depth; }
bool interrupts_allowed() { return t_no_interrupt_depth == 0; }

}  // namespace c10::vnpu
