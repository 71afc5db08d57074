// Stream launch of the C++ kernels Inductor generates for vnpu graphs.
//
// Note [Compiled kernels on the stream]
// Inductor's C++ backend compiles each fused kernel into a small shared
// library without libtorch, called from the graph's Python wrapper through a
// generated binding that turns tensor arguments into raw pointers. On CPU the
// binding calls the kernel at once; on vnpu that would race with the extern
// kernels of the same graph (mm, convolution, sdpa), which the executor
// enqueues on the current stream. So the vnpu binding (torch_vnpu/_inductor/
// kernel_launch.py) only parses the arguments on the calling thread and hands
// them to inductor_launch(), which enqueues the kernel on the current stream of
// the graph's device, like a CUDA kernel launch: pointers and symbolic sizes
// are captured by value, the host does not wait, and the caching allocator's
// same-stream reuse rule keeps the pointed-to blocks alive for the kernel.
// Errors are the runtime's sticky kernel errors, naming the kernel and graph.
#pragma once

namespace at::vnpu {

// The C ABI the generated bindings call; they reach it through the capsule
// torch_vnpu._C._inductor_launch. Enqueues run(args) on the current stream of
// vnpu device `device` under `name` (copied), then destroy(args) on the
// worker. Returns 0, or -1 with a Python exception set (bad device, a kernel
// error returned at once under VNPU_LAUNCH_BLOCKING=1); destroy(args) has run
// then. Called with the GIL held.
using InductorLaunchFn = int (*)(const char* name, long device, void (*run)(void*), void* args,
                                 void (*destroy)(void*));

int inductor_launch(const char* name, long device, void (*run)(void*), void* args, void (*destroy)(void*));

}  // namespace at::vnpu
