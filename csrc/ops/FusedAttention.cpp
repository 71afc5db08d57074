// scaled_dot_product_attention's fused kernel on vnpu.
//
// Note [vnpu's fused attention is CUDA's efficient attention]
// scaled_dot_product_attention asks a per-device stub (_fused_sdp_choice_stub)
// which fused kernel to run. On CPU the answer is flash attention, which ATen
// runs as _scaled_dot_product_flash_attention_for_cpu on every device but
// CUDA. That op is unknown to the code written for accelerators: DTensor has
// no sharding strategy for it (tensor parallelism over attention heads
// raises), and context parallelism's ring attention intercepts only CUDA's
// ops. So where CPU would pick its flash kernel, vnpu picks efficient
// attention, the op CUDA runs for float32 inputs and masks, and computes it
// with CPU's flash kernel: the same numbers as CPU, and DTensor and context
// parallelism treat it as they do on CUDA. Its log_sumexp has CUDA's (and the
// Meta kernel's) shape, the sequence padded to a multiple of 32; philox seed
// and offset are unused (no dropout, as for CPU's flash kernel). Not taken
// (CPU's choice stands): nested tensors, enable_gqa, float64, a mask that
// requires grad (efficient attention would owe its gradient). The output has
// the Meta kernel's (CUDA's) layout, which compiled graphs rely on, whatever
// the query's layout. The user's switches choose as on CUDA: flash or
// efficient enabled give vnpu's fused kernel; efficient disabled gives CPU's
// flash op.
#include "CpuAlias.h"

#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>

namespace at::vnpu {
namespace {

Tensor cpu_meta_view(const Tensor& t, AliasContext& ctx) {
  if (!t.defined()) return t;
  Tensor a = ctx.make(spec_of(t));
  a.set_requires_grad(t.requires_grad());
  return a;
}

bool takes_efficient_attention(const Tensor& q, const std::optional<Tensor>& mask, bool enable_gqa) {
  const auto dtype = q.scalar_type();
  return !q.is_nested() && q.dim() == 4 && !enable_gqa &&
         (dtype == kFloat || dtype == kHalf || dtype == kBFloat16) && !(mask.has_value() && mask->requires_grad());
}

// The constraints of CPU's flash-attention kernel (aten/src/ATen/native/transformers/attention.cpp), for a
// choice CPU did not make itself.
bool flash_kernel_accepts(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
                          double dropout_p) {
  if (dropout_p != 0.0 || k.dim() != 4 || v.dim() != 4) return false;
  if (q.sym_size(3) != k.sym_size(3) || k.sym_size(3) != v.sym_size(3)) return false;
  if (q.sym_size(2) == 0 || k.sym_size(2) == 0) return false;
  if (q.sym_stride(3) != 1 || k.sym_stride(3) != 1 || v.sym_stride(3) != 1) return false;
  if (mask.has_value() && mask->dim() != 2 && mask->dim() != 4) return false;
  return true;
}

}  // namespace

int64_t fused_sdp_choice(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
                         double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  const bool efficient_on = ctx.userEnabledMemEfficientSDP();
  // sdpa_kernel(EFFICIENT_ATTENTION) (flash off): CPU would not consider its flash kernel, which is what vnpu's
  // efficient attention runs (and would raise with math off too); that kernel's constraints decide.
  if (efficient_on && !ctx.userEnabledFlashSDP() && takes_efficient_attention(q, mask, enable_gqa) &&
      flash_kernel_accepts(q, k, v, mask, dropout_p))
    return static_cast<int64_t>(SDPBackend::efficient_attention);
  // Symbolic sizes (torch.compile with dynamic shapes traces with fake tensors): no CPU alias can hold them,
  // and the CPU choice reads sizes and strides through sym_size/sym_stride only, so it takes the tensors as
  // they are.
  auto symbolic = [](const Tensor& t) { return t.defined() && t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); };
  int64_t cpu;
  if (symbolic(q) || symbolic(k) || symbolic(v) || (mask.has_value() && symbolic(*mask))) {
    cpu = at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
  } else {
    AliasContext alias_ctx;  // metadata only: the CPU choice never reads the data
    std::optional<Tensor> m;
    if (mask.has_value()) m = cpu_meta_view(*mask, alias_ctx);
    cpu = at::native::_fused_sdp_choice_cpp(cpu_meta_view(q, alias_ctx), cpu_meta_view(k, alias_ctx),
                                            cpu_meta_view(v, alias_ctx), m, dropout_p, is_causal, scale, enable_gqa);
  }
  // enable_mem_efficient_sdp(False) / sdpa_kernel(FLASH_ATTENTION): CPU's flash op, as asked.
  if (efficient_on && cpu == static_cast<int64_t>(SDPBackend::flash_attention) &&
      takes_efficient_attention(q, mask, enable_gqa))
    return static_cast<int64_t>(SDPBackend::efficient_attention);
  return cpu;
}

namespace {

// _scaled_dot_product_efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal,
//   *, scale) -> (output [B, H, L, Dv], log_sumexp [B, H, ceil(L/32)*32] float32 or [B, H, 0], philox_seed,
//   philox_offset)
std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                               const std::optional<Tensor>& bias,
                                                               bool compute_log_sumexp, double dropout_p,
                                                               bool is_causal, std::optional<double> scale) {
  auto [flash_out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, bias, scale);
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2), dim_v = v.size(3);
  // The layouts of the Meta kernel (CUDA's), which compiled graphs check: output [B, L, H, Dv] viewed as
  // [B, H, L, Dv]; log_sumexp contiguous. CPU's kernel gives the output the query's layout: the same for the
  // usual q = proj(x).view(B, L, H, D).transpose(1, 2), one copy otherwise.
  Tensor out = flash_out;
  const std::vector<int64_t> strides = {length * heads * dim_v, dim_v, heads * dim_v, 1};
  bool same = true;
  for (int64_t d = 0; d < 4; ++d) same &= out.size(d) <= 1 || out.stride(d) == strides[d];
  if (!same) {
    out = at::empty({batch, length, heads, dim_v}, flash_out.options()).transpose(1, 2);
    out.copy_(flash_out);
  }
  Tensor log_sumexp;
  if (compute_log_sumexp) {
    const int64_t padded = (length + 31) / 32 * 32;
    log_sumexp = at::empty({batch, heads, padded}, q.options().dtype(kFloat));
    log_sumexp.narrow(2, 0, length).copy_(lse);
    if (padded > length) log_sumexp.narrow(2, length, padded - length).zero_();
  } else {
    log_sumexp = at::empty({batch, heads, 0}, q.options().dtype(kFloat));
  }
  auto unused = q.options().dtype(kLong);
  return {out, log_sumexp, at::empty({}, unused), at::empty({}, unused)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_attention_backward(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
    const Tensor& out, const Tensor& log_sumexp, const Tensor& /*philox_seed*/, const Tensor& /*philox_offset*/,
    double dropout_p, std::array<bool, 4> grad_input_mask, bool is_causal, std::optional<double> scale) {
  const bool has_bias = bias.defined();  // undefined: the forward had no attn_bias
  TORCH_CHECK_NOT_IMPLEMENTED(!(has_bias && grad_input_mask[3]),
                              "vnpu: the gradient of scaled_dot_product_attention's attn_mask is not supported by its "
                              "fused kernel; use torch.nn.attention.sdpa_kernel(SDPBackend.MATH)");
  const int64_t length = q.size(2);
  TORCH_CHECK(log_sumexp.dim() == 3 && log_sumexp.size(2) >= length,
              "_scaled_dot_product_efficient_attention_backward: logsumexp of shape ", log_sumexp.sizes(),
              " does not cover the query length ", length, " (compute_log_sumexp=False in the forward?)");
  // CPU's flash backward takes logsumexp in the layout its forward makes: [B, L, H] viewed as [B, H, L].
  Tensor lse = at::empty({q.size(0), length, q.size(1)}, log_sumexp.options()).transpose(1, 2);
  lse.copy_(log_sumexp.narrow(2, 0, length));
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, q, k, v, out, lse, dropout_p, is_causal, has_bias ? std::optional<Tensor>(bias) : std::nullopt, scale);
  return {gq, gk, gv, Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_attention));
  m.impl("_scaled_dot_product_efficient_attention_backward", TORCH_FN(efficient_attention_backward));
}

}  // namespace at::vnpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &at::vnpu::fused_sdp_choice)
}  // namespace at::native
