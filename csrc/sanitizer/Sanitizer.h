// The torch-aware half of VNPU_SANITIZE (the runtime half is csrc/runtime/src/sanitizer.cpp).
//
// The runtime checks memory ranges and knows nothing about tensors; this layer
// declares the ranges each task touches (the executor's arguments and outputs,
// compiled kernels' pointer arguments, collectives' buffers, synchronous
// kernels run on the host) and turns a refused launch into a Python error that
// names the op, the tensor (shape, dtype, where it was allocated: the op and
// the Python stack gathered by the caching allocator), both streams and the
// fix: torch_vnpu.sanitizer.StreamRaceError / UseAfterFreeError (both
// RuntimeError subclasses). Check 4 (host code touching device memory,
// recorded by the runtime's fault handler) becomes HostAccessError, naming the
// address, the block and its allocation site. See docs/sanitizer.md.
//
// Threads: Accesses is per call; the allocation-site recorder runs on the
// allocating thread; raise() may take the GIL to symbolize stacks.
#pragma once

#include <vnpu/runtime.h>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <atomic>
#include <string>
#include <vector>

namespace at::vnpu::sanitizer {

// The runtime's flag: one relaxed load once the runtime is initialized (it
// cannot change afterwards), a runtime call before.
extern std::atomic<int> g_enabled;  // -1: not known yet
bool enabled_slow();
inline bool enabled() {
  const int v = g_enabled.load(std::memory_order_relaxed);
  return v >= 0 ? v != 0 : enabled_slow();
}

// The accesses one task declares, with what a report says about each.
class Accesses {
 public:
  // The bytes of a strided view [offset + lowest, offset + highest element]
  // of a storage starting at `base` (device memory). Zero-size views add nothing.
  void add(const void* base, size_t storage_nbytes, c10::IntArrayRef sizes, c10::IntArrayRef strides,
           int64_t storage_offset, c10::ScalarType dtype, int device, bool write, std::string what);
  // A raw range (a compiled kernel's pointer argument, whose extent is its allocation's).
  void add_raw(const void* ptr, size_t bytes, int device, bool write, std::string what);
  const vnpuMemAccess* data() const { return acc_.data(); }
  size_t size() const { return acc_.size(); }
  bool empty() const { return acc_.empty(); }

  struct Desc {
    const void* base = nullptr;  // storage start (allocation lookups)
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::ScalarType::Undefined;  // Undefined: a raw range
    int device = 0;
    std::string what;  // "argument 'self'", "output 0", ...
  };
  const Desc& desc(size_t i) const { return desc_[i]; }

 private:
  std::vector<vnpuMemAccess> acc_;
  std::vector<Desc> desc_;
};

// vnpuLaunchKernelWithAccesses; a refusal raises (raise()).
void launch_checked(vnpuStream_t stream, const char* name, vnpuKernel_t kernel, const Accesses& accesses);
// Accesses made on the calling thread (a synchronous kernel); a refusal raises.
void host_access(const char* name, const Accesses& accesses);

// Raises the error of the calling thread's last refused runtime call:
// StreamRaceError, UseAfterFreeError or HostAccessError (Python RuntimeError subclasses),
// naming `op`, the tensor of `accesses` the report points at (when given)
// and the fix.
[[noreturn]] void raise(vnpuError_t err, const char* op, const Accesses* accesses);

// Raises what the runtime kept for the next call (a host access, a free's race, a rewritten pinned upload);
// `at_exit`: the check made at interpreter exit, after the program's last vnpu call.
void check_pending(bool at_exit);

// The op the calling thread runs, for allocation sites (set by the executor
// while the sanitizer is on).
class CurrentOp {
 public:
  explicit CurrentOp(const char* name);
  ~CurrentOp();
  CurrentOp(const CurrentOp&) = delete;
  CurrentOp& operator=(const CurrentOp&) = delete;

 private:
  const char* prev_;
};

// Check 4 is on: device memory is tagged and host threads have no access to it.
bool host_access_check();

// Note [Synchronous kernels under check 4]
// A kernel run on the calling thread (the executor's synchronous path, sparse
// ops) touches device memory from a host thread, which check 4 denies. Inside
// this guard the thread has access (vnpuSanitizerDeviceAccessBegin). Threads
// inherit access rights when they are created, and libgomp keeps one pool of
// helper threads per thread that starts a parallel region, so the guard
// releases the calling thread's OpenMP pool on entry (the kernel's helpers are
// created with the access) and on exit (none of them keeps it for the host
// code that follows). No-op unless check 4 is on; nestable.
class HostKernelGuard {
 public:
  HostKernelGuard();
  ~HostKernelGuard();
  HostKernelGuard(const HostKernelGuard&) = delete;
  HostKernelGuard& operator=(const HostKernelGuard&) = delete;

 private:
  bool active_ = false;
};

// Installs the allocation-site recorder and VNPU_CHECK's raiser; called once
// by the Python module (the Python stack needs libtorch_python).
void install();

}  // namespace at::vnpu::sanitizer
