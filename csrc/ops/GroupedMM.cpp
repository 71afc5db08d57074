// aten::_grouped_mm (torch.nn.functional.grouped_mm; transformers' MoE experts).
//
// ATen has a CUDA kernel and, for every other device, a CompositeExplicitAutograd
// kernel that copies `offs` to the host and loops over the groups with mm_out:
// on vnpu that is a stream synchronization per call plus one launch per group,
// and its Meta kernel carries CUDA's bfloat16-only check, so the executor
// could not run it asynchronously either. vnpu runs CPU's whole computation
// (the same checks, output layout and per-group mm_out) as one task on the
// stream, where `offs` is read in stream order: no synchronization, results
// bitwise equal to CPU.
#include "CpuAlias.h"
#include "Executor.h"

#include <ATen/native/GroupedMMUtils.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace at::vnpu {
namespace {

void check_same_device(const Tensor& first, const Tensor& t, const char* name) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device() == first.device(), "Expected all tensors to be on the same device, but found at least two ",
              "devices, ", first.device(), " and ", t.device(), "! (argument '", name, "' of _grouped_mm)");
}

Tensor grouped_mm(const Tensor& mat_a, const Tensor& mat_b, const std::optional<Tensor>& offs,
                  const std::optional<Tensor>& bias, std::optional<ScalarType> out_dtype) {
  check_same_device(mat_a, mat_b, "mat_b");
  if (offs.has_value()) check_same_device(mat_a, *offs, "offs");
  if (bias.has_value()) check_same_device(mat_a, *bias, "bias");
  c10::DeviceGuard guard(mat_a.device());
  {
    // CPU's argument checks, on metadata only (aliases are never read here).
    AliasContext ctx;
    std::optional<Tensor> offs_alias, bias_alias;
    if (offs.has_value() && offs->defined()) offs_alias = ctx.make(spec_of(*offs));
    if (bias.has_value() && bias->defined()) bias_alias = ctx.make(spec_of(*bias));
    at::native::_grouped_mm_validate_inputs(ctx.make(spec_of(mat_a)), ctx.make(spec_of(mat_b)), offs_alias,
                                            bias_alias, out_dtype);
  }
  const ScalarType dtype = at::native::_resolve_grouped_mm_out_dtype(mat_a, mat_b, out_dtype);
  Tensor out = at::native::create_grouped_gemm_output_tensor(mat_a, mat_b, offs, dtype);
  std::optional<TensorSpec> offs_spec;
  if (offs.has_value() && offs->defined()) offs_spec = spec_of(*offs);
  launch("aten::_grouped_mm", mat_a.device().index(),
         [a = spec_of(mat_a), b = spec_of(mat_b), o = std::move(offs_spec), r = spec_of(out), dtype] {
           AliasContext ctx;
           std::optional<Tensor> offs_alias;
           if (o) offs_alias = ctx.make(*o);
           at::native::_grouped_mm_fallback(ctx.make(a), ctx.make(b), offs_alias, std::nullopt, dtype, ctx.make(r));
         });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_grouped_mm", TORCH_FN(grouped_mm)); }

}  // namespace at::vnpu
