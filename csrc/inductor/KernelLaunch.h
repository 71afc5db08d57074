// Stream launch of the C++ kernels Inductor generates for vnpu graphs.
//
// Note [Compiled kernels on the stream]
// Inductor's C++ backend compiles each fused kernel into a small shared
// library without libtorch, called from the graph's Python wrapper through a
// generated binding that turns tensor arguments into raw pointers. On CPU the
// binding calls the kernel at once; on vnpu that would race with the extern
// kernels of the same graph (mm, convolution, sdpa), which the executor
// enqueues on the current stream. So the vnpu binding (src/torch_vnpu/_inductor/
// kernel_launch.py) only parses the arguments on the calling thread and hands
// them to InductorLaunchApi::launch, which enqueues the kernel on the current
// stream of the graph's device, like a CUDA kernel launch: pointers and
// symbolic sizes are captured by value, the host does not wait, and the
// caching allocator's same-stream reuse rule keeps the pointed-to blocks alive
// for the kernel. Errors are the runtime's sticky kernel errors, naming the
// kernel and its graph.
//
// Note [Host scalars in vnpu kernels]
// Inductor lets a 0-dim CPU tensor feed a device kernel (e.g. an optimizer's
// step count, kept on the CPU). A queued kernel must not read host memory when
// it runs: the host may already have changed it (the next optimizer step
// increments the count while this step's kernel waits in the queue). CUDA
// passes such values by value (Inductor's Triton kernels load them with
// .item()); vnpu's binding copies the scalar into the kernel's argument block
// at launch (host_scalar) and points the kernel there.
#pragma once

#include <cstddef>

struct _object;  // PyObject

namespace at::vnpu {

// The C ABI the generated bindings call, published as the capsule
// torch_vnpu._C._inductor_launch_api. Entry points return -1 with a Python
// exception set on failure; all but launch_without_gil are called with the GIL
// held.
struct InductorLaunchApi {
  int version;  // kInductorLaunchApiVersion
  // Enqueues run(args) on the current stream of vnpu device `device` under
  // `name` (copied); destroy(args) runs after it, or before returning -1 when
  // the launch fails (bad device, or the kernel's own error returned at once
  // under VNPU_LAUNCH_BLOCKING=1).
  int (*launch)(const char* name, long device, void (*run)(void*), void* args, void (*destroy)(void*));
  // For a tensor argument `obj`: 0 if it is a vnpu tensor (the kernel takes its
  // pointer; under VNPU_SANITIZE its memory is declared for the next launch on
  // this thread, written if `writes`: a non-const pointer parameter); 1 if it
  // is a CPU tensor of at most `capacity` bytes, which were copied to `dst`
  // (Note [Host scalars in vnpu kernels]); -1 otherwise.
  int (*host_scalar)(_object* obj, void* dst, size_t capacity, int writes);
  // As launch, called without the GIL (from the C++ wrapper); on failure it
  // takes the GIL to set the Python exception.
  int (*launch_without_gil)(const char* name, long device, void (*run)(void*), void* args, void (*destroy)(void*));
  // For the C++ wrapper (no GIL needed): under VNPU_SANITIZE, declares the memory
  // of the vnpu tensor `tensor` (an AtenTensorHandle) for the next
  // launch_without_gil on this thread, written if `writes`; a no-op otherwise
  // (one relaxed load). Returns 0.
  int (*declare_access)(void* tensor, int writes);
  // As launch_without_gil, for AOTInductor models (Note [AOTInductor on vnpu]
  // in AotiRunner.cpp), which may run without Python: returns nullptr, or on
  // failure the error message (valid until the next call on this thread).
  const char* (*launch_or_error)(const char* name, long device, void (*run)(void*), void* args,
                                 void (*destroy)(void*));
};

// 6: vnpu AOTInductor models' torch_vnpu_aoti_attach takes the runner's weight table (AotiRunner.cpp).
constexpr int kInductorLaunchApiVersion = 6;

const InductorLaunchApi* inductor_launch_api();

}  // namespace at::vnpu
