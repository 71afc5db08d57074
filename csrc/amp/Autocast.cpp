// AutocastPrivateUse1: torch.autocast("vnpu", dtype=torch.bfloat16 / torch.float16)
// with CUDA's cast policies, reusing ATen's own op lists (ATen/autocast_mode.h):
// lower_precision_fp ops run in the autocast dtype, fp32 ops in float32,
// promote ops in the widest input type; binary_cross_entropy is banned as on CUDA.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::vnpu {
namespace {

Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

}  // namespace

#define VNPU_LOW_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define VNPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define VNPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define VNPU_FP32_APPEND_DTYPE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE,          \
                                                      REDISPATCH_SIGNATURE, POLICY)
#define VNPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

using namespace at::autocast;

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(VNPU_LOW_PRECISION_FP)
  AT_FORALL_FP32(VNPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(VNPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(VNPU_FP32_APPEND_DTYPE)
  AT_FORALL_PROMOTE(VNPU_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_banned));
}

}  // namespace at::vnpu

// Ops outside the policy lists run unchanged under autocast.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
