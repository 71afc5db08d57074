// The kernels are ATen's DispatchStubs. libtorch_cpu (x86-64 wheel) is built
// with AVX2 and AVX512 kernel variants, which DispatchStub.h's declarations
// (the stub's members, DispatchStubImpl::get_call_ptr's signature) must match.
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#include "OutKernels.h"

#include <ATen/OpMathType.h>
#include <ATen/native/transformers/attention.h>
#include <c10/util/StringUtil.h>

#include <unordered_map>

namespace at::vnpu {
namespace {

std::optional<Tensor> optional_tensor(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toTensor();
}

std::optional<double> optional_double(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toDouble();
}

// The checks of CPU's _scaled_dot_product_flash_attention_cpu
// (aten/src/ATen/native/transformers/attention.cpp), same messages.
void check_flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                           const std::optional<Tensor>& mask) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(c10::isFloatingType(dtype),
              "scaled_dot_product_attention_flash_attention: Expected data type in FP32, FP64, BF16, FP16, but got ",
              dtype, " instead.");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "scaled_dot_product_attention_flash_attention: Accept only 4 dims inputs shape of {B, H, T, K}");
  TORCH_CHECK(dropout_p == 0.0,
              "scaled_dot_product_attention_flash_attention: Currently do not support dropout > 0");
  TORCH_CHECK(q.size(3) == v.size(3) && k.size(3) == v.size(3),
              "scaled_dot_product_attention_flash_attention: Q/K/V should have the same head size");
  TORCH_CHECK(!mask.has_value() || mask->scalar_type() == at::kBool || mask->scalar_type() == at::kFloat ||
                  dtype == mask->scalar_type(),
              "scaled_dot_product_attention_flash_attention: Attention mask is the same data type as query");
  TORCH_CHECK(!mask.has_value() || mask->dim() == 2 || mask->dim() == 4,
              "scaled_dot_product_attention_flash_attention: Attention mask dim in {2, 4}");
}

// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
//   -> (output [B, H, L, D], logsumexp [B, H, L] in the op-math dtype)
// CPU allocates output as query's layout transposed to [B, L, H, D] and logsumexp as [B, L, H] and transposes
// both back; the planned outputs have those layouts, so the kernel gets the same views.
void flash_attention(const torch::jit::Stack& args, const std::vector<c10::IValue>& outs) {
  const Tensor& q = args[0].toTensor();
  const Tensor& k = args[1].toTensor();
  const Tensor& v = args[2].toTensor();
  const double dropout_p = args[3].toDouble();
  const bool is_causal = args[4].toBool();
  const auto mask = optional_tensor(args[5]);
  const auto scale = optional_double(args[6]);
  check_flash_attention(q, k, v, dropout_p, mask);
  const Tensor out = outs[0].toTensor().transpose(1, 2);
  const Tensor lse = outs[1].toTensor().transpose(1, 2);
  TORCH_INTERNAL_ASSERT(lse.scalar_type() == at::toOpMathType(q.scalar_type()));
  at::native::flash_attention_kernel(kCPU, out, lse, q, k, v, dropout_p, is_causal, mask, scale);
}

// _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p,
//   is_causal, *, attn_mask, scale) -> (grad_query, grad_key, grad_value), each [B, H, L, D]: CPU zero-fills
// [B, L, H, D] gradients, runs the kernel on [B, L, H, D] views of everything, and transposes back.
void flash_attention_backward(const torch::jit::Stack& args, const std::vector<c10::IValue>& outs) {
  const Tensor& grad_out = args[0].toTensor();
  const Tensor& q = args[1].toTensor();
  const Tensor& k = args[2].toTensor();
  const Tensor& v = args[3].toTensor();
  const Tensor& o = args[4].toTensor();
  const Tensor& lse = args[5].toTensor();
  const auto mask = optional_tensor(args[8]);
  const auto scale = optional_double(args[9]);
  std::vector<Tensor> grads;
  for (const auto& g : outs) grads.push_back(g.toTensor().transpose(1, 2).zero_());
  at::native::flash_attention_backward_kernel(kCPU, grads[0], grads[1], grads[2], grad_out.transpose(1, 2),
                                              q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              o.transpose(1, 2), lse.transpose(1, 2), args[6].toDouble(),
                                              args[7].toBool(), mask, scale);
}

}  // namespace

OutKernel find_out_kernel(const std::string& op_name) {
  static const std::unordered_map<std::string, OutKernel> kernels = {
      {"aten::_scaled_dot_product_flash_attention_for_cpu", &flash_attention},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", &flash_attention_backward},
  };
  auto it = kernels.find(op_name);
  return it == kernels.end() ? nullptr : it->second;
}

}  // namespace at::vnpu
