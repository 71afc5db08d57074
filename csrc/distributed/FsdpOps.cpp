// fsdp::copy_ for vnpu. FSDP2 defines the op in Python
// (torch/distributed/fsdp/_fully_shard/_fsdp_param.py) with kernels for CPU,
// CUDA, XPU, HPU, MTIA and Meta only; traced/compiled FSDP2 calls it on the
// unsharded parameters. Registering the kernel before the Python definition
// is fine: the dispatcher attaches it once the schema arrives.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace {

void fsdp_copy_(at::Tensor& tensor, const at::Tensor& data) { tensor.copy_(data); }

}  // namespace

TORCH_LIBRARY_IMPL(fsdp, PrivateUse1, m) { m.impl("copy_", fsdp_copy_); }
