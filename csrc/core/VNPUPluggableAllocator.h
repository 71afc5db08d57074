// A device allocator made of two C functions from a shared library (mirrors
// torch.cuda.memory.CUDAPluggableAllocator): torch.vnpu.memory.VNPUPluggableAllocator.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <vnpu/runtime.h>

namespace c10::vnpu::allocator {

// CUDA's signatures with vnpu's stream type.
using PluggableAllocFn = void* (*)(size_t size, int device, vnpuStream_t stream);
using PluggableFreeFn = void (*)(void* ptr, size_t size, int device, vnpuStream_t stream);

// An allocator calling `alloc` for each allocation (on the current device and stream) and `free` with the
// same size, device and stream when the tensor's storage dies (on the thread that drops it, which may be an
// autograd or collectives thread: `free` must be thread-safe). Leaked on purpose (tensors may die at exit).
c10::DeviceAllocator* createPluggableAllocator(PluggableAllocFn alloc, PluggableFreeFn free);

}  // namespace c10::vnpu::allocator
