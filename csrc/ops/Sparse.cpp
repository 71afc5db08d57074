// Sparse layouts on vnpu: COO (SparsePrivateUse1) and compressed CSR/CSC/BSR/BSC
// (SparseCsrPrivateUse1) tensors whose component tensors (indices/values,
// compressed/plain indices/values) are ordinary strided vnpu tensors; and
// nested tensors (NestedTensorPrivateUse1, torch.strided layout), whose buffer
// is vnpu memory (their sizes, strides and offsets are CPU tensors, as on CUDA).
//
// Ops on them run ATen's SparseCPU / SparseCsrCPU kernels, the executor's idea
// (CPU kernels on CPU tensors that alias device memory, see CpuAlias.h) applied
// to the components: one boxed fallback per sparse dispatch key
//  1. synchronizes the current stream (sparse kernels size their outputs from
//     the data, nnz; CUDA's sparse kernels synchronize too), then on the
//     calling thread
//  2. turns every vnpu argument into a CPU one: strided tensors into aliases,
//     sparse ones into CPU sparse tensors whose components are aliases,
//  3. calls the op (the dispatcher picks the CPU kernels),
//  4. turns results back: a CPU tensor that is a converted argument becomes
//     that argument again, one that aliases an argument's device memory a vnpu
//     view of it, a fresh one is copied into vnpu memory; sparse results get
//     their components converted the same way,
//  5. writes back what the kernel changed in mutable arguments: new
//     components of a sparse argument (e.g. add_ replaces indices/values),
//     or strided arguments the kernel resized (the aliases' storages may grow
//     into host memory, see AliasContext(resizable)).
// Metadata-only ops (nnz, sparse_dim, indices(), values(), ...) run ATen's
// device-agnostic kernels directly (no synchronization), and strided → sparse
// or nested conversions of vnpu tensors (to_sparse*, _nested_tensor_from_mask,
// which reach the dense PrivateUse1 key) take the same fallback. Nested tensors
// run ATen's NestedTensorCPU kernels (e.g. nn.TransformerEncoder's fast path for
// padded batches in inference, as on CPU and CUDA). Ops without a sparse CPU kernel raise CPU's
// NotImplementedError ("Could not run ... with arguments from the 'SparseCPU'
// backend").
#include "CpuAlias.h"
#include "Executor.h"
#include "OpStats.h"
#include "WorkerWarnings.h"
#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"
#include "../core/VNPUStream.h"
#include "../sanitizer/Sanitizer.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace at::vnpu {
namespace {

using c10::IValue;
using torch::jit::Stack;

constexpr DeviceType kVNPU = DeviceType::PrivateUse1;

bool is_vnpu(const Tensor& t) { return t.defined() && t.device().type() == kVNPU; }

bool is_compressed(const Tensor& t) {
  auto l = t.layout();
  return l == kSparseCsr || l == kSparseCsc || l == kSparseBsr || l == kSparseBsc;
}

// A sparse tensor of `layout` on `device` (CPU or vnpu) with the given components (no copies).
Tensor make_coo(Device device, const Tensor& like, const Tensor& indices, const Tensor& values) {
  auto key = device.is_cpu() ? DispatchKey::SparseCPU : DispatchKey::SparsePrivateUse1;
  Tensor t = at::detail::make_tensor<SparseTensorImpl>(DispatchKeySet(key), like.dtype());
  auto* impl = at::sparse::get_sparse_impl(t);
  impl->raw_resize_(like.sparse_dim(), like.dense_dim(), like.sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(like.is_coalesced());
  return t;
}

Tensor make_compressed(Device device, const Tensor& like, const Tensor& compressed, const Tensor& plain,
                       const Tensor& values) {
  auto key = device.is_cpu() ? DispatchKey::SparseCsrCPU : DispatchKey::SparseCsrPrivateUse1;
  Tensor t = at::detail::make_tensor<SparseCsrTensorImpl>(DispatchKeySet(key), device, like.layout(), like.dtype());
  at::sparse_csr::get_sparse_csr_impl(t)->set_member_tensors(compressed, plain, values, like.sizes());
  return t;
}

// One call of an op: its vnpu arguments as CPU ones and its CPU results as vnpu ones.
class SparseCall {
 public:
  explicit SparseCall(DeviceIndex dev) : dev_(dev), ctx_(/*resizable=*/true) {}

  Tensor to_cpu(const Tensor& t) {
    if (!is_vnpu(t)) {
      if (t.defined()) passed_.emplace(t.unsafeGetTensorImpl(), t);
      return t;
    }
    auto known = converted_.find(t.unsafeGetTensorImpl());
    if (known != converted_.end()) return known->second;
    Tensor c;
    if (t.is_nested()) {
      c = make_nested(t, to_cpu(at::native::get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor()));
    } else if (t.layout() == kSparse) {
      auto* impl = at::sparse::get_sparse_impl(t);
      c = make_coo(Device(kCPU), t, to_cpu(impl->indices()), to_cpu(impl->values()));
    } else if (is_compressed(t)) {
      auto* impl = at::sparse_csr::get_sparse_csr_impl(t);
      c = make_compressed(Device(kCPU), t, to_cpu(impl->compressed_indices()), to_cpu(impl->plain_indices()),
                          to_cpu(impl->values()));
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == kStrided, "vnpu: tensors of layout ", t.layout(),
                                  " are not supported");
      void* base = t.storage().unsafeGetStorageImpl()->data_ptr().get();
      if (base == nullptr) {
        // No device memory (empty): a standalone CPU tensor, so kernels that
        // grow one of several such arguments do not grow the others.
        c = at::empty_strided(t.sizes(), t.strides(), t.options().device(kCPU));
      } else {
        c = ctx_.make(spec_of(t));
        bases_.emplace(base, t);
      }
      dense_.push_back({t, c, c.storage().unsafeGetStorageImpl()->data_ptr().get()});
    }
    // Some CPU kernels keep what backward needs only for inputs that require
    // grad (e.g. _sparse_mm_reduce_impl's arg_out); the fallback runs below
    // autograd, so the flag records nothing.
    if (t.requires_grad()) c.set_requires_grad(true);
    converted_.emplace(t.unsafeGetTensorImpl(), c);
    back_.emplace(c.unsafeGetTensorImpl(), t);
    return c;
  }

  IValue to_cpu(const IValue& v) {
    if (v.isDevice() && v.toDevice().type() == kVNPU) return Device(kCPU);
    return map_tensors(v, [this](const Tensor& t) { return to_cpu(t); });
  }

  Tensor to_vnpu(const Tensor& c) {
    if (!c.defined() || is_vnpu(c)) return c;
    if (passed_.count(c.unsafeGetTensorImpl())) return c;  // a CPU argument returned as it is
    auto arg = back_.find(c.unsafeGetTensorImpl());
    if (arg != back_.end()) return arg->second;
    if (c.is_nested()) {
      return make_nested(c, to_vnpu(at::native::get_nested_tensor_impl(c)->get_unsafe_storage_as_tensor()));
    }
    if (c.layout() == kSparse) {
      auto* impl = at::sparse::get_sparse_impl(c);
      return make_coo(Device(kVNPU, dev_), c, to_vnpu(impl->indices()), to_vnpu(impl->values()));
    }
    if (is_compressed(c)) {
      auto* impl = at::sparse_csr::get_sparse_csr_impl(c);
      return make_compressed(Device(kVNPU, dev_), c, to_vnpu(impl->compressed_indices()),
                             to_vnpu(impl->plain_indices()), to_vnpu(impl->values()));
    }
    TORCH_CHECK_NOT_IMPLEMENTED(c.layout() == kStrided, "vnpu: results of layout ", c.layout(),
                                " are not supported");
    // A view of an argument's device memory (e.g. values() of a sparse argument).
    void* base = ctx_.device_base_of(c.storage().unsafeGetStorageImpl());
    if (base != nullptr && c.storage().unsafeGetStorageImpl()->data_ptr().get() == base) {
      return rewrap_view(bases_.at(base), c);
    }
    return copy_to_vnpu(c);
  }

  IValue to_vnpu(const IValue& v) {
    return map_tensors(v, [this](const Tensor& t) { return to_vnpu(t); });
  }

  // A result the op was asked to put on the CPU (a `device="cpu"` argument,
  // e.g. randn_like(x, device="cpu")): what aliases device memory is copied.
  Tensor to_host(const Tensor& c) {
    if (!c.defined() || is_vnpu(c)) return c;
    if (c.is_nested()) {
      return make_nested(c, to_host(at::native::get_nested_tensor_impl(c)->get_unsafe_storage_as_tensor()));
    }
    if (c.layout() == kSparse) {
      auto* impl = at::sparse::get_sparse_impl(c);
      return make_coo(Device(kCPU), c, to_host(impl->indices()), to_host(impl->values()));
    }
    if (is_compressed(c)) {
      auto* impl = at::sparse_csr::get_sparse_csr_impl(c);
      return make_compressed(Device(kCPU), c, to_host(impl->compressed_indices()), to_host(impl->plain_indices()),
                             to_host(impl->values()));
    }
    if (passed_.count(c.unsafeGetTensorImpl())) return c;
    const bool device_memory = back_.count(c.unsafeGetTensorImpl()) ||
                               ctx_.device_base_of(c.storage().unsafeGetStorageImpl()) != nullptr;
    return device_memory ? c.clone() : c;
  }

  IValue to_host(const IValue& v) {
    return map_tensors(v, [this](const Tensor& t) { return to_host(t); });
  }

  // Propagates what the kernel did to the mutable argument `arg` (vnpu) into it.
  void write_back(const Tensor& arg) {
    if (!is_vnpu(arg)) return;
    auto it = converted_.find(arg.unsafeGetTensorImpl());
    if (it == converted_.end()) return;
    const Tensor& c = it->second;
    if (arg.is_nested()) {
      // In-place nested kernels write through the buffer's alias into device memory (nested tensors
      // cannot be resized, so the buffer stays).
    } else if (arg.layout() == kSparse) {
      auto* dst = at::sparse::get_sparse_impl(arg);
      auto* src = at::sparse::get_sparse_impl(c);
      write_back_dense(dst->indices());
      write_back_dense(dst->values());
      // The kernel may have replaced the components (or the dims/sizes).
      dst->raw_resize_(src->sparse_dim(), src->dense_dim(), c.sizes());
      dst->set_indices_and_values_unsafe(to_vnpu(src->indices()), to_vnpu(src->values()));
      dst->set_coalesced(src->coalesced());
    } else if (is_compressed(arg)) {
      auto* dst = at::sparse_csr::get_sparse_csr_impl(arg);
      auto* src = at::sparse_csr::get_sparse_csr_impl(c);
      write_back_dense(dst->compressed_indices());
      write_back_dense(dst->plain_indices());
      write_back_dense(dst->values());
      dst->set_layout(c.layout());
      dst->set_member_tensors(to_vnpu(src->compressed_indices()), to_vnpu(src->plain_indices()),
                              to_vnpu(src->values()), c.sizes());
    } else {
      write_back_dense(arg);
    }
  }

 private:
  // A nested tensor like `like` (sizes, strides, offsets: CPU tensors, shared) over `buffer`'s memory.
  static Tensor make_nested(const Tensor& like, const Tensor& buffer) {
    auto* impl = at::native::get_nested_tensor_impl(like);
    return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, impl->get_nested_sizes(),
                                                                 impl->get_nested_strides(),
                                                                 impl->get_storage_offsets());
  }

  struct Dense {
    Tensor dev, cpu;
    const void* data;  // the CPU storage's data pointer when the call started
  };

  Tensor copy_to_vnpu(const Tensor& c) {
    auto opts = c.options().device(Device(kVNPU, dev_));
    Tensor out = c.is_non_overlapping_and_dense() ? at::empty_strided(c.sizes(), c.strides(), opts)
                                                  : at::empty(c.sizes(), opts);
    out.copy_(c);
    return out;
  }

  // A strided argument the kernel mutated: new metadata on the same memory,
  // or (its storage grew into host memory) new memory whose values are copied.
  void write_back_dense(const Tensor& dev) {
    for (const Dense& d : dense_) {
      if (!d.dev.is_same(dev)) continue;
      const Tensor& c = d.cpu;
      if (c.storage().unsafeGetStorageImpl()->data_ptr().get() != d.data) {
        if (!dev.sizes().equals(c.sizes())) dev.resize_(c.sizes());
        dev.copy_(c);
      } else if (!(dev.sizes().equals(c.sizes()) && dev.strides().equals(c.strides()) &&
                   dev.storage_offset() == c.storage_offset())) {
        dev.unsafeGetTensorImpl()->set_sizes_and_strides(c.sizes(), c.strides(), c.storage_offset());
      }
      return;
    }
  }

  DeviceIndex dev_;
  AliasContext ctx_;
  std::vector<Dense> dense_;
  std::unordered_map<const c10::TensorImpl*, Tensor> converted_;  // vnpu argument -> CPU stand-in
  std::unordered_map<const c10::TensorImpl*, Tensor> back_;       // CPU stand-in -> vnpu argument
  std::unordered_map<const c10::TensorImpl*, Tensor> passed_;     // CPU arguments (passed as they are)
  std::unordered_map<const void*, Tensor> bases_;                 // device storage base -> a vnpu tensor on it
};

// Arguments that are CPU tensors on CUDA too: a strided nested tensor's
// metadata (sizes, strides, offsets; _nested_view_from_buffer, _nested_from_padded).
bool is_nested_metadata_arg(const c10::Argument& a) {
  const auto& n = a.name();
  return n == "nested_size" || n == "nested_strides" || n == "offsets" || n == "cpu_nested_shape_example";
}

// The device of the call; the errors CUDA raises for tensors on other devices
// (CPU scalars and nested metadata are allowed; copy_ and _to_copy move between devices).
DeviceIndex call_device(const c10::OperatorHandle& op, ArrayRef<IValue> args) {
  const bool any_device = op.schema().name() == "aten::copy_" || op.schema().name() == "aten::_to_copy";
  DeviceIndex dev = -1;
  for (const IValue& a : args) {
    if (a.isDevice() && a.toDevice().type() == kVNPU) {
      dev = a.toDevice().has_index() ? a.toDevice().index() : c10::vnpu::current_device();
    }
  }
  std::optional<Device> other;
  auto visit = [&](const Tensor& t) {
    if (!t.defined()) return;
    if (is_vnpu(t)) {
      if (dev < 0) dev = t.device().index();
      else if (t.device().index() != dev && !any_device) other = t.device();
    } else if (!any_device && !(t.layout() == kStrided && t.dim() == 0)) {
      other = t.device();
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& a = args[i];
    if (a.isTensor() && !is_nested_metadata_arg(op.schema().arguments()[i])) visit(a.toTensor());
    else if (a.isTensorList()) for (const Tensor& t : a.toTensorList()) visit(t);
    else if (a.isList()) for (const IValue& e : a.toListRef()) if (e.isTensor()) visit(e.toTensor());
  }
  if (dev < 0) dev = c10::vnpu::current_device();
  TORCH_CHECK(!other.has_value(), "Expected all tensors to be on the same device, but found at least two devices, ",
              Device(kVNPU, dev), " and ", *other, "!");
  return dev;
}

bool is_nested_metadata_op(const std::string& name) {
  return name == "aten::_nested_tensor_size" || name == "aten::_nested_tensor_strides" ||
         name == "aten::_nested_tensor_storage_offsets";
}

// Execution counters for torch.vnpu.get_executed_ops(), one per op.
std::atomic<uint64_t>& op_counter(const c10::OperatorHandle& op) {
  struct Counter {
    std::string name;
    std::atomic<uint64_t> calls{0};
  };
  static std::mutex mu;  // guards counters
  static std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<Counter>> counters;
  std::lock_guard<std::mutex> g(mu);
  auto& c = counters[&op.schema()];
  if (!c) {
    c = std::make_unique<Counter>();
    const auto& s = op.schema();
    c->name = s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name());
    register_op_counter(&c->name, &c->calls);
  }
  return c->calls;
}

// The boxed fallback of SparsePrivateUse1 and SparseCsrPrivateUse1 (and of the
// strided → sparse conversions on PrivateUse1).
void sparse_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack) {
  const auto& schema = op.schema();
  // Collectives would run on host copies here and leave the vnpu tensors as they were.
  TORCH_CHECK_NOT_IMPLEMENTED(schema.name().rfind("c10d::", 0) != 0, "vccl: ", schema.name(),
                              " on sparse vnpu tensors is not supported; communicate a dense tensor "
                              "(t.to_dense()) or the indices and values of a coalesced one");
  const size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  const DeviceIndex dev = call_device(op, args);
  c10::DeviceGuard guard(Device(kVNPU, dev));
  op_counter(op).fetch_add(1, std::memory_order_relaxed);
  if (C10_UNLIKELY(c10::vnpu::get_sync_debug_mode() != c10::vnpu::SyncDebugMode::L_DISABLED))
    c10::vnpu::warn_or_error_on_sync(schema.name() + " on sparse vnpu tensors (ran synchronously on vnpu)",
                                     /*as_on_cuda=*/false);
  c10::vnpu::SyncReportedGuard reported;
  VNPU_CHECK(vnpuStreamSynchronize(c10::vnpu::getCurrentVNPUStream(dev).stream()));
  flush_worker_warnings();  // Note [Worker warnings]: the stream has run up to here
  // The CPU kernels read and write device memory on this thread: See Note [Synchronous kernels under check 4].
  sanitizer::HostKernelGuard device_access;

  SparseCall call(dev);
  Stack s;
  s.reserve(n);
  for (const IValue& a : args) s.push_back(call.to_cpu(a));
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // the CPU stand-ins never require grad
    op.callBoxed(s);
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& ai = schema.arguments()[i].alias_info();
    if (ai && ai->isWrite() && args[i].isTensor()) call.write_back(args[i].toTensor());
  }
  // Results requested on the CPU, or a nested tensor's metadata (CPU tensors on CUDA too).
  bool on_host = is_nested_metadata_op(schema.name());
  for (const IValue& a : args) on_host |= a.isDevice() && a.toDevice().is_cpu();
  std::vector<IValue> results;
  results.reserve(schema.returns().size());
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    const auto& ri = schema.returns()[r].alias_info();
    int mutated = -1;
    if (ri && ri->isWrite()) {
      for (size_t i = 0; i < n; ++i) {
        const auto& ai = schema.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == ri->beforeSets()) mutated = static_cast<int>(i);
      }
    }
    results.push_back(mutated >= 0 ? args[mutated] : on_host ? call.to_host(s[r]) : call.to_vnpu(s[r]));
  }
  torch::jit::drop(*stack, n);
  for (auto& r : results) stack->push_back(std::move(r));
}

}  // namespace

// Ops with a sparse CPU kernel and a CompositeExplicitAutograd kernel (e.g.
// copy_, zero_, clone) would take the composite on vnpu (a backend fallback
// loses to composites); route them to the sparse fallback, as CPU runs its
// sparse kernel. Likewise nested CPU kernels, also of implicit composites. Idempotent; called once all ops are registered.
void register_sparse_kernel_overrides() {
  static torch::Library* libs = [] {
    auto* coo = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
    auto* csr = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__);
    auto* nested =
        new torch::Library(torch::Library::IMPL, "aten", DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = c10::Dispatcher::singleton().findOp(name);
      if (!op) continue;
      const bool explicit_composite = op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
                                      op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional);
      // Nested kernels also stand in for implicit composites (linear, matmul, sdpa), whose decompositions
      // cannot run on nested tensors.
      const bool implicit_composite = op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd);
      if (!explicit_composite && !implicit_composite) continue;
      std::string short_name = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      for (auto [cpu, vnpu, lib, implicit_too] :
           {std::tuple{DispatchKey::SparseCPU, DispatchKey::SparsePrivateUse1, coo, false},
            std::tuple{DispatchKey::SparseCsrCPU, DispatchKey::SparseCsrPrivateUse1, csr, false},
            std::tuple{DispatchKey::NestedTensorCPU, DispatchKey::NestedTensorPrivateUse1, nested, true}}) {
        if (!explicit_composite && !implicit_too) continue;
        if (op->hasKernelForDispatchKey(cpu) && !op->hasKernelForDispatchKey(vnpu))
          lib->impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
      }
    }
    return coo;
  }();
  (void)libs;
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

// Metadata of sparse tensors: ATen's device-agnostic kernels, no synchronization.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
}

// Strided vnpu tensor → sparse layouts (their CPU kernels are registered for the dense CPU key).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"_to_sparse", "_to_sparse.sparse_dim", "_to_sparse_csr", "_to_sparse_csc",
                           "_to_sparse_bsr", "_to_sparse_bsc", "_nested_tensor_from_mask", "_nested_from_padded",
                           "_nested_view_from_buffer"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
  }
}

}  // namespace at::vnpu
