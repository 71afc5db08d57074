// VNPU_CHECK: turns a runtime error code into the matching PyTorch exception.
// Mirrors C10_CUDA_CHECK (c10/cuda/CUDAException.h): file/function/line in the
// message, the failing kernel's own message for asynchronous errors.
#pragma once

#include <vnpu/runtime.h>

#include <c10/util/Exception.h>

namespace c10::vnpu {

// Throws c10::Error (RuntimeError), c10::OutOfMemoryError or c10::IndexError.
[[noreturn]] C10_NOINLINE void throw_runtime_error(
    vnpuError_t err, const char* expr, const char* file, const char* func, int line);

}  // namespace c10::vnpu

#define VNPU_CHECK(EXPR)                                                           \
  do {                                                                             \
    const vnpuError_t __vnpu_err = (EXPR);                                         \
    if (C10_UNLIKELY(__vnpu_err != vnpuSuccess)) {                                 \
      ::c10::vnpu::throw_runtime_error(__vnpu_err, #EXPR, __FILE__, __func__, __LINE__); \
    }                                                                              \
  } while (0)
