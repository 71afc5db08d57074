// Allocation and storage-level ops of vnpu tensors: empty, empty_strided,
// resize_, set_, record_stream, and the fast metadata-only views.
#pragma once

#include <ATen/core/Tensor.h>

namespace at::vnpu {

// Grows (or shrinks, when `exact`) a vnpu storage to `nbytes`, copying the
// old contents in stream order on the current stream. Mirrors
// resize_bytes_cuda / PrivateUse1HooksInterface::resizePrivateUse1Bytes.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes, bool exact = false);

// An uninitialized strided vnpu tensor on the current vnpu device, from the
// caching allocator on the current stream: at::empty_strided(size, stride,
// dtype, device=vnpu) without the dispatcher round trip (the executor
// allocates every op's outputs with it). Honours
// torch.use_deterministic_algorithms' fill_uninitialized_memory as CUDA does.
// Raises what at::empty_strided raises for negative sizes.
at::Tensor empty_strided_on_current_device(IntArrayRef size, IntArrayRef stride, ScalarType dtype);

}  // namespace at::vnpu
