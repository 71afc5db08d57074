// Copies involving vnpu tensors (mirrors ATen/native/cuda/Copy.cu):
//  * vnpu -> same vnpu device: one task on the current stream (dtype
//    conversion, strides, conj/neg bits handled by ATen's CPU copy kernel).
//  * vnpu -> other vnpu device: stream-ordered on both devices via events.
//  * CPU -> vnpu: one async memcpy when layouts match (truly async from
//    pinned memory, staged from pageable memory), else convert on the host
//    and scatter on the device.
//  * vnpu -> CPU: waits for the copy unless the destination is pinned and
//    non_blocking=True (then use an Event or synchronize before reading).
#pragma once

#include <ATen/core/Tensor.h>

namespace at::vnpu {

// dst.copy_(src) where dst or src is on vnpu; src broadcasts to dst's shape.
Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking);
// Reads the single element of a vnpu tensor (synchronizes its stream).
Scalar local_scalar_dense(const Tensor& self);

}  // namespace at::vnpu
