// Element-wise reductions of the shared-memory transport, with NCCL's
// semantics: bool SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and; integers wrap
// around and AVG truncates; half, bfloat16 and float8 accumulate in float and
// round once; MIN/MAX propagate NaN (as torch.minimum/maximum); PREMUL_SUM
// scales each source by its own factor. Single-threaded: each rank reduces
// its own slice on its own progress thread.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>

namespace c10d::vnpu {

// Whether reduce() supports `dtype` (every dtype vnpu reduces but float8_e8m0fnu and complex32).
bool shmReducible(at::ScalarType dtype);

// For i in [0, count): v = op over r of srcs[r][i] (scaled by factors[r] for
// PREMUL_SUM; divided by nsrc for AVG), written to dsts[k][i] for every k.
// Sources may be destinations (in-place): each block is read completely
// before any of it is written.
void reduce(void* const* dsts, int ndst, const void* const* srcs, int nsrc, int64_t count, at::ScalarType dtype,
            ReduceOp::RedOpType op, const double* factors);

}  // namespace c10d::vnpu
