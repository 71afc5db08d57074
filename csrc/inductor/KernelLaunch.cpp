// See Note [Compiled kernels on the stream] in KernelLaunch.h.
#include "KernelLaunch.h"

#include "../core/VNPUFunctions.h"
#include "../ops/Executor.h"

#include <torch/csrc/Exceptions.h>

#include <memory>

namespace at::vnpu {

int inductor_launch(const char* name, long device, void (*run)(void*), void* args, void (*destroy)(void*)) {
  // Owned from here on: freed after the kernel ran, or now if it cannot be enqueued.
  std::shared_ptr<void> owned(args, destroy);
  try {
    c10::vnpu::check_device_index(static_cast<DeviceIndex>(device));
    // launch() releases the host's OpenMP pool first (Note [One OpenMP pool]):
    // the fused kernels use OpenMP too.
    launch(name, static_cast<DeviceIndex>(device), [run, owned = std::move(owned)] { run(owned.get()); });
    return 0;
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return -1;
  }
}

}  // namespace at::vnpu
