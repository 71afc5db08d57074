#include "CpuAlias.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/COW.h>
#include <ATen/EmptyTensor.h>

#include <cstring>

namespace at::vnpu {

TensorSpec spec_of(const Tensor& t) {
  TensorSpec s;
  spec_into(s, t);
  return s;
}

void spec_into(TensorSpec& s, const Tensor& t) {
  if (!t.defined()) return;
  s.defined = true;
  if (t.device().is_cpu()) {
    s.cpu_value = t;
    // Note [No Python tensors in stream tasks]: a TensorImpl that has a Python
    // object calls into Python (taking the GIL) when its last C++ reference
    // goes away. Dropped by a stream worker while the caller syncs that stream
    // holding the GIL (e.g. inside torch.sparse_coo_tensor(...)), that
    // deadlocks. Such a CPU scalar is read now instead (as CUDA reads CPU
    // scalars at launch): the task gets a copy of its value.
    if (t.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() != nullptr && t.dim() == 0) {
      Tensor v = at::detail::empty_cpu({}, t.scalar_type());
      std::memcpy(v.mutable_data_ptr(), t.const_data_ptr(), t.element_size());
      if (t.is_conj()) v._set_conj(true);
      if (t.is_neg()) v._set_neg(true);
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) v.unsafeGetTensorImpl()->set_wrapped_number(true);
      s.cpu_value = std::move(v);
    }
    return;
  }
  const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  s.storage_base = const_cast<void*>(st->data_ptr().get());
  s.storage_nbytes = st->nbytes();
  s.sizes.assign(t.sizes().begin(), t.sizes().end());
  s.strides.assign(t.strides().begin(), t.strides().end());
  s.storage_offset = t.storage_offset();
  s.dtype = t.scalar_type();
  s.conj = t.is_conj();
  s.neg = t.is_neg();
  s.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
}

void materialize_for_write(const Tensor& t) {
  if (!t.defined() || t.is_cpu() || !t.has_storage()) return;
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  if (c10::impl::cow::is_cow_data_ptr(st->data_ptr())) st->mutable_data_ptr();  // materialises
}

Tensor AliasContext::make(const TensorSpec& spec) {
  if (!spec.defined) return Tensor();
  if (spec.cpu_value.defined()) return spec.cpu_value;
  // Storages of zero bytes have no address: each gets its own CPU storage (a
  // kernel may grow two of them independently, e.g. two empty out= tensors).
  const c10::Storage* found = spec.storage_base ? find(spec.storage_base) : nullptr;
  if (found == nullptr) {
    // Non-owning DataPtr (no deleter): the device allocator owns the memory.
    // A resizable one reallocates from the CPU allocator and never frees the device memory.
    c10::Storage storage(c10::Storage::use_byte_size_t(), spec.storage_nbytes,
                         c10::DataPtr(spec.storage_base, c10::Device(c10::DeviceType::CPU)),
                         resizable_ ? c10::GetCPUAllocator() : nullptr, /*resizable=*/resizable_);
    if (!spec.storage_base) return alias_of(storage, spec);
    storages_.emplace_back(spec.storage_base, std::move(storage));
    if (storages_.size() > kIndexAbove) {
      if (index_.empty())
        for (size_t i = 0; i < storages_.size(); ++i) index_.emplace(storages_[i].first, i);
      else
        index_.emplace(spec.storage_base, storages_.size() - 1);
    }
    found = &storages_.back().second;
  }
  return alias_of(*found, spec);
}

const c10::Storage* AliasContext::find(const void* device_base) const {
  if (!index_.empty()) {
    auto it = index_.find(device_base);
    return it == index_.end() ? nullptr : &storages_[it->second].second;
  }
  for (const auto& [base, st] : storages_) {
    if (base == device_base) return &st;
  }
  return nullptr;
}

Tensor AliasContext::alias_of(const c10::Storage& storage, const TensorSpec& spec) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    scalarTypeToTypeMeta(spec.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(spec.sizes, spec.strides, spec.storage_offset);
  if (spec.conj) t._set_conj(true);
  if (spec.neg) t._set_neg(true);
  if (spec.wrapped_number) t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

const c10::StorageImpl* AliasContext::cpu_storage_of(const void* device_base) const {
  const c10::Storage* st = find(device_base);
  return st == nullptr ? nullptr : st->unsafeGetStorageImpl();
}

void* AliasContext::device_base_of(const c10::StorageImpl* impl) const {
  for (const auto& [base, st] : storages_) {
    if (st.unsafeGetStorageImpl() == impl) return const_cast<void*>(base);
  }
  return nullptr;
}

}  // namespace at::vnpu
