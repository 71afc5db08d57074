// Kernels chosen so vnpu runs exactly CPU's kernels, not a decomposition.
//
// * Ops with both a CPU kernel and a CompositeExplicitAutograd(NonFunctional) kernel would
//   take the composite one on vnpu (a backend fallback loses to composites),
//   e.g. native_layer_norm decomposing into batch norm. They are routed to the
//   executor instead, which runs the CPU kernel (same numerics as CPU). So are
//   the few composites that gate on the device type themselves.
#include "CpuAlias.h"
#include "Executor.h"

#include <ATen/native/Resize.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>
#include <torch/library.h>

#include <cmath>

namespace at::vnpu {

void register_cpu_kernel_overrides() {
  static torch::Library* lib = [] {
    auto* l = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = c10::Dispatcher::singleton().findOp(name);
      if (!op || !op->hasKernelForDispatchKey(DispatchKey::CPU) ||
          op->hasKernelForDispatchKey(DispatchKey::PrivateUse1) ||
          !(op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
            op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional)))
        continue;
      bool view = false;
      for (const auto& r : op->schema().returns()) view |= r.alias_info() && !r.alias_info()->isWrite();
      if (view) continue;  // views stay metadata-only composites
      std::string short_name = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      l->impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&executor_fallback>());
    }
    // CompositeExplicitAutograd kernels that call a DispatchStub or check the
    // device type themselves (found by the OpInfo sweep; their CPU siblings
    // have kernels): run them as one op on CPU aliases like any CPU kernel.
    // addr_ passes `self` as both input and out to addr.out, whose CPU kernel
    // tells an in-place call (and rejects a self that is not 2-D) by reference
    // identity, which a boxed call cannot reproduce.
    for (const char* name : {"mode.values", "conj_physical_", "addr_"}) {
      l->impl(name, torch::CppFunction::makeFromBoxedFunction<&executor_fallback>());
    }
    return l;
  }();
  (void)lib;
}

}  // namespace at::vnpu

// Convolutions: ATen sends non-CPU/CUDA devices to the *_overrideable ops.
// vnpu runs them as the generic convolution ops, whose CPU kernels pick the
// same algorithm as on CPU (same argument lists, bias_sizes absent).
namespace at::vnpu {
namespace {

void convolution_overrideable(const c10::OperatorHandle&, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  static const auto conv = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  executor_fallback(conv, ks, stack);
}

void convolution_backward_overrideable(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                                       torch::jit::Stack* stack) {
  static const auto bw = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  // bias_sizes: the bias length (output channels), which the Meta kernel needs for grad_bias.
  const auto n = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  auto args = stack->end() - n;
  const Tensor& weight = args[2].toTensor();
  const bool transposed = args[6].toBool();
  const int64_t groups = args[8].toInt();
  int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  stack->insert(args + 3, c10::IValue(std::vector<int64_t>{channels}));
  executor_fallback(bw, ks, stack);
}

// histc of integer tensors: CUDA's kernel accepts them (counts in the input's dtype) and libraries rely on it
// for every non-CPU device (transformers' grouped-MoE routing counts int32 expert ids with histc off CPU);
// ATen's CPU kernel takes floating inputs only. vnpu counts on a float64 copy, exact for every integer
// value an int32 index holds (and int64 values below 2**53), and returns the counts in the input's dtype.
// Floating inputs run the CPU kernel through the executor as usual.
void histc(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto n = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  auto args = stack->end() - n;
  const Tensor self = args[0].toTensor();
  if (!at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    // min == max (the default 0, 0): the range comes from the data, which
    // CUDA reads on the host (.item()) and checks there, so a non-finite
    // range raises at the call, as on CPU and CUDA, not on the stream.
    if (args[2].toScalar().toDouble() == args[3].toScalar().toDouble() && self.numel() > 0) {
      const double lo = self.min().item<double>(), hi = self.max().item<double>();
      TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi, "] is not finite");
    }
    executor_fallback(op, ks, stack);
    return;
  }
  const int64_t bins = args[1].toInt();
  const Scalar min = args[2].toScalar();
  const Scalar max = args[3].toScalar();
  std::optional<Tensor> out;
  if (n == 5) out = args[4].toTensor();
  torch::jit::drop(*stack, n);
  Tensor counts = at::histc(self.to(kDouble), bins, min, max).to(self.scalar_type());
  if (out.has_value()) {
    TORCH_CHECK(out->scalar_type() == self.scalar_type(), "torch.histc: input tensor and out tensor should have the same dtype, but got input ",
                self.scalar_type(), " and out ", out->scalar_type());
    at::native::resize_output(*out, counts.sizes());
    out->copy_(counts);
    counts = *out;
  }
  torch::jit::push(*stack, counts);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&histc>());
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&convolution_overrideable>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_backward_overrideable>());
}

}  // namespace at::vnpu
