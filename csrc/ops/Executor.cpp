#include "Executor.h"

#include "CpuAlias.h"
#include "Factory.h"
#include "HostModes.h"
#include "HostOpenMP.h"
#include "Interrupts.h"
#include "OpPolicies.h"
#include "OpStats.h"
#include "OutKernels.h"
#include "WorkerWarnings.h"
#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"
#include "../core/VNPUGeneratorImpl.h"
#include "../core/VNPUGraph.h"
#include "../core/VNPUStream.h"
#include "../sanitizer/Sanitizer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/irange.h>

#include <array>
#include <atomic>
#include <limits>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace at::vnpu {
namespace {

using c10::IValue;
using torch::jit::Stack;

constexpr DeviceType kVNPU = DeviceType::PrivateUse1;

// ---------------------------------------------------------------------------
// Note [Meta cache]
// Output metadata depends on the tensors' metadata and on the non-tensor
// arguments, so it is cached per op under a key made of exactly those (dtype,
// sizes, strides and flags of every tensor; ints, lists, strings, devices...).
// Floating-point and Scalar arguments enter the key by type only (their values
// do not change output shapes) except for ops with mutable arguments, where
// e.g. arange.out's Scalars size the output. Training loops repeat the same
// shapes, so most ops skip the Meta kernel (often Python) after the first step.

struct TensorMeta {
  bool defined = false;
  ScalarType dtype = ScalarType::Float;
  c10::SmallVector<int64_t, 5> sizes, strides;
  // Set by kernels that return a lazily conjugated/negated result (e.g.
  // linalg_lu_solve(adjoint=True, left=False) on complex inputs).
  bool conj = false, neg = false;
};

struct MetaResult {
  bool sync = false;                                      // meta inference failed: run synchronously
  std::string reason;                                     // why (for get_fallback_ops)
  std::vector<std::vector<TensorMeta>> returns;          // per return: one (Tensor) or many (Tensor[])
  std::vector<bool> return_is_list;
  std::vector<std::pair<size_t, TensorMeta>> mutated;    // mutable args whose layout the op sets
};

TensorMeta tensor_meta(const Tensor& t) {
  TensorMeta m;
  if (!t.defined()) return m;
  m.defined = true;
  m.dtype = t.scalar_type();
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  m.strides.assign(t.strides().begin(), t.strides().end());
  m.conj = t.is_conj();
  m.neg = t.is_neg();
  return m;
}

enum KeyTag : int64_t { kNone = -100, kTensorTag, kListTag, kIntTag, kDoubleTag, kBoolTag, kStrTag, kDevTag,
                        kComplexTag, kGenTag, kSymTag };

struct KeyBuilder {
  std::vector<int64_t>& k;  // a reused per-thread buffer
  explicit KeyBuilder(std::vector<int64_t>& buf) : k(buf) { k.clear(); }
  bool ok = true;
  void tensor(const Tensor& t) {
    if (!t.defined()) { k.push_back(kNone); return; }
    k.push_back(kTensorTag);
    k.push_back(static_cast<int64_t>(t.scalar_type()));
    k.push_back(t.dim());
    for (auto v : t.sizes()) k.push_back(v);
    for (auto v : t.strides()) k.push_back(v);
    k.push_back((t.unsafeGetTensorImpl()->is_wrapped_number() ? 1 : 0) | (t.is_conj() ? 2 : 0) |
                (t.is_neg() ? 4 : 0) | (t.device().is_cpu() ? 8 : 0));
  }
  void value(const IValue& v, bool exact_numbers) {
    if (v.isTensor()) tensor(v.toTensor());
    else if (v.isNone()) k.push_back(kNone);
    else if (v.isInt()) { k.push_back(kIntTag); k.push_back(v.toInt()); }
    else if (v.isBool()) { k.push_back(kBoolTag); k.push_back(v.toBool()); }
    else if (v.isDouble()) {
      k.push_back(kDoubleTag);
      double d = v.toDouble();
      int64_t bits = 0;
      if (exact_numbers) std::memcpy(&bits, &d, sizeof(bits));
      k.push_back(bits);
    } else if (v.isComplexDouble()) {
      k.push_back(kComplexTag);
      if (exact_numbers) { auto c = v.toComplexDouble(); int64_t b[2]; std::memcpy(b, &c, 16); k.push_back(b[0]); k.push_back(b[1]); }
    } else if (v.isList()) {
      k.push_back(kListTag);
      k.push_back(static_cast<int64_t>(v.toListRef().size()));
      for (const IValue& e : v.toListRef()) value(e, /*exact_numbers=*/true);  // e.g. scale factors
    } else if (v.isString()) {
      k.push_back(kStrTag);
      k.push_back(static_cast<int64_t>(std::hash<std::string_view>{}(v.toStringView())));
    } else if (v.isDevice()) {
      k.push_back(kDevTag);
      k.push_back(static_cast<int64_t>(v.toDevice().type()));
      k.push_back(v.toDevice().index());
    } else if (v.isGenerator()) {
      k.push_back(kGenTag);
    } else {
      ok = false;  // symbolic or exotic values: do not cache
    }
  }
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    size_t h = k.size();
    for (auto v : k) h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

struct MetaCache {
  std::mutex mu;  // guards map and signatures
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const MetaResult>, KeyHash> map;
  // Note [Meta kernels are checked against CPU]: per dtype signature of the
  // inputs, whether the Meta kernel's output metadata equals what the CPU
  // kernel produces (1) or not (2; e.g. bf16 layer norm's float mean/rstd on
  // CPU, channels_last convolution outputs). Unknown signatures run the CPU
  // kernel synchronously once and compare; for mismatching ones every new
  // metadata key runs synchronously once and the CPU's metadata is cached.
  std::unordered_map<std::vector<int64_t>, int8_t, KeyHash> signatures;
  // Note [Overlap errors]: aliasing patterns whose stand-in run raised nothing.
  std::unordered_set<std::vector<int64_t>, KeyHash> overlap_ok;
};

constexpr size_t kMetaCacheLimit = 4096;  // entries per op; cleared when full

// ---------------------------------------------------------------------------
// Per-op facts, computed once from the schema.

enum class Path { Async, Sync, View, InplaceView };

struct OpInfo {
  std::string name;                  // "aten::add.Tensor"
  Path path = Path::Async;
  std::string slow_reason;           // non-empty: counted in get_fallback_ops()
  std::optional<c10::OperatorHandle> out_op;  // out= overload for functional ops
  OutKernel out_kernel = nullptr;             // else an out kernel (OutKernels.h)
  std::vector<int> return_arg;       // per return: index of the mutable arg it aliases, or -1
  std::vector<bool> mutable_arg;     // per argument
  std::vector<bool> out_arg;         // per argument: a keyword-only mutable Tensor (out=)
  bool any_out_arg = false;
  std::optional<c10::OperatorHandle> functional_op;  // out= overload run as this + copies (run_out_via_functional)
  std::vector<bool> index_arg;       // per argument: named index/indices (must be integral)
  bool new_outputs = false;          // some return is a fresh tensor
  bool any_mutable = false;
  std::atomic<bool> out_unusable{false};  // out= overload failed at run time (see run_plan)
  bool out_needs_contiguous_input = false;  // Note [out= kernels that read their outputs]
  bool meta_lacks_checks = false;           // Note [Checks Meta kernels lack]
  bool inplace_self = false;                // argument 0 is a mutable `self` the op must not resize
  int sync_if_arg = -1;                     // runs synchronously when this argument is given (host_checks_data)
  int sync_if_mask_arg = -1;                // runs synchronously when this list holds a mask (sync_only_for_masks)
  bool alerts_if_deterministic = false;     // Note [Deterministic alerts at the call]
  bool makes_quantized = false;             // Note [No quantized tensors on vnpu]
  std::atomic<uint64_t> calls{0};         // executions (torch.vnpu.get_executed_ops)
  std::unique_ptr<MetaCache> meta_cache = std::make_unique<MetaCache>();
};

bool same_type(const c10::Argument& a, const c10::Argument& b) {
  return *a.type() == *b.type();
}

// Overload names per operator name, for find_out_overload (out= overloads are
// not named after their functional overload: mul.Tensor's is mul.out,
// sum.dim_IntList's sum.IntList_out, nll_loss_forward's .output).
const std::vector<std::string>& overloads_of(const std::string& name) {
  static std::mutex mu;  // guards index
  static std::unordered_map<std::string, std::vector<std::string>> index;
  std::lock_guard<std::mutex> g(mu);
  if (index.empty()) {
    for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) index[op.name].push_back(op.overload_name);
  }
  static const std::vector<std::string> none;
  auto it = index.find(name);
  return it == index.end() ? none : it->second;
}

// The `out=` overload whose leading arguments are exactly `schema`'s and whose
// trailing keyword-only mutable arguments match its returns.
std::optional<c10::OperatorHandle> find_out_overload(const c10::FunctionSchema& schema) {
  const auto& ov = schema.overload_name();
  std::vector<std::string> candidates = {ov.empty() ? std::string("out") : ov + "_out", ov + "out"};
  for (const auto& o : overloads_of(schema.name()))
    if (o != ov && o != candidates[0] && o != candidates[1]) candidates.push_back(o);
  for (const std::string& cand : candidates) {
    auto h = c10::Dispatcher::singleton().findSchema({schema.name(), cand});
    if (!h) continue;
    const auto& os = h->schema();
    const auto& fa = schema.arguments();
    const auto& oa = os.arguments();
    if (oa.size() != fa.size() + schema.returns().size()) continue;
    bool ok = true;
    for (size_t i = 0; i < fa.size() && ok; ++i) ok = same_type(fa[i], oa[i]) && fa[i].name() == oa[i].name();
    for (size_t i = fa.size(); i < oa.size() && ok; ++i) {
      const auto& r = schema.returns()[i - fa.size()];
      ok = oa[i].alias_info() && oa[i].alias_info()->isWrite() && oa[i].kwarg_only() &&
           oa[i].type()->kind() == r.type()->kind();
    }
    if (ok && h->hasComputedKernelForDispatchKey(DispatchKey::CPU)) return h;
  }
  return std::nullopt;
}

bool is_tensor_like(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return is_tensor_like(o->getElementType());
  if (auto l = t->cast<c10::ListType>()) return is_tensor_like(l->getElementType());
  return false;
}

void compute_info(OpInfo& info, const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  info.name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  for (const auto& a : schema.arguments()) info.mutable_arg.push_back(a.alias_info() && a.alias_info()->isWrite());
  for (bool b : info.mutable_arg) info.any_mutable |= b;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    info.out_arg.push_back(info.mutable_arg[i] && a.kwarg_only() && a.type()->kind() == c10::TypeKind::TensorType);
    info.any_out_arg |= info.out_arg.back();
  }
  for (const auto& a : schema.arguments()) info.index_arg.push_back(a.name() == "index" || a.name() == "indices");
  bool view = false, data_dependent_return = false;
  for (const auto& r : schema.returns()) {
    int idx = -1;
    if (r.alias_info() && r.alias_info()->isWrite()) {
      for (size_t i = 0; i < schema.arguments().size(); ++i) {
        const auto& ai = schema.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets()) idx = static_cast<int>(i);
      }
    } else if (r.alias_info()) {
      view = true;
    } else {
      info.new_outputs = true;
    }
    if (!is_tensor_like(r.type())) data_dependent_return = true;
    info.return_arg.push_back(idx);
  }
  if (op.hasTag(at::Tag::inplace_view)) {
    info.path = Path::InplaceView;
  } else if (view) {
    info.path = Path::View;
  } else if (const char* arg = sync_only_for_masks(info.name); arg != nullptr) {
    for (size_t i = 0; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == arg) info.sync_if_mask_arg = static_cast<int>(i);
    TORCH_INTERNAL_ASSERT(info.sync_if_mask_arg >= 0, info.name, " has no argument ", arg);
  } else if (op.hasTag(at::Tag::dynamic_output_shape) || op.hasTag(at::Tag::data_dependent_output) ||
             data_dependent_return) {
    info.path = Path::Sync;  // expected: the output depends on the data, as on CUDA
  } else if (const char* arg = host_checks_data(info.name); arg != nullptr && *arg == '\0') {
    info.path = Path::Sync;  // expected: CUDA synchronizes for these checks too
  } else if (!op.hasComputedKernelForDispatchKey(DispatchKey::Meta)) {
    info.path = Path::Sync;
    info.slow_reason = "no Meta kernel to infer output metadata: ran synchronously";
  }
  info.meta_lacks_checks = meta_lacks_checks(info.name);
  info.alerts_if_deterministic = alerts_if_deterministic(info.name);
  // Their Meta kernels claim float outputs: the dtype check in infer_meta cannot see them.
  info.makes_quantized = info.name.rfind("aten::quantize_per", 0) == 0 || info.name.rfind("aten::_make_per_", 0) == 0;
  // Note [In-place ops never resize self]
  // CPU's in-place kernels raise "output with shape [..] doesn't match the
  // broadcast shape [..]" when the result would not fit `self`, and so does
  // TensorIterator for an out= tensor that is also an input (composite
  // in-place ops such as logical_and_ call logical_and.out(self, other,
  // out=self)). Some Meta kernels (Python references written as out= +
  // resize) resize the meta `self` instead, with only a deprecation warning,
  // and meta arguments lose the identity of repeated tensors. Once a dtype
  // signature is trusted the Meta kernel alone decides (Note [Meta kernels are
  // checked against CPU]), and vnpu resized `self` and filled it. So a Meta
  // result that changes the sizes of an in-place op's `self`, or of an out=
  // tensor also passed as an input, runs the CPU kernel synchronously, which
  // raises CPU's own error. Ops whose job is to resize (resize_, set_, the
  // in-place views) are not in-place ops in this sense.
  if (!schema.arguments().empty() && schema.arguments()[0].name() == "self" && info.mutable_arg[0] &&
      info.path == Path::Async && schema.name().find("resize") == std::string::npos &&
      schema.name() != "aten::set_")
    info.inplace_self = true;
  if (const char* arg = host_checks_data(info.name); arg != nullptr && *arg != '\0') {
    for (size_t i = 0; i < schema.arguments().size(); ++i)
      if (schema.arguments()[i].name() == arg) info.sync_if_arg = static_cast<int>(i);
  }
  // See Note [out= kernels that read their outputs]: an explicit out= call of
  // such an op runs its functional overload (which vnpu computes right) and
  // copies the results into the out= tensors.
  if (const auto& ov = schema.overload_name(); ov.size() >= 3 && ov.compare(ov.size() - 3, 3, "out") == 0) {
    const std::string fov = ov == "out" ? "" : ov.substr(0, ov.size() - (ov.size() > 4 && ov[ov.size() - 4] == '_' ? 4 : 3));
    if (out_needs_contiguous_input(schema.name() + (fov.empty() ? "" : "." + fov)))
      info.functional_op = c10::Dispatcher::singleton().findSchema({schema.name(), fov});
  }
  if (info.path == Path::Async && info.new_outputs) {
    info.out_op = find_out_overload(schema);
    info.out_needs_contiguous_input = out_needs_contiguous_input(info.name);
    if (!info.out_op) info.out_kernel = find_out_kernel(info.name);
  }
}

OpInfo& op_info(const c10::OperatorHandle& op) {
  // A per-thread map in front of the shared one keeps the hot path lock-free.
  thread_local std::unordered_map<const c10::FunctionSchema*, OpInfo*> local;
  auto hit = local.find(&op.schema());
  if (hit != local.end()) return *hit->second;
  static std::mutex mu;  // guards cache
  static std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>> cache;
  std::lock_guard<std::mutex> g(mu);
  auto& slot = cache[&op.schema()];
  if (!slot) {
    slot = std::make_unique<OpInfo>();
    compute_info(*slot, op);
    register_op_counter(&slot->name, &slot->calls);
  }
  local.emplace(&op.schema(), slot.get());
  return *slot;
}

// ---------------------------------------------------------------------------
// Device checks (the errors PyTorch raises for CUDA).

// CUDA's check (check_and_update_common_device): the first tensor that is not a
// CPU scalar sets the common device; the first argument on another device is
// named with the op. A CPU tensor that requires grad is most often a module's
// parameter left on the CPU: the message says so.
struct DeviceFinder {
  const std::string& op_name;
  DeviceIndex dev = -1;
  std::optional<Device> common;
  const Tensor* common_tensor = nullptr;
  const char* arg = "";

  void mismatch(const Tensor& t) {
    // Only a CPU tensor can be a module's parameter left on the CPU.
    const bool param = t.device().is_cpu() ? t.requires_grad()
                                           : common->is_cpu() && common_tensor && common_tensor->requires_grad();
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", *common,
                " and ", t.device(), "! (when checking argument for argument ", arg, " in method ", op_name, ")",
                param ? ". The cpu tensor requires grad: if it is a module's parameter, move the module to the "
                        "device with module.to(\"vnpu\") (as for CUDA)"
                      : "");
  }
  void tensor(const Tensor& t) {
    if (!t.defined()) return;
    Device d = t.device();
    if (d.is_cpu() && t.dim() == 0) return;  // CPU scalars are allowed, as on CUDA
    if (!common) {
      common = d;
      common_tensor = &t;
    } else if (*common != d) {
      mismatch(t);
    }
    if (d.type() == kVNPU && dev < 0) dev = d.index();
  }
  void value(const IValue& v, const char* name) {
    arg = name;
    if (v.isTensor()) tensor(v.toTensor());
    else if (v.isTensorList()) for (const auto& t : v.toTensorList()) tensor(t);
    else if (v.isList()) {
      for (const IValue& e : v.toListRef()) if (e.isTensor()) tensor(e.toTensor());
    } else if (v.isDevice() && v.toDevice().type() == kVNPU && dev < 0) {
      dev = v.toDevice().has_index() ? v.toDevice().index() : c10::vnpu::current_device();
    }
  }
  // Every tensor was on the CPU (e.g. only CPU tensors but a vnpu device argument): CUDA's message too.
  void finish() {
    if (common && common->is_cpu() && common_tensor != nullptr) {
      const Tensor& t = *common_tensor;
      common = Device(kVNPU, dev >= 0 ? dev : c10::vnpu::current_device());
      mismatch(t);
    }
  }
};

// ---------------------------------------------------------------------------
// Meta inference.

Tensor to_meta(const Tensor& t) {
  // CPU scalars stay on the CPU: meta kernels accept them as they are, and
  // Python meta kernels turn wrapped numbers into Python numbers.
  if (!t.defined() || t.device().is_cpu()) return t;
  auto m = at::empty_strided(t.sizes(), t.strides(), t.options().device(kMeta));
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.unsafeGetTensorImpl()->set_wrapped_number(true);
  if (t.is_conj()) m._set_conj(true);
  if (t.is_neg()) m._set_neg(true);
  return m;
}

IValue to_meta(const IValue& v) {
  if (v.isDevice() && v.toDevice().type() == kVNPU) return Device(kMeta);
  if (v.isGenerator()) return IValue();
  return map_tensors(v, [](const Tensor& t) { return to_meta(t); });
}

// Note [Overlap errors]
// CPU kernels reject an out=/in-place argument that overlaps itself or
// partially overlaps an input ("unsupported operation: ..."). Meta kernels
// do not all check, and the vnpu path re-lays out out= arguments before the
// kernel runs, so such calls first run CPU's kernel on stand-in CPU tensors
// that share storage exactly as the arguments do, and raise its overlap
// error at the call. Only calls with such aliasing pay for it.
// True if a mutable argument overlaps itself (stride 0) or shares its
// storage with another argument; then `pattern` receives the metadata the
// overlap checks depend on (per vnpu tensor: argument, storage group, offset,
// sizes, strides), so a pattern found harmless is not run again.
bool mutable_arg_overlaps(const OpInfo& info, ArrayRef<IValue> args, std::vector<int64_t>& pattern) {
  if (!info.any_mutable) return false;
  // (argument index, storage) of every vnpu tensor; Tensor lists hand out
  // temporaries, so nothing here keeps a pointer to a Tensor.
  std::vector<std::pair<size_t, const c10::StorageImpl*>> uses_of;
  bool internal_overlap = false;
  auto add = [&](const Tensor& t, size_t i) {
    if (!t.defined() || t.device().type() != kVNPU) return;
    uses_of.emplace_back(i, t.storage().unsafeGetStorageImpl());
    if (info.mutable_arg[i] && at::has_internal_overlap(t) == at::MemOverlap::Yes) internal_overlap = true;
  };
  auto for_each_tensor = [&](auto&& fn) {
    for (size_t i = 0; i < args.size(); ++i) {
      const IValue& a = args[i];
      if (a.isTensor()) fn(a.toTensor(), i);
      else if (a.isTensorList()) for (const Tensor t : a.toTensorList()) fn(t, i);
      else if (a.isList()) for (const IValue& e : a.toListRef()) if (e.isTensor()) fn(e.toTensor(), i);
    }
  };
  for_each_tensor(add);
  std::unordered_map<const c10::StorageImpl*, int> count;  // foreach ops pass hundreds of tensors
  count.reserve(uses_of.size());
  for (const auto& u : uses_of) ++count[u.second];
  bool shared = internal_overlap;
  for (const auto& [i, st] : uses_of) shared |= info.mutable_arg[i] && count[st] > 1;
  if (!shared) return false;
  std::unordered_map<const c10::StorageImpl*, int64_t> group;
  pattern.clear();
  for_each_tensor([&](const Tensor& t, size_t i) {
    if (!t.defined() || t.device().type() != kVNPU) return;
    pattern.push_back(static_cast<int64_t>(i));
    pattern.push_back(group.emplace(t.storage().unsafeGetStorageImpl(), static_cast<int64_t>(group.size())).first->second);
    pattern.push_back(static_cast<int64_t>(t.scalar_type()));
    pattern.push_back(t.storage_offset());
    pattern.push_back(t.dim());
    for (auto v : t.sizes()) pattern.push_back(v);
    for (auto v : t.strides()) pattern.push_back(v);
  });
  return true;
}

// ---------------------------------------------------------------------------
// Task plans: what the worker needs, with no reference to vnpu tensors.

struct Slot {
  enum Kind { Value, Tensor, TensorList, OptTensorList, Gen } kind = Value;
  IValue value;
  c10::SmallVector<TensorSpec, 1> specs;  // inline for one tensor: Note [Plan reuse]
  uint64_t seed = 0;  // Gen: CPU generator seed
  // Gen inside a graph capture: the seed comes from the replay's base at run
  // time (Note [Random numbers in graphs], VNPUGraph.h).
  std::shared_ptr<PhiloxBase> philox;
  uint64_t philox_offset = 0;  // this draw's offset within the graph
};

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int64_t max_numel(ArrayRef<IValue> args) {
  int64_t n = 1;
  for (const auto& v : args) {
    if (v.isTensor() && v.toTensor().defined()) n = std::max(n, v.toTensor().numel());
  }
  return n;
}

uint64_t philox_seed(uint64_t seed, uint64_t offset) { return mix(seed ^ mix(offset)); }

// The CPU generator seed standing in for a vnpu Generator argument: fixed now,
// or (in a graph capture) read from the replay's base when the task runs.
void generator_slot(Slot& s, const IValue& g, DeviceIndex dev, int64_t numel) {
  Generator gen = g.isGenerator() ? g.toGenerator() : getDefaultVNPUGenerator(dev);
  TORCH_CHECK(gen.device().type() == kVNPU, "Expected a 'vnpu' device type for generator but found '",
              gen.device().type(), "'");
  auto* impl = gen.get<VNPUGeneratorImpl>();
  if (graph_philox_inputs(impl, dev, static_cast<uint64_t>(numel), &s.philox, &s.philox_offset)) return;
  std::lock_guard<std::mutex> lock(impl->mutex_);
  auto [seed, offset] = impl->philox_engine_inputs(static_cast<uint64_t>(numel));
  s.seed = philox_seed(seed, offset);
}

// Fills a default-constructed slot in place (Slot moves copy inline specs).
void fill_slot(Slot& s, const IValue& v, const c10::Argument& arg, DeviceIndex dev, int64_t numel) {
  auto kind = arg.type()->kind();
  if (kind == c10::TypeKind::OptionalType) kind = arg.type()->cast<c10::OptionalType>()->getElementType()->kind();
  if (kind == c10::TypeKind::GeneratorType) {
    s.kind = Slot::Gen;
    generator_slot(s, v, dev, numel);
  } else if (v.isTensor()) {
    s.kind = Slot::Tensor;
    spec_into(s.specs.emplace_back(), v.toTensor());
  } else if (v.isTensorList()) {
    s.kind = Slot::TensorList;
    for (const auto& t : v.toTensorList()) spec_into(s.specs.emplace_back(), t);
  } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    s.kind = Slot::OptTensorList;
    for (const IValue& e : v.toListRef()) s.specs.push_back(spec_of(e.isTensor() ? e.toTensor() : Tensor()));
  } else if (v.isDevice() && v.toDevice().type() == kVNPU) {
    s.value = Device(kCPU);
  } else {
    s.value = v;
  }
}

Slot make_slot(const IValue& v, const c10::Argument& arg, DeviceIndex dev, int64_t numel) {
  Slot s;
  fill_slot(s, v, arg, dev, numel);
  return s;
}

IValue materialize(const Slot& s, AliasContext& ctx) {
  switch (s.kind) {
    case Slot::Value: return s.value;
    case Slot::Tensor: return ctx.make(s.specs[0]);
    case Slot::TensorList: {
      c10::List<Tensor> l;
      for (const auto& sp : s.specs) l.push_back(ctx.make(sp));
      return l;
    }
    case Slot::OptTensorList: {
      c10::List<std::optional<Tensor>> l;
      for (const auto& sp : s.specs) l.push_back(sp.defined ? std::optional<Tensor>(ctx.make(sp)) : std::nullopt);
      return l;
    }
    case Slot::Gen:
      return at::make_generator<at::CPUGeneratorImpl>(
          s.philox ? philox_seed(s.philox->seed, s.philox->offset + s.philox_offset) : s.seed);
  }
  return IValue();
}

struct Plan {
  explicit Plan(c10::OperatorHandle o) : op(std::move(o)) {}
  void reset(const c10::OperatorHandle& o) {  // as freshly constructed, keeping capacity
    op = o;
    out_op.reset();
    out_kernel = nullptr;
    args.clear();
    outs.clear();
    out_unusable = nullptr;
    mutable_arg = nullptr;
  }
  c10::OperatorHandle op;       // the functional op
  std::optional<c10::OperatorHandle> out_op;  // its out= overload, when used
  OutKernel out_kernel = nullptr;               // else its out kernel, when used
  std::vector<Slot> args;
  std::vector<Slot> outs;       // appended as out= args, or copy targets
  std::atomic<bool>* out_unusable = nullptr;  // OpInfo flag set when out= cannot be used
  const std::vector<bool>* mutable_arg = nullptr;  // OpInfo's, per argument of `op`
};

// Note [Plan reuse]
// A plan is built on the calling thread and released by the stream's worker
// once its task ran. Freed there, its memory would cross threads, and glibc's
// malloc then takes arena locks on both sides (a fifth of an add's host time).
// Each calling thread keeps its last kPlanRing plans and rebuilds the oldest
// in place once the worker has released it (graph captures keep theirs), so a
// loop of ops allocates no plan memory.
constexpr size_t kPlanRing = 256;

std::shared_ptr<Plan> acquire_plan(const c10::OperatorHandle& op) {
  thread_local std::array<std::shared_ptr<Plan>, kPlanRing> ring;
  thread_local size_t next = 0;
  std::shared_ptr<Plan>& slot = ring[next];
  next = (next + 1) % kPlanRing;
  if (slot && slot.use_count() == 1) {
    std::atomic_thread_fence(std::memory_order_acquire);  // after the worker's last use of it
    slot->reset(op);
  } else {
    slot = std::make_shared<Plan>(op);
  }
  return slot;
}

bool is_not_resizable_error(const c10::Error& e) {
  return std::string_view(e.what_without_backtrace()).find("not resizable") != std::string_view::npos;
}

// Note [Scratch outputs]
// Some out= kernels use their output as scratch of another shape before
// writing the final result (e.g. mse_loss.out with a reduction resizes `out`
// to the input's shape, then reduces into it). Device memory cannot grow
// under a CPU alias, so such a call reruns with resizable host copies of its
// mutable arguments and copies the final values into the planned layout.
// The failed attempt stopped at the resize, before writing anything.
void run_with_scratch_outputs(const Plan& p, AliasContext& ctx, Stack& s) {
  s.clear();
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (alias of device memory, scratch)
  for (size_t i = 0; i < p.args.size(); ++i) {
    IValue v = materialize(p.args[i], ctx);
    if ((*p.mutable_arg)[i] && v.isTensor() && v.toTensor().defined()) {
      Tensor scratch = v.toTensor().clone(at::MemoryFormat::Preserve);
      write_back.emplace_back(v.toTensor(), scratch);
      v = scratch;
    }
    s.push_back(std::move(v));
  }
  p.op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
  for (auto& [alias, scratch] : write_back) {
    TORCH_CHECK(alias.sizes().equals(scratch.sizes()), "vnpu: the kernel resized an argument from ", alias.sizes(),
                " to ", scratch.sizes(), ", unlike its Meta kernel");
    alias.copy_(scratch);
  }
}

void prepare_worker_thread() {
  thread_local bool ready = false;
  if (!ready) {
    at::init_num_threads();
    capture_warnings_on_this_thread();  // Note [Worker warnings]
    ready = true;
  }
}

// Some out= kernels re-lay out their output (e.g. max_unpool2d's
// resize_(..., memory_format) for channels-last inputs); the CPU alias then
// no longer matches the vnpu output the caller already holds. The values
// move into the planned layout (one extra copy, only when it happens).
void restore_planned_layouts(const Plan& p, const std::vector<IValue>& outs, AliasContext& ctx) {
  auto fix = [&](const Tensor& written, const TensorSpec& spec) {
    if (!written.defined() || (written.sizes().equals(spec.sizes) && written.strides().equals(spec.strides))) return;
    TORCH_CHECK(written.sizes().equals(spec.sizes), "vnpu: the out= kernel resized its output from ", c10::IntArrayRef(spec.sizes),
                " to ", written.sizes());
    Tensor values = written.clone();
    ctx.make(spec).copy_(values);
  };
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].isTensor()) fix(outs[i].toTensor(), p.outs[i].specs[0]);
    else if (outs[i].isTensorList()) {
      auto l = outs[i].toTensorList();
      for (size_t j = 0; j < l.size(); ++j) fix(l.get(j), p.outs[i].specs[j]);
    }
  }
}

void run_plan(const Plan& p) {
  AliasContext ctx;
  Stack s;
  s.reserve(p.args.size() + p.outs.size());
  for (const auto& a : p.args) s.push_back(materialize(a, ctx));
  if (p.out_op) {
    for (const auto& o : p.outs) s.push_back(materialize(o, ctx));
    std::vector<IValue> outs(s.end() - p.outs.size(), s.end());
    std::optional<AttemptWarnings> attempt(std::in_place);  // e.g. "output was resized" before a failed resize
    try {
      p.out_op->redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
      attempt->commit();
      restore_planned_layouts(p, outs, ctx);
      return;
    } catch (const c10::Error& e) {
      // Some out= kernels use their output as scratch of another shape (e.g.
      // binary_cross_entropy.out); device memory cannot grow under them. Use
      // the functional kernel for this op from now on.
      if (!is_not_resizable_error(e)) {
        attempt->commit();
        throw;
      }
      p.out_unusable->store(true);
    }
    attempt.reset();
    s.clear();
    for (const auto& a : p.args) s.push_back(materialize(a, ctx));
  }
  if (p.out_kernel) {
    std::vector<IValue> outs;
    for (const auto& o : p.outs) outs.push_back(materialize(o, ctx));
    AttemptWarnings attempt;
    try {
      p.out_kernel(s, outs);
    } catch (...) {
      attempt.commit();
      throw;
    }
    attempt.commit();
    return;
  }
  std::optional<AttemptWarnings> attempt(std::in_place);
  try {
    p.op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
    attempt->commit();
  } catch (const c10::Error& e) {
    if (!is_not_resizable_error(e) || !p.outs.empty()) {
      attempt->commit();
      throw;
    }
    attempt.reset();
    run_with_scratch_outputs(p, ctx, s);  // an explicit out= call (p.op is the out= overload)
  }
  attempt.reset();
  for (size_t i = 0; i < p.outs.size(); ++i) {
    IValue dst = materialize(p.outs[i], ctx);
    if (dst.isNone()) continue;
    if (dst.isTensor()) {
      if (dst.toTensor().defined()) dst.toTensor().copy_(s[i].toTensor());
    } else if (dst.isTensorList()) {
      auto src = s[i].toTensorList();
      auto d = dst.toTensorList();
      for (size_t j = 0; j < d.size(); ++j) d.get(j).copy_(src.get(j));
    }
  }
}

// ---------------------------------------------------------------------------
// The three paths.

// Boolean or uint8 index tensors (x[mask]): the output size depends on the data.
bool has_bool_index(ArrayRef<IValue> args) {
  for (const auto& a : args) {
    if (!a.isList()) continue;
    for (const IValue& e : a.toListRef()) {
      if (e.isTensor() && e.toTensor().defined() &&
          (e.toTensor().scalar_type() == kBool || e.toTensor().scalar_type() == kByte))
        return true;
    }
  }
  return false;
}

enum class MetaMode { Use, Validate, CpuShaped };

struct MetaQuery {
  std::shared_ptr<const MetaResult> meta;  // null for CpuShaped
  MetaMode mode = MetaMode::Use;
  bool cacheable = false;
  std::vector<int64_t> key, signature;
};

// Memory-layout class of a tensor for Note [Meta kernels are checked against
// CPU]: output strides often follow the inputs' layout (TensorIterator keeps a
// channels-last or permuted input's order when it allocates an output), and a
// Meta kernel may not (out= decompositions allocate contiguous outputs). The
// flags are cached in TensorImpl, so this costs a few loads.
// The memory format CPU kernels pick for such an input (suggest_memory_format:
// a tensor with size-1 dims may be contiguous in both formats) times whether
// the tensor is dense in it, permuted, or has gaps or overlap.
// A tensor with gaps (a slice) keeps its dims' order in TensorIterator's
// outputs too, so for those the class also says whether the strides that
// matter (size > 1, stride > 0) decrease, i.e. row-major order.
int64_t layout_class(const Tensor& t) {
  const auto format = t.suggest_memory_format();
  const int64_t f = format == at::MemoryFormat::ChannelsLast ? 1 : format == at::MemoryFormat::ChannelsLast3d ? 2 : 0;
  if (t.is_contiguous(format)) return f * 4;
  if (t.is_non_overlapping_and_dense()) return f * 4 + 1;  // permuted, e.g. transposed
  int64_t last = std::numeric_limits<int64_t>::max();
  bool row_major = true;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) <= 1 || t.stride(d) == 0) continue;
    row_major &= t.stride(d) <= last;
    last = t.stride(d);
  }
  return f * 4 + (row_major ? 2 : 3);  // gaps or overlap (slices, expand)
}

// The order of a tensor's dims by decreasing stride (ties and size-1 dims in
// index order), as one number: CPU kernels that keep an input's memory order
// (FFTs over some of its dims) give different strides for different orders.
int64_t dim_order_code(const Tensor& t, bool size_one_dims_too = false) {
  const int64_t n = t.dim();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int64_t d) {
    return t.size(d) <= 1 && !size_one_dims_too ? std::numeric_limits<int64_t>::min() : t.stride(d);
  };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) > key(b); });
  uint64_t code = 0;  // wraps for many dims: then a hash, collisions merely share a signature
  for (int64_t d : order) code = code * static_cast<uint64_t>(n + 1) + static_cast<uint64_t>(d);
  return static_cast<int64_t>(code);
}

// The key of Note [Meta kernels are checked against CPU]: dtype, device, rank
// and layout class of every tensor, and the values of bools and ints (e.g.
// batch norm's `training` or a loss's `reduction` decide whether CPU returns
// empty or 0-dim outputs where the Meta kernel does not), but not sizes: a
// training loop converges to a handful of signatures. Dimension lists (`dim`,
// `dims`, `perm`) are values too: which dims an op works on decides how its
// output follows a permuted input (irfft over dim 1 vs dim 2 of a transposed
// tensor gives different strides on CPU, not on Meta).
bool names_dims(const std::string& arg) { return arg.find("dim") != std::string::npos || arg == "perm"; }

std::vector<int64_t> dtype_signature(const c10::FunctionSchema& schema, ArrayRef<IValue> args) {
  std::vector<int64_t> sig;
  auto add = [&](const Tensor& t) {
    if (!t.defined()) { sig.push_back(-1); return; }
    const int64_t cls = layout_class(t);
    sig.push_back(((static_cast<int64_t>(t.scalar_type()) * 2 + (t.device().is_cpu() ? 1 : 0)) * 64 + t.dim()) * 16 +
                  cls);
    if (cls % 4 == 1) sig.push_back(dim_order_code(t));  // which permutation
    // Gaps or overlap: the order of every dim's stride, zeros and size-1 dims included. TensorIterator orders
    // an output's dims by all operands' strides, and Python Meta kernels (elementwise references) also read
    // the strides of size-1 dims, so they disagree with CPU for some of these patterns (clamp of (1, 0, 1)-
    // and (1, 0, 16)-strided (4, 4, 1) inputs) and agree for others.
    if (cls % 4 >= 2) sig.push_back(dim_order_code(t, /*size_one_dims_too=*/true));
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& a = args[i];
    if (a.isTensor()) add(a.toTensor());
    else if (a.isTensorList()) for (const auto& t : a.toTensorList()) add(t);
    else if (a.isList()) {
      sig.push_back(-2 - static_cast<int64_t>(a.toListRef().size()));
      const bool dims = i < schema.arguments().size() && names_dims(schema.arguments()[i].name());
      for (const IValue& e : a.toListRef()) {
        if (e.isTensor()) add(e.toTensor());
        else if (dims && e.isInt()) sig.push_back(e.toInt());
      }
    }
    else if (a.isBool()) sig.push_back(a.toBool() ? -3 : -4);
    else if (a.isInt()) { sig.push_back(-5); sig.push_back(a.toInt()); }
    else if (a.isNone()) sig.push_back(-6);
    else sig.push_back(-7);
  }
  return sig;
}

// Layout equality that ignores strides of size-1 dimensions (they never address memory). With
// size_one_dims_too, those must match as well: a new result reports CPU's strides exactly (Meta
// kernels of a few ops, e.g. nonzero_static, give size-1 dims other strides than CPU's kernel).
bool same_meta(const TensorMeta& a, const TensorMeta& b, bool size_one_dims_too = false) {
  if (a.defined != b.defined) return false;
  if (!a.defined) return true;
  if (a.dtype != b.dtype || a.sizes != b.sizes || a.conj != b.conj || a.neg != b.neg) return false;
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    if ((a.sizes[d] > 1 || size_one_dims_too) && a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

// Note [No quantized tensors on vnpu]
// vnpu has no QuantizedPrivateUse1 kernels: a quantize op run as a plain
// kernel would return a tensor whose dtype says quint8 while is_quantized is
// False, and whose every later use fails. Such a call is refused at the call
// instead, with one error (as is every op reaching the QuantizedPrivateUse1
// key: quantized_fallback below).
[[noreturn]] void refuse_quantized(const std::string& op, std::optional<ScalarType> dtype = std::nullopt) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op, " would make a quantized tensor",
                              dtype ? c10::str(" (", *dtype, ")") : std::string(),
                              " on vnpu, which does not support quantized tensors. Run quantized code on the "
                              "CPU (tensor.cpu()), or dequantize first.");
}

// Whether the tensor of mutable argument `i` is passed as another argument too
// (TensorIterator's "output is also an input": it may not be resized).
bool is_also_input(ArrayRef<IValue> args, size_t i) {
  const c10::TensorImpl* impl = args[i].toTensor().unsafeGetTensorImpl();
  for (size_t j = 0; j < args.size(); ++j) {
    if (j == i) continue;
    if (args[j].isTensor() && args[j].toTensor().unsafeGetTensorImpl() == impl) return true;
    if (args[j].isTensorList())
      for (const Tensor t : args[j].toTensorList()) if (t.unsafeGetTensorImpl() == impl) return true;
  }
  return false;
}

// Output metadata of `op` on `args`, from the cache or the Meta kernel.
MetaQuery infer_meta(const c10::OperatorHandle& op, OpInfo& info, ArrayRef<IValue> args) {
  const auto& schema = op.schema();
  thread_local std::vector<int64_t> key_buffer;
  KeyBuilder key(key_buffer);
  for (size_t i = 0; i < args.size() && key.ok; ++i) {
    auto kind = schema.arguments()[i].type()->kind();
    if (kind == c10::TypeKind::OptionalType)
      kind = schema.arguments()[i].type()->cast<c10::OptionalType>()->getElementType()->kind();
    bool by_type_only = !info.any_mutable && !info.meta_lacks_checks &&
                        (kind == c10::TypeKind::FloatType || kind == c10::TypeKind::NumberType ||
                         kind == c10::TypeKind::ComplexType);
    key.value(args[i], !by_type_only);
  }
  // Output dtypes of some ops follow the default dtype (true division of
  // integers, factories): a set_default_dtype() must not hit stale entries.
  key.k.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  MetaQuery q;
  q.cacheable = key.ok;
  if (key.ok) {
    std::lock_guard<std::mutex> g(info.meta_cache->mu);
    auto it = info.meta_cache->map.find(key.k);
    if (it != info.meta_cache->map.end()) {
      q.meta = it->second;
      return q;
    }
  }
  // A miss (rare in loops): only now the dtype signature (it allocates).
  q.signature = dtype_signature(schema, args);
  int8_t state = 0;
  {
    std::lock_guard<std::mutex> g(info.meta_cache->mu);
    auto st = info.meta_cache->signatures.find(q.signature);
    if (st != info.meta_cache->signatures.end()) state = st->second;
  }
  q.key = key.k;
  if (state == 2) {
    q.mode = MetaMode::CpuShaped;
    return q;
  }

  Stack meta;
  meta.reserve(args.size());
  for (const auto& a : args) meta.push_back(to_meta(a));
  std::vector<IValue> meta_args(meta.begin(), meta.end());  // mutable meta args, after the call
  auto result = std::make_shared<MetaResult>();
  try {
    op.redispatchBoxed(DispatchKeySet(DispatchKey::Meta), &meta);
  } catch (const std::exception& e) {
    if (is_interrupt(e)) throw;  // Note [Interrupts are not failures]
    // Either the inputs are invalid (the CPU kernel, run synchronously, then
    // raises CPU's own exception) or the Meta kernel cannot handle them, e.g.
    // boolean-mask indexing whose output size depends on the data.
    result->sync = true;
    if (!has_bool_index(args)) {
      std::string what = e.what();
      result->reason = "Meta kernel failed (" + what.substr(0, std::min<size_t>(what.find('\n'), 120)) +
                       "): ran synchronously";
    }
  }
  if (result->sync) {
    if (key.ok) {
      std::lock_guard<std::mutex> g(info.meta_cache->mu);
      info.meta_cache->map.emplace(key.k, result);
    }
    q.meta = result;
    return q;
  }
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    std::vector<TensorMeta> ms;
    bool is_list = meta[r].isTensorList();
    if (meta[r].isTensor()) ms.push_back(tensor_meta(meta[r].toTensor()));
    else if (is_list) for (const auto& t : meta[r].toTensorList()) ms.push_back(tensor_meta(t));
    result->returns.push_back(std::move(ms));
    result->return_is_list.push_back(is_list);
  }
  for (const auto& ms : result->returns)  // See Note [No quantized tensors on vnpu]
    for (const auto& m : ms) if (m.defined && isQIntType(m.dtype)) refuse_quantized(info.name, m.dtype);
  for (size_t i = 0; i < args.size(); ++i) {
    if (info.mutable_arg[i] && meta_args[i].isTensor() && meta_args[i].toTensor().defined())
      result->mutated.emplace_back(i, tensor_meta(meta_args[i].toTensor()));
  }
  // See Note [In-place ops never resize self].
  for (const auto& [i, m] : result->mutated) {
    const Tensor& t = args[i].toTensor();
    if (t.sizes().equals(m.sizes) || !((i == 0 && info.inplace_self) || is_also_input(args, i))) continue;
    result->sync = true;
    result->mutated.clear();
    break;
  }
  q.meta = result;
  // An out= argument that already has the result's shape keeps its strides
  // (resize_output's contract; structured CPU kernels compute into a proxy),
  // but some Meta kernels restride it (e.g. _linalg_solve_ex to column-major).
  // A signature validated on shapes where both layouts coincide cannot tell,
  // so such a call is checked against CPU itself.
  bool restrides = false;
  for (const auto& [i, m] : result->mutated) {
    const Tensor& t = args[i].toTensor();
    restrides |= t.sizes().equals(m.sizes) && !same_meta(tensor_meta(t), m);
  }
  // Only ATen's own ops are checked: custom ops have no other source of truth
  // than their registered fake/Meta kernel (and may block or have effects).
  if ((state == 0 || restrides || info.meta_lacks_checks) && info.name.rfind("aten::", 0) == 0) {
    q.mode = MetaMode::Validate;
    return q;
  }
  if (key.ok) {
    std::lock_guard<std::mutex> g(info.meta_cache->mu);
    if (info.meta_cache->map.size() >= kMetaCacheLimit) info.meta_cache->map.clear();
    info.meta_cache->map.emplace(key.k, result);
  }
  return q;
}


// The metadata the CPU kernel actually produced (results of run_sync).
std::shared_ptr<MetaResult> observed_meta(const OpInfo& info, ArrayRef<IValue> results,
                                          const std::vector<IValue>& args_before) {
  auto m = std::make_shared<MetaResult>();
  for (const auto& v : results) {
    std::vector<TensorMeta> ms;
    bool is_list = v.isTensorList();
    if (v.isTensor()) ms.push_back(tensor_meta(v.toTensor()));
    else if (is_list) for (const auto& t : v.toTensorList()) ms.push_back(tensor_meta(t));
    m->returns.push_back(std::move(ms));
    m->return_is_list.push_back(is_list);
  }
  for (size_t i = 0; i < args_before.size(); ++i) {
    if (info.mutable_arg[i] && args_before[i].isTensor() && args_before[i].toTensor().defined())
      m->mutated.emplace_back(i, tensor_meta(args_before[i].toTensor()));
  }
  return m;
}

// Stand-in CPU arguments for `args`: ones with the same sizes, strides,
// offsets and dtypes; tensors sharing a vnpu storage share one CPU storage
// (for overlap checks), generators are fresh CPU ones (the user's CPU random
// stream stays untouched), vnpu devices become CPU.
Stack standin_stack(const c10::OperatorHandle& op, ArrayRef<IValue> args) {
  std::unordered_map<const c10::StorageImpl*, std::vector<Tensor>> buffers;  // per storage, one per dtype
  std::unordered_map<const c10::TensorImpl*, Tensor> same;  // one tensor passed twice stays one tensor
  auto standin = [&](const Tensor& t) -> Tensor {
    if (!t.defined() || t.device().is_cpu()) return t;
    auto known = same.find(t.unsafeGetTensorImpl());
    if (known != same.end()) return known->second;
    int64_t elems = static_cast<int64_t>(t.storage().nbytes() / t.dtype().itemsize());
    Tensor buf;
    auto& bufs = buffers[t.storage().unsafeGetStorageImpl()];
    for (const auto& b : bufs) if (b.scalar_type() == t.scalar_type()) buf = b;
    if (!buf.defined()) {
      buf = at::ones({std::max<int64_t>(elems, 1)}, t.options().device(kCPU));
      bufs.push_back(buf);
    }
    Tensor r = buf.as_strided(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) r = r.conj();
    same.emplace(t.unsafeGetTensorImpl(), r);
    return r;
  };
  Stack s;
  s.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& a = args[i];
    auto kind = op.schema().arguments()[i].type()->kind();
    if (kind == c10::TypeKind::OptionalType)
      kind = op.schema().arguments()[i].type()->cast<c10::OptionalType>()->getElementType()->kind();
    if (kind == c10::TypeKind::GeneratorType) {
      s.push_back(at::make_generator<at::CPUGeneratorImpl>(0));
    } else if (a.isTensor()) {
      s.push_back(standin(a.toTensor()));
    } else if (a.isTensorList()) {
      c10::List<Tensor> l;
      for (const auto& t : a.toTensorList()) l.push_back(standin(t));
      s.push_back(l);
    } else if (a.isList() && a.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<Tensor>> l;
      for (const IValue& e : a.toListRef()) l.push_back(e.isTensor() ? std::optional<Tensor>(standin(e.toTensor())) : std::nullopt);
      s.push_back(l);
    } else if (a.isDevice() && a.toDevice().type() == kVNPU) {
      s.push_back(Device(kCPU));
    } else {
      s.push_back(a);
    }
  }
  return s;
}

// Note [Stand-ins are small]: stand-in CPU inputs cost host memory and time
// in proportion to the inputs (a 1 GiB index_select would cost +1 GiB of host
// memory and ~1 s on its first call). Above this many bytes of input storage
// the check runs the real op synchronously on aliases of device memory
// instead: no extra memory, the op's own time plus a stream sync, once per
// signature.
constexpr size_t kStandinBytesLimit = 8u << 20;

size_t standin_bytes(ArrayRef<IValue> args) {
  std::unordered_set<const c10::StorageImpl*> seen;
  size_t total = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined() && !t.device().is_cpu() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
      total += t.storage().nbytes();
  };
  for (const auto& a : args) {
    if (a.isTensor()) add(a.toTensor());
    else if (a.isTensorList()) for (const Tensor t : a.toTensorList()) add(t);
    else if (a.isList()) for (const IValue& e : a.toListRef()) if (e.isTensor()) add(e.toTensor());
  }
  return total;
}

// Output metadata of the CPU kernel on stand-in CPU inputs; nullptr if that
// run raises or the inputs are too large for stand-ins.
std::shared_ptr<MetaResult> standin_meta(const c10::OperatorHandle& op, const OpInfo& info, ArrayRef<IValue> args) {
  if (standin_bytes(args) > kStandinBytesLimit) return nullptr;  // Note [Stand-ins are small]
  Stack s = standin_stack(op, args);
  std::vector<IValue> inputs(s.begin(), s.end());
  try {
    op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
  } catch (const std::exception& e) {
    if (is_interrupt(e)) throw;  // Note [Interrupts are not failures]
    return nullptr;
  }
  return observed_meta(info, ArrayRef<IValue>(s.data(), op.schema().returns().size()), inputs);
}

// See Note [Overlap errors].
void raise_overlap_errors_like_cpu(const c10::OperatorHandle& op, const OpInfo& info, ArrayRef<IValue> args) {
  thread_local std::vector<int64_t> pattern;
  if (!mutable_arg_overlaps(info, args, pattern)) return;
  {
    std::lock_guard<std::mutex> g(info.meta_cache->mu);
    if (info.meta_cache->overlap_ok.count(pattern)) return;  // e.g. x.mul_(y) as mul.out(x, y, out=x)
  }
  // Note [Stand-ins are small]: above the limit the kernel's own check raises
  // the error on the stream (at the next synchronization).
  if (standin_bytes(args) > kStandinBytesLimit) return;
  Stack s = standin_stack(op, args);
  try {
    op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
  } catch (const c10::Error& e) {
    if (std::string_view(e.what()).find("unsupported operation:") != std::string_view::npos) throw;
  } catch (const std::exception& e) {
    if (is_interrupt(e)) throw;  // Note [Interrupts are not failures]
    // other failures of the stand-in run say nothing about the real inputs
  }
  std::lock_guard<std::mutex> g(info.meta_cache->mu);
  if (info.meta_cache->overlap_ok.size() >= kMetaCacheLimit) info.meta_cache->overlap_ok.clear();
  info.meta_cache->overlap_ok.insert(pattern);
}

bool same_result(const MetaResult& a, const MetaResult& b) {
  if (a.returns.size() != b.returns.size() || a.mutated.size() != b.mutated.size()) return false;
  for (size_t r = 0; r < a.returns.size(); ++r) {
    if (a.returns[r].size() != b.returns[r].size()) return false;
    for (size_t j = 0; j < a.returns[r].size(); ++j)
      if (!same_meta(a.returns[r][j], b.returns[r][j], /*size_one_dims_too=*/true)) return false;
  }
  for (size_t i = 0; i < a.mutated.size(); ++i) {
    if (a.mutated[i].first != b.mutated[i].first || !same_meta(a.mutated[i].second, b.mutated[i].second)) return false;
  }
  return true;
}

// Makes `t` (vnpu) take the layout the op gives an out=/in-place argument,
// growing its storage in stream order if needed.
void apply_layout(const Tensor& t, const TensorMeta& m) {
  // Equal up to strides of size-1 dims: the same layout, keep the caller's strides.
  if (t.sizes().equals(m.sizes) && same_meta(tensor_meta(t), TensorMeta{true, t.scalar_type(), m.sizes, m.strides,
                                                                          t.is_conj(), t.is_neg()}))
    return;
  if (!t.sizes().equals(m.sizes)) at::native::resize_output(t, m.sizes);  // warns like CPU/CUDA
  if (!t.strides().equals(m.strides)) {
    size_t item = t.dtype().itemsize();
    size_t need = at::detail::computeStorageNbytes(m.sizes, m.strides, item, t.storage_offset());
    if (need > t.storage().nbytes()) t.resize_({static_cast<int64_t>((need + item - 1) / item)});
    t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides, t.storage_offset());
  }
}

// `vnpu_reason`: why an op CUDA runs asynchronously waits here (null: it waits on CUDA too), for
// torch.vnpu.set_sync_debug_mode.
void run_sync(const c10::OperatorHandle& op, OpInfo& info, Stack* stack, DeviceIndex dev,
              const char* vnpu_reason = nullptr);

void set_lazy_bits(const Tensor& t, const TensorMeta& m) {
  if (t.is_conj() != m.conj) t._set_conj(m.conj);
  if (t.is_neg() != m.neg) t._set_neg(m.neg);
}

// The device memory of the slots' tensors, for the sanitizer: arguments the op
// mutates and outputs are writes, other arguments reads.
void declare_accesses(sanitizer::Accesses& acc, const OpInfo& info, const c10::FunctionSchema& schema,
                      const std::vector<Slot>& slots, DeviceIndex dev, bool outs) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const bool write = outs || info.mutable_arg[i];
    for (size_t j = 0; j < slots[i].specs.size(); ++j) {
      const TensorSpec& s = slots[i].specs[j];
      if (!s.defined || s.cpu_value.defined() || s.storage_base == nullptr) continue;
      std::string what = outs ? "output " + std::to_string(i)
                              : "argument '" + schema.arguments()[i].name() + "'";
      if (slots[i].specs.size() > 1) what += "[" + std::to_string(j) + "]";
      acc.add(s.storage_base, s.storage_nbytes, s.sizes, s.strides, s.storage_offset, s.dtype, dev, write,
              std::move(what));
    }
  }
}

void run_async(const c10::OperatorHandle& op, OpInfo& info, Stack* stack, DeviceIndex dev) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  // Note [Empty inputs run synchronously]: with nothing to compute, a stream
  // sync is the only cost, and CPU's kernel then raises its argument errors
  // (e.g. max() of an empty tensor) at the call, as CPU and CUDA do.
  // Likewise an index argument of a non-integer dtype: Meta kernels do not all
  // check it, CPU's raises at the call. An empty out=/in-place argument is not
  // an empty input: composites call `op.out(empty(0), ...)` all the time.
  if (info.sync_if_arg >= 0 && !args[info.sync_if_arg].isNone()) return run_sync(op, info, stack, dev);
  if (info.alerts_if_deterministic && at::globalContext().deterministicAlgorithms()) {
    // Note [Deterministic alerts at the call]
    if (!is_current_stream_capturing()) return run_sync(op, info, stack, dev);
    // A capture cannot wait for the stream: CPU's kernel on stand-in inputs
    // raises (or warns) the alert at the call instead; the op is captured.
    try {
      Stack standin = standin_stack(op, args);
      op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &standin);
    } catch (const c10::Error& e) {
      if (std::string_view(e.what()).find("does not have a deterministic implementation") != std::string_view::npos)
        throw;
    }
  }
  if (info.sync_if_mask_arg >= 0 && args[info.sync_if_mask_arg].isList()) {
    for (const IValue& e : args[info.sync_if_mask_arg].toListRef()) {
      if (!e.isTensor() || !e.toTensor().defined()) continue;
      const auto st = e.toTensor().scalar_type();
      if (st == ScalarType::Bool || st == ScalarType::Byte) return run_sync(op, info, stack, dev);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!args[i].isTensor() || !args[i].toTensor().defined() || info.mutable_arg[i]) continue;
    const Tensor& t = args[i].toTensor();
    if (t.numel() == 0 || (info.index_arg[i] && !isIntegralType(t.scalar_type(), true)))
      return run_sync(op, info, stack, dev, t.numel() == 0 ? "an empty input" : "an index of a non-integer dtype");
  }
  MetaQuery q = infer_meta(op, info, args);
  std::shared_ptr<const MetaResult> meta = q.meta;
  if (q.mode != MetaMode::Use) {
    // See Note [Meta kernels are checked against CPU]: learn the CPU kernel's
    // output metadata from a run on stand-in CPU inputs of the same metadata
    // (no stream sync); if that run fails (its data matter, e.g. a singular
    // matrix), run the real op synchronously once instead.
    std::shared_ptr<MetaResult> cpu = standin_meta(op, info, args);
    const bool ran_sync = !cpu;
    if (ran_sync) {
      std::vector<IValue> args_before(args.begin(), args.end());
      run_sync(op, info, stack, dev, "its first call with these input layouts");
      cpu = observed_meta(info, torch::jit::last(*stack, schema.returns().size()), args_before);
    }
    bool trusted = q.mode == MetaMode::Validate && same_result(*q.meta, *cpu);
    {
      std::lock_guard<std::mutex> g(info.meta_cache->mu);
      info.meta_cache->signatures[q.signature] = trusted ? 1 : 2;
      if (q.cacheable) {
        if (info.meta_cache->map.size() >= kMetaCacheLimit) info.meta_cache->map.clear();
        info.meta_cache->map.emplace(q.key, trusted ? q.meta : cpu);
      }
    }
    if (ran_sync) return;
    meta = trusted ? q.meta : cpu;
  }
  if (meta->sync) {
    if (!meta->reason.empty()) record_fallback(info.name, meta->reason);
    // No reason: a boolean-mask index, whose output shape depends on the data (as on CUDA).
    return run_sync(op, info, stack, dev, meta->reason.empty() ? nullptr : meta->reason.c_str());
  }
  for (const auto& [i, m] : meta->mutated) apply_layout(args[i].toTensor(), m);

  auto plan = acquire_plan(op);
  plan->out_unusable = &info.out_unusable;
  plan->mutable_arg = &info.mutable_arg;
  const int64_t numel = max_numel(args);
  plan->args.reserve(n);
  for (size_t i = 0; i < n; ++i) fill_slot(plan->args.emplace_back(), args[i], schema.arguments()[i], dev, numel);
  // The kernel sets these bits on its CPU aliases itself (as on CPU); the
  // vnpu tensors take them once the task is planned.
  for (const auto& [i, m] : meta->mutated) set_lazy_bits(args[i].toTensor(), m);

  auto alloc = [&](const TensorMeta& m) {
    if (!m.defined) return Tensor();
    return empty_strided_on_current_device(m.sizes, m.strides, m.dtype);  // the guard of executor_fallback
  };
  std::vector<IValue> results;
  results.reserve(schema.returns().size());
  plan->outs.reserve(schema.returns().size());
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    if (info.return_arg[r] >= 0) {
      results.push_back(args[info.return_arg[r]]);
      continue;
    }
    Slot& out = plan->outs.emplace_back();
    if (meta->return_is_list[r]) {
      c10::List<Tensor> l;
      out.kind = Slot::TensorList;
      for (const auto& m : meta->returns[r]) {
        Tensor t = alloc(m);
        spec_into(out.specs.emplace_back(), t);
        set_lazy_bits(t, m);
        l.push_back(std::move(t));
      }
      results.emplace_back(std::move(l));
    } else {
      Tensor t = meta->returns[r].empty() ? Tensor() : alloc(meta->returns[r][0]);
      out.kind = Slot::Tensor;
      spec_into(out.specs.emplace_back(), t);
      if (t.defined()) set_lazy_bits(t, meta->returns[r][0]);
      results.emplace_back(std::move(t));
    }
  }
  // out= kernels need every output; optional outputs the op leaves undefined
  // (e.g. convolution_backward's output_mask) take the functional kernel.
  bool all_defined = true;
  for (const auto& o : plan->outs)
    for (const auto& sp : o.specs) all_defined &= sp.defined;
  if (info.out_op && !plan->outs.empty() && all_defined && !info.out_unusable.load() &&
      !(info.out_needs_contiguous_input && !args[0].toTensor().is_contiguous()))
    plan->out_op = info.out_op;
  if (!plan->out_op && info.out_kernel && !plan->outs.empty() && all_defined) plan->out_kernel = info.out_kernel;
  if (!plan->out_op && !plan->out_kernel && !plan->outs.empty()) record_extra_copy(info.name);
  if (sanitizer::enabled()) {  // See Note [Sanitizer ranges] (runtime): every argument and output
    sanitizer::Accesses acc;
    declare_accesses(acc, info, schema, plan->args, dev, /*outs=*/false);
    declare_accesses(acc, info, schema, plan->outs, dev, /*outs=*/true);
    launch(info.name.c_str(), dev, [plan] { run_plan(*plan); }, &acc);
  } else {
    launch(info.name.c_str(), dev, [plan] { run_plan(*plan); });
  }

  torch::jit::drop(*stack, n);
  for (auto& r : results) stack->push_back(std::move(r));
}

// Runs the CPU kernel on the calling thread after synchronizing the stream.
void run_sync(const c10::OperatorHandle& op, OpInfo& info, Stack* stack, DeviceIndex dev,
              const char* vnpu_reason) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  if (C10_UNLIKELY(c10::vnpu::get_sync_debug_mode() != c10::vnpu::SyncDebugMode::L_DISABLED)) {
    c10::vnpu::warn_or_error_on_sync(
        vnpu_reason ? info.name + " (ran synchronously on vnpu: " + vnpu_reason + "; CUDA would not wait here)"
                    : info.name + " (its output depends on the data, or it checks data on the host, as on CUDA)",
        vnpu_reason == nullptr);
  }
  c10::vnpu::SyncReportedGuard reported;  // the copies back below are part of this wait
  if (vnpuError_t err = vnpuStreamSynchronize(c10::vnpu::getCurrentVNPUStream(dev).stream());
      err == vnpuErrorStreamCaptureUnsupported) {
    // Name the op: "vnpuStreamSynchronize" alone does not tell which line of a model did it.
    TORCH_CHECK(false, info.name, " runs synchronously on vnpu (", info.path == Path::Sync ? "its output depends on "
                "the data, or it checks data on the host, as on CUDA" : "its first call with these input "
                "layouts, an empty input, or no Meta kernel: run the captured code once before capturing (warm-up)",
                ") and so waits for the stream. ", vnpuGetErrorString(err), ": ", vnpuGetLastErrorString());
  } else {
    VNPU_CHECK(err);
  }

  // Note [Synchronous kernels run on aliases]: every argument is a CPU alias
  // of device memory, so the kernel sees exactly the aliasing CPU would (an
  // expanded in-place argument, an out= sharing storage with an input). The
  // aliases' storages are resizable: a kernel that grows an out= argument
  // moves that storage into host memory, and the vnpu tensor then grows and
  // takes the values; a kernel that only re-lays out or shrinks an argument
  // changes its metadata, which the vnpu tensor then takes.
  AliasContext ctx(/*resizable=*/true);
  Stack s;
  s.reserve(n);
  struct Mutated { Tensor vnpu, cpu; const void* device_base; };
  std::vector<Mutated> mutated;
  const int64_t numel = max_numel(args);
  std::vector<Slot> slots;
  if (sanitizer::enabled()) slots.reserve(n);
  // One vnpu tensor passed twice (logical_and_ calls logical_and.out(self,
  // other, out=self)) stays one CPU tensor: TensorIterator tells an out=
  // tensor that is also an input by identity, and must not resize it.
  c10::SmallVector<std::pair<const c10::TensorImpl*, IValue>, 4> same;
  for (size_t i = 0; i < n; ++i) {
    Slot slot = make_slot(args[i], schema.arguments()[i], dev, numel);
    if (sanitizer::enabled()) slots.push_back(slot);
    const c10::TensorImpl* impl =
        args[i].isTensor() && args[i].toTensor().defined() ? args[i].toTensor().unsafeGetTensorImpl() : nullptr;
    IValue v;
    for (const auto& [k, known] : same) if (impl && k == impl) v = known;
    if (v.isNone()) {
      v = materialize(slot, ctx);
      if (impl) same.emplace_back(impl, v);
    }
    if (info.mutable_arg[i] && v.isTensor() && v.toTensor().defined() && args[i].toTensor().device().type() == kVNPU)
      mutated.push_back({args[i].toTensor(), v.toTensor(), slot.specs[0].storage_base});
    s.push_back(std::move(v));
  }
  if (sanitizer::enabled()) {  // the kernel runs on this thread: host accesses
    sanitizer::Accesses acc;
    declare_accesses(acc, info, schema, slots, dev, /*outs=*/false);
    sanitizer::host_access(info.name.c_str(), acc);
  }
  {
    sanitizer::HostKernelGuard device_access;  // See Note [Synchronous kernels under check 4]
    op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
  }

  for (auto& m : mutated) {
    const bool moved = m.cpu.storage().data() != m.device_base;  // grown into host memory, or set_ elsewhere
    if (!m.vnpu.sizes().equals(m.cpu.sizes())) m.vnpu.resize_(m.cpu.sizes());
    if (m.vnpu.storage_offset() != m.cpu.storage_offset())
      m.vnpu.unsafeGetTensorImpl()->set_sizes_and_strides(m.vnpu.sizes(), m.vnpu.strides(), m.cpu.storage_offset());
    apply_layout(m.vnpu, tensor_meta(m.cpu));
    set_lazy_bits(m.vnpu, tensor_meta(m.cpu));
    if (moved) m.vnpu.copy_(m.cpu);
  }
  auto to_vnpu = [&](const Tensor& t) -> Tensor {
    if (!t.defined() || t.device().type() == kVNPU) return t;
    if (t.is_quantized()) refuse_quantized(info.name, t.scalar_type());  // Note [No quantized tensors on vnpu]
    for (const auto& a : args) {  // a view of an input: share its device storage
      if (a.isTensor() && a.toTensor().defined() && a.toTensor().device().type() == kVNPU &&
          ctx.cpu_storage_of(a.toTensor().storage().unsafeGetStorageImpl()->data_ptr().get()) ==
              t.storage().unsafeGetStorageImpl()) {
        return rewrap_view(a.toTensor(), t);
      }
    }
    auto opts = t.options().device(Device(kVNPU, dev));
    Tensor out = t.is_non_overlapping_and_dense() ? at::empty_strided(t.sizes(), t.strides(), opts)
                                                  : at::empty(t.sizes(), opts);
    out.copy_(t);
    return out;
  };
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    IValue& v = s[r];
    if (info.return_arg[r] >= 0) {
      v = args[info.return_arg[r]];
    } else if (v.isTensor()) {
      v = to_vnpu(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<Tensor> l;
      for (const auto& t : v.toTensorList()) l.push_back(to_vnpu(t));
      v = l;
    }
  }
  std::vector<IValue> results(s.begin(), s.begin() + schema.returns().size());
  torch::jit::drop(*stack, n);
  for (auto& r : results) stack->push_back(std::move(r));
}

// View ops: metadata only, computed by the CPU kernel on aliases.
void run_view(const c10::OperatorHandle& op, OpInfo& info, Stack* stack, DeviceIndex dev) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  AliasContext ctx;
  Stack s;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) s.push_back(materialize(make_slot(args[i], schema.arguments()[i], dev, 1), ctx));
  op.redispatchBoxed(DispatchKeySet(DispatchKey::CPU), &s);
  auto base_of = [&](const Tensor& cpu) -> Tensor {
    void* base = ctx.device_base_of(cpu.storage().unsafeGetStorageImpl());
    for (const auto& a : args) {
      auto check = [&](const Tensor& t) {
        return t.defined() && t.device().type() == kVNPU && t.storage().unsafeGetStorageImpl()->data_ptr().get() == base;
      };
      if (a.isTensor() && check(a.toTensor())) return a.toTensor();
      if (a.isTensorList()) for (const auto& t : a.toTensorList()) if (check(t)) return t;
    }
    TORCH_INTERNAL_ASSERT(false, info.name, ": view result does not alias a vnpu input");
  };
  if (info.path == Path::InplaceView) {
    // e.g. squeeze_: copy the new metadata onto the vnpu tensor itself.
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      const Tensor& cpu = s[r].toTensor();
      const Tensor& self = args[info.return_arg[r]].toTensor();
      self.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
      s[r] = self;
    }
  } else {
    for (size_t r = 0; r < schema.returns().size(); ++r) {
      IValue& v = s[r];
      if (v.isTensor()) {
        v = v.toTensor().defined() ? rewrap_view(base_of(v.toTensor()), v.toTensor()) : v;
      } else if (v.isTensorList()) {
        c10::List<Tensor> l;
        for (const auto& t : v.toTensorList()) l.push_back(rewrap_view(base_of(t), t));
        v = l;
      }
    }
  }
  std::vector<IValue> results(s.begin(), s.begin() + schema.returns().size());
  torch::jit::drop(*stack, n);
  for (auto& r : results) stack->push_back(std::move(r));
}

}  // namespace

IValue map_tensors(const IValue& v, const std::function<Tensor(const Tensor&)>& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<Tensor> l;
    for (const Tensor& t : v.toTensorList()) l.push_back(fn(t));
    return l;
  }
  if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    c10::List<std::optional<Tensor>> l;
    for (const IValue& e : v.toListRef()) l.push_back(e.isTensor() ? std::optional<Tensor>(fn(e.toTensor())) : std::nullopt);
    return l;
  }
  return v;
}

void run_on_worker(c10::function_ref<void()> kernel) {
  prepare_worker_thread();
  apply_host_modes_on_worker();  // Note [Host modes take effect as of the call]
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  try {
    kernel();
  } catch (const c10::Error& e) {
    // The message without the C++ backtrace; the runtime names the kernel.
    throw std::runtime_error(e.what_without_backtrace());
  }
}

void enqueue_task(const char* name, DeviceIndex device, std::function<void()> task,
                  const sanitizer::Accesses* accesses) {
  release_host_openmp_pool();  // Note [One OpenMP pool]
  auto stream = c10::vnpu::getCurrentVNPUStream(device);
  if (accesses != nullptr && sanitizer::enabled()) {
    sanitizer::launch_checked(stream.stream(), name, std::move(task), *accesses);
    return;
  }
  VNPU_CHECK(vnpuLaunchKernel(stream.stream(), name, std::move(task)));
}

Tensor rewrap_view(const Tensor& base, const Tensor& cpu_view) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), cpu_view.dtype());
  impl->set_sizes_and_strides(cpu_view.sizes(), cpu_view.strides(), cpu_view.storage_offset());
  Tensor r(std::move(impl));
  r._set_conj(cpu_view.is_conj());
  r._set_neg(cpu_view.is_neg());
  return r;
}

// CUDA accepts CPU index tensors in advanced indexing (x[cpu_idx], x[cpu_mask] = v)
// and moves them to the device; so does vnpu. Other CPU tensors are errors.
void move_cpu_indices(const c10::OperatorHandle& op, Stack* stack) {
  const auto& schema = op.schema();
  if (schema.name().rfind("aten::index", 0) != 0 && schema.name() != "aten::_index_put_impl_") return;
  const size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  if (n < 2 || !args[0].isTensor() || args[0].toTensor().device().type() != kVNPU || !args[1].isList()) return;
  const Device dev = args[0].toTensor().device();
  bool any_cpu = false;
  for (const IValue& e : args[1].toListRef()) any_cpu |= e.isTensor() && e.toTensor().defined() && e.toTensor().is_cpu();
  if (!any_cpu) return;
  c10::List<std::optional<Tensor>> moved;
  for (const IValue& e : args[1].toListRef()) {
    if (!e.isTensor() || !e.toTensor().defined()) moved.push_back(std::nullopt);
    else moved.push_back(e.toTensor().is_cpu() ? e.toTensor().to(dev) : e.toTensor());
  }
  (*stack)[stack->size() - n + 1] = moved;
}

namespace {

void run_path(const c10::OperatorHandle& op, OpInfo& info, Stack* stack, DeviceIndex dev) {
  switch (info.path) {
    case Path::View:
    case Path::InplaceView:
      return run_view(op, info, stack, dev);
    case Path::Sync:
      return run_sync(op, info, stack, dev, info.slow_reason.empty() ? nullptr : info.slow_reason.c_str());
    case Path::Async:
      return run_async(op, info, stack, dev);
  }
}

// Runs an out= overload as its functional overload plus copies into the out=
// tensors (out= semantics: kept strides, or resize_output).
void run_out_via_functional(const c10::OperatorHandle& op, OpInfo& info, Stack* stack) {
  const auto& fn = *info.functional_op;
  const size_t n = op.schema().arguments().size();
  const size_t nf = fn.schema().arguments().size();
  const size_t base = stack->size() - n;
  std::vector<IValue> outs(stack->begin() + base + nf, stack->end());
  Stack s(stack->begin() + base, stack->begin() + base + nf);
  fn.redispatchBoxed(DispatchKeySet(DispatchKey::PrivateUse1), &s);
  TORCH_INTERNAL_ASSERT(s.size() == outs.size(), info.name, ": functional overload returned ", s.size(), " values");
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor o = outs[k].toTensor();
    const Tensor& r = s[k].toTensor();
    if (!o.sizes().equals(r.sizes())) at::native::resize_output(o, r.sizes());
    if (r.numel() > 0) o.copy_(r);
  }
  torch::jit::drop(*stack, n);
  for (auto& o : outs) stack->push_back(std::move(o));
}

// Note [out= tensors in other layouts]
// Some ATen CPU kernels mishandle an out= tensor that is not contiguous: tril
// and triu on a batched input write garbage into a column-major out, or past
// its end (heap corruption), linalg_lu's L with channels-last or transposed
// outs comes out wrong, narrow_copy and avg_pool3d into a slice write wrong
// elements. A backend owns its results, so a non-contiguous out=
// tensor that shares memory with no other argument (overlaps keep CPU's
// errors, raised before this) is replaced by a contiguous one for the kernel,
// and the result is copied into it on the stream (out= semantics: its strides
// are kept, or it is resized as resize_output does). One extra copy, for
// these calls only.
bool run_with_contiguous_outs(const c10::OperatorHandle& op, OpInfo& info, Stack* stack, DeviceIndex dev) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  c10::SmallVector<size_t, 3> swap;
  for (size_t i = 0; i < n; ++i) {
    if (!info.out_arg[i]) continue;
    const IValue& a = (*stack)[base + i];
    if (!a.isTensor()) continue;
    const Tensor& o = a.toTensor();
    if (!o.defined() || o.numel() == 0 || o.is_contiguous() || o.layout() != c10::kStrided ||
        o.device().type() != kVNPU || at::has_internal_overlap(o) == at::MemOverlap::Yes)
      continue;
    bool shared = false;
    for (size_t j = 0; j < n && !shared; ++j) {
      if (j == i) continue;
      const IValue& b = (*stack)[base + j];
      if (b.isTensor() && b.toTensor().defined() && b.toTensor().has_storage())
        shared = b.toTensor().storage().is_alias_of(o.storage());
      else if (b.isTensorList())
        for (const Tensor t : b.toTensorList()) shared |= t.defined() && t.has_storage() && t.storage().is_alias_of(o.storage());
    }
    if (!shared) swap.push_back(i);
  }
  if (swap.empty()) return false;
  c10::SmallVector<std::pair<Tensor, Tensor>, 3> outs;  // (the caller's out, the contiguous stand-in)
  for (size_t i : swap) {
    Tensor o = (*stack)[base + i].toTensor();
    Tensor tmp = at::empty(o.sizes(), o.options());
    (*stack)[base + i] = tmp;
    outs.emplace_back(std::move(o), std::move(tmp));
  }
  run_path(op, info, stack, dev);
  for (auto& [o, tmp] : outs) {
    if (!o.sizes().equals(tmp.sizes())) {
      // A resized out= tensor takes the layout the kernel gave its stand-in
      // (linalg kernels make a resized out column-major, as on CPU).
      at::native::resize_output(o, tmp.sizes());
      if (!o.strides().equals(tmp.strides()) && tmp.is_non_overlapping_and_dense())
        o.as_strided_(tmp.sizes(), tmp.strides(), o.storage_offset());
    }
    o.copy_(tmp);
  }
  // Returns that alias an out= argument are that argument.
  const size_t r0 = stack->size() - schema.returns().size();
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    for (size_t k = 0; k < swap.size(); ++k)
      if (info.return_arg[r] == static_cast<int>(swap[k])) (*stack)[r0 + r] = outs[k].first;
  }
  return true;
}

}  // namespace

void executor_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack* stack) {
  flush_worker_warnings();  // Note [Worker warnings]
  OpInfo& info = op_info(op);
  const size_t n = op.schema().arguments().size();
  move_cpu_indices(op, stack);
  DeviceFinder finder{info.name};
  {
    const auto& arguments = op.schema().arguments();
    size_t i = 0;
    for (const auto& a : torch::jit::last(*stack, n)) finder.value(a, arguments[i++].name().c_str());
  }
  finder.finish();
  DeviceIndex dev = finder.dev >= 0 ? finder.dev : c10::vnpu::current_device();
  // CPU scalars are accepted as inputs only: a CPU out=/in-place argument
  // would never be written (CUDA raises the same error).
  const auto args_in = torch::jit::last(*stack, n);
  for (size_t i = 0; i < n; ++i) {
    if (info.mutable_arg[i] && args_in[i].isTensor() && args_in[i].toTensor().defined() &&
        args_in[i].toTensor().device().is_cpu())
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  Device(kVNPU, dev), " and cpu! (argument '", op.schema().arguments()[i].name(),
                  "' is written by ", info.name, "; pass a vnpu tensor)");
  }
  if (info.any_mutable && info.path != Path::InplaceView) {
    for (size_t i = 0; i < n; ++i) {  // Note [Copy-on-write storages]
      if (!info.mutable_arg[i]) continue;
      if (args_in[i].isTensor()) materialize_for_write(args_in[i].toTensor());
      else if (args_in[i].isTensorList()) for (const Tensor t : args_in[i].toTensorList()) materialize_for_write(t);
    }
  }
  c10::DeviceGuard guard(Device(kVNPU, dev));
  std::optional<sanitizer::CurrentOp> current_op;  // names the op at allocation sites
  if (sanitizer::enabled()) current_op.emplace(info.name.c_str());
  info.calls.fetch_add(1, std::memory_order_relaxed);
  if (!info.slow_reason.empty()) record_fallback(info.name, info.slow_reason);
  if (info.path != Path::View && info.path != Path::InplaceView) raise_overlap_errors_like_cpu(op, info, torch::jit::last(*stack, n));
  if (info.makes_quantized) refuse_quantized(info.name);
  if (info.functional_op) return run_out_via_functional(op, info, stack);
  if (info.any_out_arg && info.path != Path::View && info.path != Path::InplaceView &&
      run_with_contiguous_outs(op, info, stack, dev))
    return;  // Note [out= tensors in other layouts]
  run_path(op, info, stack, dev);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&executor_fallback>());
}

namespace {
void quantized_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(), " on vnpu with a quantized dtype or quantized tensors: vnpu "
                              "does not support quantized tensors. Run quantized code on the CPU (tensor.cpu()).");
}
}  // namespace

// See Note [No quantized tensors on vnpu].
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

}  // namespace at::vnpu
