// See Note [Compiled kernels on the stream] in KernelLaunch.h.
#include "KernelLaunch.h"

#include "../core/VNPUFunctions.h"
#include "../ops/Executor.h"
#include "../sanitizer/Sanitizer.h"

#include <ATen/record_function.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <memory>
#include <string>

namespace at::vnpu {
namespace {

// The accesses host_scalar declared for the launch that follows on this thread (sanitizer only).
thread_local sanitizer::Accesses t_pending;

// Enqueues run(args) under `name`; throws on a bad device or (VNPU_LAUNCH_BLOCKING=1) the kernel's own error.
// `accesses`: the memory the kernel touches, for VNPU_SANITIZE (nullptr: not declared).
void enqueue(const char* name, long device, void (*run)(void*), std::shared_ptr<void> owned,
             const sanitizer::Accesses* accesses) {
  c10::vnpu::check_device_index(static_cast<DeviceIndex>(device));
  // The launch as an operator named after the kernel, for torch.profiler
  // (Inductor's Triton launcher does the same on CUDA); free when no
  // profiler is on.
  RECORD_FUNCTION(name, c10::ArrayRef<const c10::IValue>{});
  // launch() releases the host's OpenMP pool first (Note [One OpenMP pool]):
  // the fused kernels use OpenMP too.
  launch(name, static_cast<DeviceIndex>(device), [run, owned = std::move(owned)] { run(owned.get()); },
         sanitizer::enabled() ? accesses : nullptr);
}

int launch_kernel(const char* name, long device, void (*run)(void*), void* args, void (*destroy)(void*)) {
  // Owned from here on: freed after the kernel ran, or now if it cannot be enqueued.
  std::shared_ptr<void> owned(args, destroy);
  try {
    sanitizer::Accesses acc = std::move(t_pending);
    t_pending = sanitizer::Accesses();
    enqueue(name, device, run, std::move(owned), &acc);
    return 0;
  } catch (...) {
    t_pending = sanitizer::Accesses();
    torch::translate_exception_to_python(std::current_exception());
    return -1;
  }
}

int launch_kernel_without_gil(const char* name, long device, void (*run)(void*), void* args,
                              void (*destroy)(void*)) {
  std::shared_ptr<void> owned(args, destroy);
  try {
    sanitizer::Accesses acc = std::move(t_pending);  // declare_access's
    t_pending = sanitizer::Accesses();
    enqueue(name, device, run, std::move(owned), &acc);
    return 0;
  } catch (...) {
    t_pending = sanitizer::Accesses();
    const PyGILState_STATE gil = PyGILState_Ensure();
    torch::translate_exception_to_python(std::current_exception());
    PyGILState_Release(gil);
    return -1;
  }
}

// The message of the last failed launch_or_error on this thread.
thread_local std::string t_error;

const char* launch_or_error(const char* name, long device, void (*run)(void*), void* args, void (*destroy)(void*)) {
  std::shared_ptr<void> owned(args, destroy);
  try {
    sanitizer::Accesses acc = std::move(t_pending);  // declare_access's
    t_pending = sanitizer::Accesses();
    enqueue(name, device, run, std::move(owned), &acc);
    return nullptr;
  } catch (const c10::Error& e) {
    t_pending = sanitizer::Accesses();
    t_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    t_pending = sanitizer::Accesses();
    t_error = e.what();
  }
  return t_error.c_str();
}

int host_scalar(PyObject* obj, void* dst, size_t capacity, int writes) {
  try {
    TORCH_CHECK_TYPE(THPVariable_Check(obj), "a vnpu kernel expected a tensor argument, but got ",
                     Py_TYPE(obj)->tp_name);
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.device().type() == c10::DeviceType::PrivateUse1) {
      if (sanitizer::enabled()) {
        t_pending.add(t.storage().data(), t.storage().nbytes(), t.sizes(), t.strides(), t.storage_offset(),
                      t.scalar_type(), t.device().index(), writes != 0,
                      std::string(writes ? "output" : "input") + " pointer " + std::to_string(t_pending.size()));
      }
      return 0;
    }
    const size_t bytes = t.numel() * t.element_size();
    TORCH_CHECK(t.device().is_cpu() && t.numel() <= 1 && bytes <= capacity,
                "a compiled vnpu kernel can take a CPU tensor only as a scalar (0-dim, at most ", capacity,
                " bytes), but got one of shape ", t.sizes(), " on ", t.device());
    if (bytes > 0) std::memcpy(dst, t.const_data_ptr(), bytes);
    return 1;
  } catch (...) {
    t_pending = sanitizer::Accesses();
    torch::translate_exception_to_python(std::current_exception());
    return -1;
  }
}

int declare_access(void* tensor, int writes) {
  if (!sanitizer::enabled() || tensor == nullptr) return 0;
  const at::Tensor& t = *static_cast<const at::Tensor*>(tensor);  // an AtenTensorHandle is an at::Tensor*
  if (t.device().type() != c10::DeviceType::PrivateUse1 || !t.has_storage()) return 0;
  t_pending.add(t.storage().data(), t.storage().nbytes(), t.sizes(), t.strides(), t.storage_offset(), t.scalar_type(),
                t.device().index(), writes != 0,
                std::string(writes ? "output" : "input") + " pointer " + std::to_string(t_pending.size()));
  return 0;
}

}  // namespace

const InductorLaunchApi* inductor_launch_api() {
  static const InductorLaunchApi api{kInductorLaunchApiVersion, &launch_kernel, &host_scalar,
                                     &launch_kernel_without_gil, &declare_access, &launch_or_error};
  return &api;
}

}  // namespace at::vnpu
