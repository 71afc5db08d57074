#include "Factory.h"

#include "../core/VNPUCachingAllocator.h"
#include "../core/VNPUException.h"
#include "../core/VNPUStream.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace at::vnpu {

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes, bool exact) {
  if (nbytes == storage.nbytes() || (!exact && nbytes < storage.nbytes())) return;
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceGuard guard(storage.device());
  DataPtr fresh = c10::vnpu::allocator::get()->allocate(nbytes);
  size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0) {
    auto stream = c10::vnpu::getCurrentVNPUStream(storage.device().index());
    VNPU_CHECK(vnpuMemcpyAsync(fresh.get(), storage.data(), keep, vnpuMemcpyDeviceToDevice, stream.stream()));
  }
  // The old block returns to its stream's pool; stream order protects the copy.
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
  const_cast<c10::Storage&>(storage).set_nbytes(nbytes);
}

namespace {

// torch.use_deterministic_algorithms(True) with fill_uninitialized_memory (the
// default): new memory holds NaN / the integer maximum, as on CPU and CUDA.
bool fill_uninitialized_memory() {
  return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}

Tensor empty_memory_format(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Layout> layout,
                           std::optional<Device> device, std::optional<bool> pin_memory,
                           std::optional<MemoryFormat> memory_format) {
  const Device d = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == Layout::Strided,
              "vnpu supports only strided tensors, but got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  c10::DeviceGuard guard(d);
  Tensor t = at::detail::empty_generic(size, c10::vnpu::allocator::get(), DispatchKeySet(DispatchKey::PrivateUse1),
                                       c10::dtype_or_default(dtype), memory_format);
  if (fill_uninitialized_memory()) at::native::fill_empty_deterministic_(t);
  return t;
}

}  // namespace

Tensor empty_strided_on_current_device(IntArrayRef size, IntArrayRef stride, ScalarType dtype) {
  Tensor t = at::detail::empty_strided_generic(size, stride, c10::vnpu::allocator::get(),
                                               DispatchKeySet(DispatchKey::PrivateUse1), dtype);
  if (fill_uninitialized_memory()) at::native::fill_empty_deterministic_(t);
  return t;
}

namespace {

Tensor empty_strided(IntArrayRef size, IntArrayRef stride, std::optional<ScalarType> dtype,
                     std::optional<Layout> layout, std::optional<Device> device, std::optional<bool> pin_memory) {
  const Device d = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == Layout::Strided,
              "vnpu supports only strided tensors, but got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  c10::DeviceGuard guard(d);
  return empty_strided_on_current_device(size, stride, c10::dtype_or_default(dtype));
}

const Tensor& resize_(const Tensor& self, c10::SymIntArrayRef size, std::optional<MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  if (!(impl->sizes().equals(sizes) && !memory_format.has_value())) {
    for (auto s : sizes) TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", sizes);
    impl->set_sizes_contiguous(sizes);
    if (memory_format.has_value()) {
      TORCH_CHECK(*memory_format != MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
      impl->empty_tensor_restride(*memory_format);
    }
  }
  size_t need = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), self.dtype().itemsize(),
                                                 impl->storage_offset());
  const int64_t old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  if (self.numel() > 0) resize_storage_bytes(self.storage(), need);
  if (fill_uninitialized_memory()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

Tensor& set_source_Storage(Tensor& self, c10::Storage source) { return at::native::set_(self, source); }

Tensor& set_source_Storage_offset(Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                                  c10::SymIntArrayRef stride) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  int64_t off = offset.expect_int();
  TORCH_CHECK(source.device() == self.device(), "Expected a storage on ", self.device(), " but got one on ",
              source.device());
  // Empty strides mean contiguous, as in set_storage_cpu_.
  at::native::checkSetStorage(self, source, off, sizes, strides);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(off);
  if (strides.empty()) impl->set_sizes_contiguous(sizes);
  else impl->set_sizes_and_strides(sizes, strides);
  size_t need = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), self.dtype().itemsize(), off);
  if (self.numel() > 0 && source.nbytes() < need) resize_storage_bytes(self.storage(), need);
  return self;
}

Tensor& set_source_Tensor(Tensor& self, const Tensor& source) { return at::native::set_tensor_(self, source); }

Tensor& set_empty(Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::vnpu::allocator::get(), true);
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
  self.unsafeGetTensorImpl()->set_sizes_contiguous({0});
  return self;
}

void record_stream(Tensor& self, c10::Stream stream) {
  c10::vnpu::allocator::recordStream(self.storage().data_ptr(), c10::vnpu::VNPUStream(stream));
}

Tensor as_strided(const Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                  std::optional<c10::SymInt> storage_offset) {
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           storage_offset ? std::optional<int64_t>(storage_offset->expect_int())
                                                          : std::nullopt);
}

Tensor view(const Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

Tensor reshape_alias(const Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Lets `module.to("vnpu")` swap parameter data in place (param.data = ...),
// as for CUDA, so tied weights stay tied. TensorImpl's own check only knows
// the built-in dense backends (see OpenRegMinimal.cpp for the same override).
bool has_compatible_shallow_copy_type(const Tensor& self, const Tensor& from) {
  auto dense = [](const Tensor& t) {
    return t.layout() == Layout::Strided && (t.device().is_cpu() || t.device().type() == DeviceType::PrivateUse1);
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_source_Storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_Storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_Tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
}

}  // namespace at::vnpu
