// CPU tensors that alias vnpu device memory (same pointer, sizes, strides).
//
// Kernels are ATen's CPU kernels run on such aliases on the stream's worker.
// TensorSpec is a host-side snapshot of a vnpu tensor's metadata, taken when
// the op is enqueued (the tensor may be resized or freed before the task
// runs; the caching allocator's stream-ordered reuse keeps the memory valid).
//
// Note [One CPU storage per device storage]
// ATen's overlap checks (MemoryOverlap.cpp) compare StorageImpl identity, so
// all aliases built for one task from the same device storage share one CPU
// StorageImpl; AliasContext keeps that mapping for the task's lifetime.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <unordered_map>
#include <utility>

namespace at::vnpu {

struct TensorSpec {
  bool defined = false;
  void* storage_base = nullptr;  // device address of the storage start
  size_t storage_nbytes = 0;     // bytes
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t storage_offset = 0;    // elements
  ScalarType dtype = ScalarType::Float;
  bool conj = false, neg = false, wrapped_number = false;
  Tensor cpu_value;              // set for CPU scalar tensors (used as they are)
};

// Snapshot of `t` (vnpu tensor, CPU 0-dim tensor, or undefined).
TensorSpec spec_of(const Tensor& t);
// The same, written into a default-constructed `s` in place (no move of the
// inline sizes/strides: the launch path builds several per op).
void spec_into(TensorSpec& s, const Tensor& t);

// Note [Copy-on-write storages]
// torch._lazy_clone shares device memory between storages until one is
// written. CPU kernels materialise a shared storage when they take its
// mutable data pointer, but aliases of device memory are storages of their
// own, so a task that writes `t` must first give it memory of its own: this
// copies the shared data (in stream order, see the allocator's copy_data)
// when t's storage is copy-on-write. Call it on the calling thread.
void materialize_for_write(const Tensor& t);

class AliasContext {
 public:
  // resizable: kernels may grow the aliases' storages (into fresh host memory,
  // which the caller copies back; used by the synchronous sparse path,
  // Sparse.cpp). By default device memory cannot grow under a kernel.
  explicit AliasContext(bool resizable = false) : resizable_(resizable) {}
  // CPU alias of a snapshot (the CPU scalar itself for CPU specs).
  Tensor make(const TensorSpec& spec);
  // The CPU storage created for `device_base` or nullptr.
  const c10::StorageImpl* cpu_storage_of(const void* device_base) const;
  // Device base address whose alias storage is `impl`, or nullptr.
  void* device_base_of(const c10::StorageImpl* impl) const;

 private:
  static Tensor alias_of(const c10::Storage& storage, const TensorSpec& spec);
  // device base -> CPU storage. Most tasks have a few tensors: a linear scan
  // over inline entries, no allocation; foreach ops over many tensors also
  // get a hash index (built past kIndexAbove entries).
  static constexpr size_t kIndexAbove = 16;
  c10::SmallVector<std::pair<const void*, c10::Storage>, 4> storages_;
  std::unordered_map<const void*, size_t> index_;
  const c10::Storage* find(const void* device_base) const;
  bool resizable_ = false;
};

}  // namespace at::vnpu
