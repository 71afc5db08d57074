// The stream-ordered executor: runs any ATen op on vnpu tensors.
//
// For an op that reaches the PrivateUse1 backend fallback (see DESIGN.md,
// "Eager execution"):
//  1. On the calling thread: check devices, compute output metadata with the
//     op's Meta kernel, allocate outputs from the caching allocator on the
//     current stream, snapshot every tensor argument (TensorSpec) and enqueue
//     one task on the current stream. No host round trip.
//  2. On the stream's worker: build CPU aliases of the device memory and run
//     ATen's CPU kernel, writing straight into the outputs through the op's
//     `out=` overload when there is one, or its out kernel (OutKernels.h; else:
//     functional kernel + one copy, counted in get_extra_copy_ops()).
//  3. View ops only create metadata (the CPU kernel runs on aliases on the
//     calling thread and the result is rewrapped on the vnpu storage).
//  4. Ops whose outputs depend on data (dynamic_output_shape /
//     data_dependent_output tags, non-tensor results) or that have no Meta
//     kernel synchronize the stream and run on the calling thread.
// Random ops receive a CPU generator seeded from the vnpu Generator's
// (seed, offset), taken at enqueue time.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <c10/util/FunctionRef.h>

#include <functional>

namespace at::vnpu {
namespace sanitizer {
class Accesses;
}

// The boxed PrivateUse1 fallback.
void executor_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                       torch::jit::Stack* stack);

// Runs `kernel` as a stream task does: thread-local state prepared for ATen
// CPU kernels, c10::Error turned into the runtime's error (Executor.cpp).
void run_on_worker(c10::function_ref<void()> kernel);
// Enqueues an already wrapped task (see launch) on the current stream of `device`.
void enqueue_task(const char* name, DeviceIndex device, std::function<void()> task,
                  const sanitizer::Accesses* accesses);

// Enqueues `kernel` (any callable) on the current stream of `device` under
// `name`; the kernel runs on the stream's worker with thread-local state
// prepared for ATen CPU kernels. Errors surface at the next synchronization
// (RuntimeError). With `accesses`, declares the memory the kernel reads and
// writes (checked under VNPU_SANITIZE: a race raises StreamRaceError here,
// nothing is queued). The callable is wrapped once (one std::function).
template <class F>
void launch(const char* name, DeviceIndex device, F&& kernel, const sanitizer::Accesses* accesses = nullptr) {
  enqueue_task(name, device, [k = std::forward<F>(kernel)]() mutable { run_on_worker(k); }, accesses);
}

// Routes ops that have a CPU kernel and a CompositeExplicitAutograd kernel to
// the executor, so vnpu runs CPU's kernel (see Overrides.cpp). Idempotent.
void register_cpu_kernel_overrides();

// Likewise for sparse layouts: ops with a SparseCPU/SparseCsrCPU kernel and a
// CompositeExplicitAutograd kernel run the sparse fallback (Sparse.cpp). Idempotent.
void register_sparse_kernel_overrides();

// `v` with `fn` applied to every tensor in it (a Tensor, Tensor[] or
// Tensor?[]; undefined/None entries stay as they are); other values unchanged.
c10::IValue map_tensors(const c10::IValue& v, const std::function<Tensor(const Tensor&)>& fn);

// A vnpu tensor sharing `base`'s storage with `cpu_view`'s sizes, strides,
// offset and dtype (cpu_view must alias base's storage).
Tensor rewrap_view(const Tensor& base, const Tensor& cpu_view);

}  // namespace at::vnpu
