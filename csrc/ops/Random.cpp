// Random ops that draw without a Generator argument on CPU: routed through
// vnpu ops so they use the vnpu default Generator (see VNPUGeneratorImpl.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

namespace at::vnpu {
namespace {

// Same results layout and semantics as native_dropout_cpu (ATen/native/Dropout.cpp).
std::tuple<Tensor, Tensor> native_dropout(const Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input, input.options().dtype(kBool))};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(kBool))};
  }
  double p1m = 1. - p;
  // Scale by 1/(1-p); p == 1 yields zeros without dividing by zero, as on CPU.
  double scale = p1m == 0 ? 0. : 1. / p1m;
  Tensor mask = at::empty_like(input, input.options().dtype(kBool)).bernoulli_(p1m);
  Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", TORCH_FN(native_dropout)); }

}  // namespace at::vnpu
