// VNPU_CHECK: turns a runtime error code into the matching PyTorch exception.
// Mirrors C10_CUDA_CHECK (c10/cuda/CUDAException.h): file/function/line in the
// message, the failing kernel's own message for asynchronous errors.
#pragma once

#include <vnpu/runtime.h>

#include <c10/util/Exception.h>

namespace c10::vnpu {

// Throws c10::Error (RuntimeError), c10::OutOfMemoryError or c10::IndexError;
// for vnpuErrorInterrupted, whatever the interrupt raiser throws.
[[noreturn]] C10_NOINLINE void throw_runtime_error(
    vnpuError_t err, const char* expr, const char* file, const char* func, int line);

// Raises the exception that interrupted a host wait (vnpuErrorInterrupted; Note
// [Interrupting host waits] in csrc/python/Interrupts.cpp). Installed by the
// Python bindings to re-raise the KeyboardInterrupt (or whatever a Python
// signal handler raised); without one, a c10::Error says the wait was interrupted.
using InterruptRaiser = void (*)();  // must throw
void set_interrupt_raiser(InterruptRaiser raiser);

// Raises the sanitizer's error (vnpuErrorStreamRace, vnpuErrorUseAfterFree)
// from the runtime's report; installed by csrc/sanitizer. `op` names the
// refused call when known (else the report's task name).
using SanitizerRaiser = void (*)(vnpuError_t err, const char* op);  // must throw
void set_sanitizer_raiser(SanitizerRaiser raiser);

// Waits of this thread inside the scope are not cut short by interrupts: for
// code that waits while holding a lock that a thread holding the GIL may need
// (the caching allocator's; a tensor freed with the GIL held takes it), since
// polling for signals takes the GIL.
class NoInterruptGuard {
 public:
  NoInterruptGuard();
  ~NoInterruptGuard();
  NoInterruptGuard(const NoInterruptGuard&) = delete;
  NoInterruptGuard& operator=(const NoInterruptGuard&) = delete;
};
bool interrupts_allowed();

}  // namespace c10::vnpu

#define VNPU_CHECK(EXPR)                                                           \
  do {                                                                             \
    const vnpuError_t __vnpu_err = (EXPR);                                         \
    if (C10_UNLIKELY(__vnpu_err != vnpuSuccess)) {                                 \
      ::c10::vnpu::throw_runtime_error(__vnpu_err, #EXPR, __FILE__, __func__, __LINE__); \
    }                                                                              \
  } while (0)

namespace c10::vnpu {

// Raises the current device's pending asynchronous error, if any: what a
// successful cudaEventQuery / cudaStreamQuery returns instead of cudaSuccess
// after an earlier kernel failed, so that polling a query cannot read a result
// whose producer failed.
inline void raisePendingError() {
  if (vnpuPeekAtLastError() != vnpuSuccess) VNPU_CHECK(vnpuGetLastError());
}

}  // namespace c10::vnpu
