// Pinned host memory for vnpu (mirrors at::cuda::getCachingHostAllocator):
// tensor.pin_memory(), DataLoader(pin_memory=True) and non_blocking copies use
// it. A freed pinned block is reused only after the streams that copied from
// or to it have passed those copies (events recorded by the copy code).
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace at::vnpu {

at::HostAllocator* getVNPUHostAllocator();
// True if `ptr` points into memory from vnpuMallocHost.
bool isPinnedPtr(const void* ptr);

}  // namespace at::vnpu
