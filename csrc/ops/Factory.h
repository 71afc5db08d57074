// Allocation and storage-level ops of vnpu tensors: empty, empty_strided,
// resize_, set_, record_stream, and the fast metadata-only views.
#pragma once

#include <ATen/core/Tensor.h>

namespace at::vnpu {

// Grows (or shrinks, when `exact`) a vnpu storage to `nbytes`, copying the
// old contents in stream order on the current stream. Mirrors
// resize_bytes_cuda / PrivateUse1HooksInterface::resizePrivateUse1Bytes.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes, bool exact = false);

}  // namespace at::vnpu
