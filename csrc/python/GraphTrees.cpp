// What Inductor's graph trees (torch.compile mode="reduce-overhead") ask of the device and of storages, for
// vnpu: the graph pool checkpoints of the caching allocator and the storage helpers that torch binds only in
// CUDA builds (torch/csrc/cuda/Module.cpp). Same arguments and semantics as CUDA's `_cuda_*` versions;
// src/torch_vnpu/_inductor/graph_trees.py maps CUDA's names onto these.
#include "GraphTrees.h"

#include "../core/VNPUCachingAllocator.h"

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torch_vnpu {
namespace {

namespace alloc = c10::vnpu::allocator;
using Pool = std::pair<c10::CaptureId_t, c10::CaptureId_t>;

c10::StorageImpl* storage_impl(size_t address) {
  return reinterpret_cast<c10::StorageImpl*>(address);  // NOLINT(performance-no-int-to-ptr): torch's _cdata
}

// Storages of blocks the checkpoint freed stop owning them (CUDA's removeStorageDeleterFns).
void release_stale(const std::unordered_set<size_t>& stale, const std::unordered_set<void*>& freed) {
  for (size_t address : stale) {
    c10::StorageImpl* s = storage_impl(address);
    TORCH_CHECK(freed.count(s->data_ptr().get()) != 0,
                "a stale storage passed to _set_checkpoint_pool_state does not hold a block the checkpoint freed");
    TORCH_CHECK(s->mutable_data_ptr().compare_exchange_deleter(alloc::cachingDeleter(), &c10::detail::deleteNothing),
                "unexpected deleter on a stale vnpu storage");
  }
}

// Storages alive across the checkpoint take ownership of their re-allocated block; the checkpoint's other
// blocks stay allocated for raw_delete (CUDA's addStorageDeleterFns).
void adopt_blocks(const std::vector<size_t>& storages, alloc::CheckpointDelta& delta) {
  std::unordered_map<void*, c10::StorageImpl*> by_ptr;
  for (size_t address : storages) {
    c10::StorageImpl* s = storage_impl(address);
    by_ptr[s->data_ptr().get()] = s;
  }
  for (auto& data_ptr : delta.dataptrs_allocd) {
    auto it = by_ptr.find(data_ptr.get());
    if (it == by_ptr.end()) {
      data_ptr.release_context();
      continue;
    }
    TORCH_CHECK(it->second->data_ptr().get_context() == nullptr,
                "a vnpu storage given a checkpoint's block already owns its memory");
    it->second->set_data_ptr_noswap(std::move(data_ptr));
  }
}

}  // namespace

void bind_graph_trees(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<alloc::PoolCheckpoint, std::shared_ptr<alloc::PoolCheckpoint>>(m, "_PoolCheckpoint");

  m.def("_get_checkpoint_state", [](c10::DeviceIndex device, Pool pool) {
    return alloc::getCheckpointState(device, pool);
  });
  m.def("_set_checkpoint_pool_state", [](c10::DeviceIndex device, const std::shared_ptr<alloc::PoolCheckpoint>& state,
                                         const std::vector<size_t>& stale_storages,
                                         const std::vector<size_t>& storages_to_add_deleters_to) {
    TORCH_CHECK(state != nullptr, "_set_checkpoint_pool_state: no checkpoint");
    alloc::CheckpointDelta delta = alloc::setCheckpointPoolState(device, *state);
    std::unordered_set<void*> allocated, freed;
    for (const auto& d : delta.dataptrs_allocd) allocated.insert(d.get());
    size_t definitely_freed = 0;
    for (void* p : delta.ptrs_freed) {
      if (allocated.count(p) == 0) ++definitely_freed;
      freed.insert(p);
    }
    std::unordered_set<size_t> stale(stale_storages.begin(), stale_storages.end());
    TORCH_CHECK(stale.size() >= definitely_freed,
                "Any stale tensors which are being manually freed must be passed to set checkpoint");
    release_stale(stale, freed);
    adopt_blocks(storages_to_add_deleters_to, delta);
  });
  m.def("_check_pool_live_allocations", [](c10::DeviceIndex device, Pool pool, const py::set& expected) {
    std::unordered_set<void*> ptrs;
    for (const auto& e : expected) ptrs.insert(reinterpret_cast<void*>(py::cast<size_t>(e)));  // NOLINT
    return alloc::checkPoolLiveAllocations(device, pool, ptrs);
  });
  m.def("_has_standard_deleter", [](size_t storage) {
    return storage_impl(storage)->data_ptr().get_deleter() == alloc::cachingDeleter();
  });
  m.def("_free_and_remove_deleter", [](size_t storage) {
    c10::StorageImpl* s = storage_impl(storage);
    void* data = s->data_ptr().get();
    TORCH_CHECK(s->mutable_data_ptr().compare_exchange_deleter(alloc::cachingDeleter(), &c10::detail::deleteNothing),
                "Expected standard deleter");
    alloc::cachingDeleter()(data);
  });
  // CUDA's _construct_CUDA_Tensor_From_Storage_And_Metadata: a vnpu tensor viewing `storage` as `metadata`
  // describes (size, stride, storage_offset, dtype). Called for every graph output at every replay.
  m.def("_construct_tensor_from_storage_and_metadata", [](const py::dict& metadata, at::Storage storage) {
    PyObject* dtype = metadata["dtype"].ptr();
    TORCH_CHECK_TYPE(THPDtype_Check(dtype), "metadata['dtype'] must be a torch.dtype");
    const auto meta = c10::scalarTypeToTypeMeta(reinterpret_cast<THPDtype*>(dtype)->scalar_type);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
    t.unsafeGetTensorImpl()->set_sizes_and_strides(py::cast<std::vector<int64_t>>(metadata["size"]),
                                                   py::cast<std::vector<int64_t>>(metadata["stride"]));
    t.unsafeGetTensorImpl()->set_storage_offset(py::cast<int64_t>(metadata["storage_offset"]));
    return t;
  });
  // Device-generic helpers that torch defines only in CUDA builds.
  m.def("_tensors_data_ptrs_at_indices_equal", [](py::list& tensors, py::list& data_ptrs, py::list& indices) {
    for (const auto& index : indices) {
      const auto i = py::cast<int64_t>(index);
      const auto t = py::cast<at::Tensor>(tensors[i]);
      if (reinterpret_cast<int64_t>(t.data_ptr()) != py::cast<int64_t>(data_ptrs[i])) return false;
    }
    return true;
  });
  m.def("_set_storage_access_error_msg", [](const at::Tensor& t, std::string message) {
    t.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(std::move(message));
  });
  m.def("_set_storage_data_ptr_access_error_msg", [](size_t storage, std::string message) {
    storage_impl(storage)->release_data_and_set_meta_custom_data_ptr_error_msg_(std::move(message));
  });
}

}  // namespace torch_vnpu
