// The batch-norm pieces nn.SyncBatchNorm calls (torch/nn/modules/_functions.py):
// per-rank statistics, their combination across ranks, the normalization and
// both halves of the backward. ATen has CUDA kernels only; vnpu computes them
// with the CUDA kernels' semantics (aten/src/ATen/native/cuda/Normalization.cu:
// statistics and reductions in the op-math type, i.e. float for half/bfloat16,
// biased variance, invstd = 1/sqrt(var + eps), unbiased running variance) as a
// few ATen ops that each run through the executor (stream-ordered, no sync).
#include <ATen/OpMathType.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace at::vnpu {
namespace {

bool has(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

void check_input(const char* op, const Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input of at least 2 dimensions (N, C, ...), got ", input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op, ": expected a floating-point input, got ",
              input.scalar_type());
}

void check_per_channel(const char* op, const char* name, const Tensor& t, int64_t channels) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == channels, op, ": expected ", name, " of size [", channels, "], got ",
              t.sizes());
}

// The dimensions batch norm reduces: all but the channel dimension 1.
std::vector<int64_t> reduced_dims(const Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against `input` ([1, C, 1, ...]).
Tensor per_channel(const Tensor& v, const Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

ScalarType opmath(const Tensor& input) { return at::toOpMathType(input.scalar_type()); }

std::tuple<Tensor, Tensor> batch_norm_stats(const Tensor& input, double eps) {
  check_input("batch_norm_stats", input);
  auto [var, mean] = at::var_mean(input.to(opmath(input)), reduced_dims(input), /*correction=*/0, /*keepdim=*/false);
  return {mean, at::rsqrt(var + eps)};
}

std::tuple<Tensor, Tensor> batch_norm_gather_stats_with_counts(const Tensor& input, const Tensor& mean,
                                                               const Tensor& invstd,
                                                               const std::optional<Tensor>& running_mean,
                                                               const std::optional<Tensor>& running_var,
                                                               double momentum, double eps, const Tensor& counts) {
  const char* op = "batch_norm_gather_stats_with_counts";
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(), op,
              ": expected mean and invstd of size [world_size, C], got ", mean.sizes(), " and ", invstd.sizes());
  TORCH_CHECK(counts.numel() == mean.size(0), op, ": expected ", mean.size(0), " counts (one per rank), got ",
              counts.numel());
  // Combine each rank's (count, mean, biased variance) exactly as one pass over all ranks' data would
  // (Chan et al.); a rank with no data (count 0) contributes nothing.
  const Tensor c = counts.reshape({-1, 1}).to(mean.scalar_type());
  const Tensor present = c > 0;
  const Tensor var = at::where(present, invstd.pow(-2) - eps, at::zeros_like(invstd));
  const Tensor n = c.sum();
  const Tensor m = (c * at::where(present, mean, at::zeros_like(mean))).sum(0) / n;
  const Tensor m2 = (c * (var + at::where(present, (mean - m).pow(2), at::zeros_like(mean)))).sum(0);
  const Tensor biased = m2 / n;
  if (has(running_mean)) {
    running_mean->mul_(1 - momentum).add_((m * momentum).to(running_mean->scalar_type()));
  }
  if (has(running_var)) {
    const Tensor unbiased = m2 / (n - 1);
    running_var->mul_(1 - momentum).add_((unbiased * momentum).to(running_var->scalar_type()));
  }
  (void)input;
  return {m, at::rsqrt(biased + eps)};
}

Tensor batch_norm_elemt(const Tensor& input, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                        const Tensor& mean, const Tensor& invstd, double /*eps*/) {
  check_input("batch_norm_elemt", input);
  const int64_t C = input.size(1);
  check_per_channel("batch_norm_elemt", "mean", mean, C);
  check_per_channel("batch_norm_elemt", "invstd", invstd, C);
  const ScalarType acc = opmath(input);
  Tensor out = (input.to(acc) - per_channel(mean.to(acc), input)) * per_channel(invstd.to(acc), input);
  if (has(weight)) {
    check_per_channel("batch_norm_elemt", "weight", *weight, C);
    out = out * per_channel(weight->to(acc), input);
  }
  if (has(bias)) {
    check_per_channel("batch_norm_elemt", "bias", *bias, C);
    out = out + per_channel(bias->to(acc), input);
  }
  return out.to(input.scalar_type()).contiguous(input.suggest_memory_format());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input,
                                                                      const Tensor& mean, const Tensor& invstd,
                                                                      const std::optional<Tensor>& weight,
                                                                      bool input_g, bool weight_g, bool bias_g) {
  check_input("batch_norm_backward_reduce", input);
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "batch_norm_backward_reduce: grad_out of size ", grad_out.sizes(),
              " does not match the input's size ", input.sizes());
  const int64_t C = input.size(1);
  check_per_channel("batch_norm_backward_reduce", "mean", mean, C);
  check_per_channel("batch_norm_backward_reduce", "invstd", invstd, C);
  const ScalarType acc = opmath(input);
  const auto dims = reduced_dims(input);
  const Tensor dy = grad_out.to(acc);
  const Tensor sum_dy = dy.sum(dims).to(mean.scalar_type());
  const Tensor sum_dy_xmu =
      (dy * (input.to(acc) - per_channel(mean.to(acc), input))).sum(dims).to(mean.scalar_type());
  const ScalarType param = has(weight) ? weight->scalar_type() : input.scalar_type();
  Tensor grad_weight, grad_bias;
  if (weight_g) grad_weight = (sum_dy_xmu * invstd).to(param);
  if (bias_g) grad_bias = sum_dy.to(param);
  if (!input_g) return {Tensor(), Tensor(), grad_weight, grad_bias};
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

Tensor batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                 const Tensor& invstd, const std::optional<Tensor>& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count) {
  check_input("batch_norm_backward_elemt", input);
  const int64_t C = input.size(1);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"mean", mean}, {"invstd", invstd},
                                {"sum_dy", sum_dy}, {"sum_dy_xmu", sum_dy_xmu}}) {
    check_per_channel("batch_norm_backward_elemt", name, t, C);
  }
  TORCH_CHECK(!at::isComplexType(count.scalar_type()), "batch_norm_backward_elemt: expected real counts");
  const ScalarType acc = opmath(input);
  const Tensor total = count.to(acc).sum();
  const Tensor mean_dy = per_channel(sum_dy.to(acc), input) / total;
  const Tensor mean_dy_xmu = per_channel(sum_dy_xmu.to(acc), input) / total;
  const Tensor is = per_channel(invstd.to(acc), input);
  const Tensor xmu = input.to(acc) - per_channel(mean.to(acc), input);
  Tensor scale = is;
  if (has(weight)) {
    check_per_channel("batch_norm_backward_elemt", "weight", *weight, C);
    scale = is * per_channel(weight->to(acc), input);
  }
  const Tensor grad_in = (grad_out.to(acc) - mean_dy - xmu * is * is * mean_dy_xmu) * scale;
  return grad_in.to(input.scalar_type()).contiguous(input.suggest_memory_format());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", TORCH_FN(batch_norm_stats));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN(batch_norm_gather_stats_with_counts));
  m.impl("batch_norm_elemt", TORCH_FN(batch_norm_elemt));
  m.impl("batch_norm_backward_reduce", TORCH_FN(batch_norm_backward_reduce));
  m.impl("batch_norm_backward_elemt", TORCH_FN(batch_norm_backward_elemt));
}

}  // namespace at::vnpu
