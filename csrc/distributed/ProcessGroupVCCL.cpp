#include "ProcessGroupVCCL.h"

#include "GlooTransport.h"
#include "ShmReduce.h"
#include "ShmTransport.h"
#include "WorkVCCL.h"

#include "../core/VNPUCachingAllocator.h"
#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"
#include "../core/VNPUStream.h"
#include "../sanitizer/Sanitizer.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

namespace c10d::vnpu {
namespace {

using at::Tensor;
using c10::vnpu::VNPUStream;

bool launchBlocking() {
  static const bool v = [] {
    const char* e = std::getenv("VNPU_LAUNCH_BLOCKING");
    return e != nullptr && std::string(e) == "1";
  }();
  return v;
}

// Note [Boolean environment variables] (runtime): "1" on, "0" off, anything else
// keeps the default (torch_vnpu.distributed warns about it when it creates the group).
bool checksEnabledByEnv() {
  const char* e = std::getenv("VNPU_VCCL_CHECK");
  return e == nullptr || std::string(e) != "0";
}

// One hold stream per device for the whole process (Note [vccl memory lifetime]).
VNPUStream holdStream(c10::DeviceIndex device) {
  static std::mutex mu;  // guards streams
  static std::unordered_map<c10::DeviceIndex, c10::Stream> streams;
  std::lock_guard<std::mutex> g(mu);
  auto it = streams.find(device);
  if (it == streams.end()) {
    it = streams.emplace(device, c10::vnpu::getNewVNPUStream(/*priority=*/0, device).unwrap()).first;
  }
  return VNPUStream(it->second);
}

std::chrono::milliseconds timeoutOf(std::chrono::milliseconds requested, std::chrono::milliseconds fallback) {
  return requested == kUnsetTimeout || requested.count() <= 0 ? fallback : requested;
}

bool isP2P(OpType t) { return t == OpType::SEND || t == OpType::RECV || t == OpType::RECVANYSOURCE; }

void checkTensor(const Tensor& t, const char* fn) {
  TORCH_CHECK_VALUE(t.defined(), "vccl ", fn, ": got an undefined tensor");
  TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, "vccl ", fn,
                    ": expected tensors on a vnpu device, but got a tensor on ", t.device(),
                    ". vccl moves vnpu tensors; init_process_group() with no backend (or "
                    "backend=\"cpu:gloo,vnpu:vccl\") also handles cpu tensors with gloo");
  TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "vccl ", fn, ": sparse tensors are not supported, got layout ",
                    t.layout());
  TORCH_CHECK_VALUE(t.is_contiguous(t.suggest_memory_format()) && t.is_non_overlapping_and_dense(), "vccl ", fn,
                    ": tensors must be contiguous (call .contiguous() first)");
}

void checkSameDtype(const Tensor& a, const Tensor& b, const char* fn) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "vccl ", fn, ": tensors must have the same dtype, got ",
                   a.scalar_type(), " and ", b.scalar_type());
}

void checkListSize(size_t got, int world, const char* fn, const char* what) {
  TORCH_CHECK_VALUE(static_cast<int>(got) == world, "vccl ", fn, ": ", what, " must hold one tensor per rank (",
                    world, "), but holds ", got);
}

void checkRoot(int64_t root, int world, const char* fn) {
  TORCH_CHECK_VALUE(root >= 0 && root < world, "vccl ", fn, ": root rank ", root, " is out of range [0, ", world,
                    ")");
}

const char* reduceOpName(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// Rejects (dtype, op) pairs no backend can reduce, at the call.
void checkReduceOp(const ReduceOp& op, at::ScalarType dtype, const char* fn) {
  auto o = op.op_;
  const char* name = reduceOpName(o);
  TORCH_CHECK_VALUE(o != ReduceOp::UNUSED, "vccl ", fn, ": invalid reduce op");
  TORCH_CHECK_TYPE(shmReducible(dtype), "vccl ", fn, ": cannot reduce tensors of dtype ", dtype,
                   " (reductions support float64/32/16, bfloat16, float8 e4m3fn/e5m2(fnuz), complex64/128, "
                   "(u)int8-64 and bool; move other dtypes with non-reducing collectives)");
  const bool bitwise = o == ReduceOp::BAND || o == ReduceOp::BOR || o == ReduceOp::BXOR;
  if (at::isComplexType(dtype)) {
    TORCH_CHECK_VALUE(o == ReduceOp::SUM || o == ReduceOp::AVG || o == ReduceOp::PREMUL_SUM, "vccl ", fn,
                      " does not support ReduceOp.", name, " on complex tensors");
  }
  if (bitwise) {
    TORCH_CHECK_TYPE(at::isIntegralType(dtype, /*includeBool=*/true), "vccl ", fn, ": cannot use ReduceOp.", name,
                     " with non-integral dtype ", dtype);
  }
  if (dtype == at::kBool) {
    TORCH_CHECK_TYPE(o != ReduceOp::AVG && o != ReduceOp::PREMUL_SUM, "vccl ", fn, ": cannot use ReduceOp.", name,
                     " with boolean inputs");
  }
  if (o == ReduceOp::PREMUL_SUM) {
    TORCH_CHECK_TYPE(at::isFloatingType(dtype) || at::isComplexType(dtype), "vccl ", fn,
                     ": ReduceOp.PREMUL_SUM needs a floating point dtype, got ", dtype);
    TORCH_CHECK_VALUE(op.supplement_, "vccl ", fn, ": PREMUL_SUM without a factor");
  }
}

// The flat list of a list of lists.
std::vector<Tensor> flatten(const std::vector<std::vector<Tensor>>& lists) {
  std::vector<Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

std::vector<TensorSpec> specs(const std::vector<Tensor>& ts) {
  std::vector<TensorSpec> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(at::vnpu::spec_of(t));
  return out;
}

ProcessGroupVCCL::GlooFactory& glooFactory() {
  static ProcessGroupVCCL::GlooFactory f;
  return f;
}

}  // namespace

ProcessGroupVCCL::Options::Options(std::chrono::milliseconds timeout) : Backend::Options("vccl", timeout) {}

void ProcessGroupVCCL::setGlooFactory(GlooFactory factory) { glooFactory() = std::move(factory); }

ProcessGroupVCCL::ProcessGroupVCCL(c10::intrusive_ptr<Store> store, int rank, int size,
                                   c10::intrusive_ptr<Options> options, c10::intrusive_ptr<Backend> gloo)
    : Backend(rank, size), store_(std::move(store)), options_(std::move(options)), gloo_(std::move(gloo)) {
  TORCH_CHECK_VALUE(gloo_, "vccl: a Gloo backend is required");
  if (!checksEnabledByEnv()) options_->check_args = false;
  const auto& global = options_->global_ranks_in_group;
  bool identity = global.empty() || static_cast<int>(global.size()) == size;
  for (size_t i = 0; identity && i < global.size(); ++i) identity = global[i] == static_cast<uint64_t>(i);
  if (!identity) {
    std::string list;
    for (size_t i = 0; i < global.size(); ++i) list += c10::str(i ? ", " : "", global[i]);
    group_ranks_note_ = c10::str(" (ranks are ranks of process group ", options_->group_name,
                                 ", whose global ranks are [", list, "])");
  }
  engine_ = std::make_unique<ProgressEngine>(options_->group_name);
  ProgressEngine* engine = engine_.get();
  auto gloo_transport = std::make_shared<GlooTransport>(gloo_, rank, size, options_->check_args,
                                                        [engine](const std::string& e) { engine->poison(e); });
  std::shared_ptr<Transport> transport = gloo_transport;
  const char* mode = std::getenv("VNPU_VCCL_TRANSPORT");
  const std::string m = mode == nullptr ? "auto" : mode;
  TORCH_CHECK_VALUE(m == "auto" || m == "gloo" || m == "shm", "VNPU_VCCL_TRANSPORT=", m,
                    " is not a transport; use auto, gloo or shm");
  if (m != "gloo") {
    std::string why;
    auto shm = ShmTransport::create(store_, rank, size, options_->timeout, options_->check_args, gloo_transport, m,
                                    &why);
    if (shm) transport = shm;
  }
  transport_name_ = transport->name();
  engine_->start(transport);
  init();
}

// Graceful, as Gloo's and NCCL's: collectives already issued still run (the
// peers need this rank for them), bounded by the group's timeout.
ProcessGroupVCCL::~ProcessGroupVCCL() {
  engine_->drain(options_->timeout);
  engine_->shutdown("the process group was destroyed");
  futures_->stop("the process group was destroyed");
}

void ProcessGroupVCCL::abort() {
  engine_->poison("the process group was aborted");
  engine_->shutdown("the process group was aborted");
  futures_->stop("the process group was aborted");
}

void ProcessGroupVCCL::shutdown() {
  engine_->drain(options_->timeout);
  engine_->shutdown("the process group was shut down");
  futures_->stop("the process group was shut down");
}

ErrorType ProcessGroupVCCL::getError() {
  return engine_->poisoned().empty() ? ErrorType::SUCCESS : ErrorType::COMM_ERROR;
}

uint64_t ProcessGroupVCCL::getSequenceNumberForGroup() { return seq_; }

OpPtr ProcessGroupVCCL::newOp(OpType type, const char* name, std::chrono::milliseconds timeout) {
  auto op = std::make_shared<CollectiveOp>();
  op->type = type;
  op->name = name;
  op->timeout = timeoutOf(timeout, options_->timeout);
  op->group_ranks_note = group_ranks_note_;
  if (!isP2P(type)) op->seq = ++seq_;
  return op;
}

c10::DeviceIndex ProcessGroupVCCL::deviceOf(const std::vector<Tensor>& tensors, const char* fn) {
  TORCH_CHECK_VALUE(!tensors.empty(), "vccl ", fn, ": expected at least one tensor");
  c10::Device device = tensors[0].device();
  for (const auto& t : tensors) {
    checkTensor(t, fn);
    TORCH_CHECK_VALUE(t.device() == device, "vccl ", fn, ": all tensors must be on one device, got ", device,
                      " and ", t.device());
  }
  if (auto bound = getBoundDeviceId()) {
    TORCH_CHECK_VALUE(*bound == device, "vccl ", fn, ": tensor found on device ", device,
                      " but this process group is bound to ", *bound, " (init_process_group(device_id=...))");
  }
  return device.index();
}

void ProcessGroupVCCL::completeFuture(const OpPtr& op, const c10::intrusive_ptr<c10::ivalue::Future>& future,
                                      const std::vector<Tensor>& outputs, c10::DeviceIndex device) {
  if (!launchBlocking()) {
    FutureCompletion::completeAtIssue(op, future, outputs, holdStream(device).unwrap());
  } else if (op->completed()) {
    FutureCompletion::completeAtIssue(op, future, outputs, c10::vnpu::getCurrentVNPUStream(device).unwrap());
  } else {
    futures_->add(op, future, outputs, c10::vnpu::getCurrentVNPUStream(device).unwrap());  // p2p, no gate
  }
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::issue(OpPtr op, c10::DeviceIndex device, const std::vector<Tensor>& tensors,
                                                 std::vector<Tensor> outputs, bool blocking) {
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  // The transports address peers' memory by (rank, device): every op names its device.
  op->device = device;
  for (auto& m : op->batch) m->device = device;
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{dev});
  if (coalescing_) {
    coalesced_.push_back(Member{op, device, tensors, outputs, future});
    return c10::make_intrusive<WorkVCCL>(op, rank_, dev, std::move(outputs), future, false);
  }
  std::string failure = engine_->poisoned();
  if (!failure.empty()) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("vccl: ", describe(*op), " cannot run: the process group failed earlier "
                             "(destroy it and create a new one): ", failure, group_ranks_note_));
  }
  VNPUStream stream = c10::vnpu::getCurrentVNPUStream(device);
  VNPUStream hold = holdStream(device);
  bool has_p2p = isP2P(op->type);
  for (const auto& m : op->batch) has_p2p = has_p2p || isP2P(m->type);
  if (!launchBlocking()) {
    for (const auto& t : tensors) {
      if (t.defined() && t.has_storage()) c10::vnpu::allocator::recordStream(t.storage().data_ptr(), hold);
    }
  }
  // The stream task that hands the collective to the transport, named after it (profiler traces,
  // sanitizer reports: "vccl:all_reduce"; the runtime interns task names).
  const std::string ready_name = std::string("vccl:") + op->name;
  if (at::vnpu::sanitizer::enabled()) {
    // The collective's buffers, declared at its start on the issuing stream (later work on that stream
    // is ordered after it, as after an NCCL collective; see docs/sanitizer.md for what this misses).
    at::vnpu::sanitizer::Accesses acc;
    auto declare = [&](const CollectiveOp& o) {
      const bool in_place = o.type == OpType::ALLREDUCE || o.type == OpType::ALLREDUCE_COALESCED ||
                            o.type == OpType::BROADCAST || o.type == OpType::REDUCE;
      for (const auto& s : o.inputs) {
        if (s.defined && !s.cpu_value.defined())
          acc.add(s.storage_base, s.storage_nbytes, s.sizes, s.strides, s.storage_offset, s.dtype, device, in_place,
                  std::string(o.name) + " input");
      }
      for (const auto& s : o.outputs) {
        if (s.defined && !s.cpu_value.defined())
          acc.add(s.storage_base, s.storage_nbytes, s.sizes, s.strides, s.storage_offset, s.dtype, device, true,
                  std::string(o.name) + " output");
      }
    };
    declare(*op);
    for (const auto& m : op->batch) declare(*m);
    at::vnpu::sanitizer::launch_checked(stream.stream(), ready_name.c_str(), [op] { op->markReady(); }, acc);
    VNPU_CHECK(vnpuEventCreateWithFlags(&op->declared, vnpuEventDisableTiming));
    VNPU_CHECK(vnpuEventRecord(op->declared, stream.stream()));
  } else {
    VNPU_CHECK(vnpuLaunchKernel(stream.stream(), ready_name.c_str(), [op] { op->markReady(); }));
  }
  engine_->submit(op);
  if (!launchBlocking()) {
    // Also the reporter of last resort: a failed collective nobody waited for
    // fails the device's next synchronization.
    enqueueGate(op, hold.stream(), kNoTimeout);
  } else if (!has_p2p) {
    // VNPU_LAUNCH_BLOCKING=1: the collective completes (or raises) in the call.
    op->waitDone(kNoTimeout);
    if (op->state() == CollectiveOp::State::kFailed && op->claimReport()) {
      op->markReportPosted();
      C10_THROW_ERROR(DistBackendError, op->error());
    }
  }
  completeFuture(op, future, outputs, device);
  return c10::make_intrusive<WorkVCCL>(op, rank_, dev, std::move(outputs), future, blocking);
}

// ---- collectives ----

c10::intrusive_ptr<Work> ProcessGroupVCCL::broadcast(std::vector<Tensor>& tensors, const BroadcastOptions& opts) {
  auto device = deviceOf(tensors, "broadcast");
  checkRoot(opts.rootRank, size_, "broadcast");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "vccl broadcast: rootTensor must be 0 (one tensor per process)");
  auto op = newOp(OpType::BROADCAST, "broadcast", opts.timeout);
  op->root = opts.rootRank;
  op->inputs = specs(tensors);
  return issue(op, device, tensors, tensors);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::allreduce(std::vector<Tensor>& tensors, const AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(!opts.sparseIndices.has_value(), "vccl all_reduce: sparse all_reduce is not supported");
  auto device = deviceOf(tensors, "all_reduce");
  for (const auto& t : tensors) checkReduceOp(opts.reduceOp, t.scalar_type(), "all_reduce");
  auto op = newOp(tensors.size() > 1 ? OpType::ALLREDUCE_COALESCED : OpType::ALLREDUCE, "all_reduce", opts.timeout);
  op->reduce_op = opts.reduceOp.op_;
  op->inputs = specs(tensors);
  std::vector<Tensor> touched = tensors;
  if (op->reduce_op == ReduceOp::PREMUL_SUM) {
    auto* s = dynamic_cast<PreMulSumSupplement*>(opts.reduceOp.supplement_.get());
    TORCH_CHECK_VALUE(s != nullptr, "vccl all_reduce: PREMUL_SUM without a factor");
    if (s->tensor_factor.defined()) {
      const Tensor& f = s->tensor_factor;
      TORCH_CHECK_VALUE(f.numel() == 1 && (f.device().is_cpu() || f.device().index() == device), "vccl all_reduce: "
                        "the PREMUL_SUM factor must be a 1-element tensor on the same device (or cpu)");
      op->premul_tensor = f.device().is_cpu() ? TensorSpec{} : at::vnpu::spec_of(f);
      op->premul_factor = f.device().is_cpu() ? f.item<double>() : 1.0;
      if (!f.device().is_cpu()) touched.push_back(f);
    } else {
      op->premul_factor = s->double_factor;
    }
  }
  return issue(op, device, touched, tensors);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::allreduce_coalesced(std::vector<Tensor>& tensors,
                                                               const AllreduceCoalescedOptions& opts) {
  auto device = deviceOf(tensors, "all_reduce_coalesced");
  for (const auto& t : tensors) checkReduceOp(opts.reduceOp, t.scalar_type(), "all_reduce_coalesced");
  TORCH_CHECK_VALUE(opts.reduceOp.op_ != ReduceOp::PREMUL_SUM,
                    "vccl all_reduce_coalesced: PREMUL_SUM is supported by all_reduce only");
  auto op = newOp(OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", opts.timeout);
  op->reduce_op = opts.reduceOp.op_;
  op->inputs = specs(tensors);
  return issue(op, device, tensors, tensors);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::reduce(std::vector<Tensor>& tensors, const ReduceOptions& opts) {
  auto device = deviceOf(tensors, "reduce");
  checkRoot(opts.rootRank, size_, "reduce");
  TORCH_CHECK_VALUE(tensors.size() == 1, "vccl reduce: expects one tensor per process");
  checkReduceOp(opts.reduceOp, tensors[0].scalar_type(), "reduce");
  TORCH_CHECK_VALUE(opts.reduceOp.op_ != ReduceOp::PREMUL_SUM, "vccl reduce: PREMUL_SUM is not supported by reduce");
  auto op = newOp(OpType::REDUCE, "reduce", opts.timeout);
  op->root = opts.rootRank;
  op->reduce_op = opts.reduceOp.op_;
  op->inputs = specs(tensors);
  return issue(op, device, tensors, tensors);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::allgather(std::vector<std::vector<Tensor>>& outputs,
                                                     std::vector<Tensor>& inputs, const AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                    "vccl all_gather: expects one input tensor and one output list per process");
  checkListSize(outputs[0].size(), size_, "all_gather", "the output list");
  auto all = flatten(outputs);
  all.push_back(inputs[0]);
  auto device = deviceOf(all, "all_gather");
  for (const auto& o : outputs[0]) checkSameDtype(o, inputs[0], "all_gather");
  auto op = newOp(OpType::ALLGATHER, "all_gather", opts.timeout);
  op->inputs = specs(inputs);
  op->outputs = specs(outputs[0]);
  return issue(op, device, all, outputs[0]);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                                                               std::vector<Tensor>& inputs,
                                                               const AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "vccl all_gather_coalesced: expects one output list per input (",
                    inputs.size(), "), got ", outputs.size());
  for (const auto& l : outputs) checkListSize(l.size(), size_, "all_gather_coalesced", "each output list");
  auto all = flatten(outputs);
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto device = deviceOf(all, "all_gather_coalesced");
  for (size_t k = 0; k < inputs.size(); ++k)
    for (const auto& o : outputs[k]) checkSameDtype(o, inputs[k], "all_gather_coalesced");
  auto op = newOp(OpType::ALLGATHER_COALESCED, "all_gather_coalesced", opts.timeout);
  op->inputs = specs(inputs);
  op->outputs = specs(flatten(outputs));
  return issue(op, device, all, flatten(outputs));
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::_allgather_base(Tensor& output, Tensor& input,
                                                           const AllgatherOptions& opts) {
  std::vector<Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                                           std::vector<Tensor>& inputs,
                                                                           const AllgatherOptions& opts) {
  const char* fn = "all_gather_into_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "vccl ", fn, ": expects as many outputs as inputs");
  std::vector<Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto device = deviceOf(all, fn);
  for (size_t k = 0; k < inputs.size(); ++k) {
    checkSameDtype(outputs[k], inputs[k], fn);
    TORCH_CHECK_VALUE(outputs[k].numel() == inputs[k].numel() * size_, "vccl ", fn,
                      ": the output must hold world_size (", size_, ") times the input's elements (",
                      inputs[k].numel(), "), but holds ", outputs[k].numel());
  }
  auto op = newOp(OpType::_ALLGATHER_BASE, fn, opts.timeout);
  op->inputs = specs(inputs);
  op->outputs = specs(outputs);
  return issue(op, device, all, outputs);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::gather(std::vector<std::vector<Tensor>>& outputs,
                                                  std::vector<Tensor>& inputs, const GatherOptions& opts) {
  checkRoot(opts.rootRank, size_, "gather");
  TORCH_CHECK_VALUE(inputs.size() == 1, "vccl gather: expects one input tensor per process");
  std::vector<Tensor> all = inputs;
  std::vector<Tensor> outs;
  if (rank_ == opts.rootRank) {
    TORCH_CHECK_VALUE(outputs.size() == 1, "vccl gather: the root expects one output list");
    checkListSize(outputs[0].size(), size_, "gather", "gather_list");
    outs = outputs[0];
    for (const auto& o : outs) checkSameDtype(o, inputs[0], "gather");
    all.insert(all.end(), outs.begin(), outs.end());
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), "vccl gather: only the root passes gather_list");
  }
  auto device = deviceOf(all, "gather");
  auto op = newOp(OpType::GATHER, "gather", opts.timeout);
  op->root = opts.rootRank;
  op->inputs = specs(inputs);
  op->outputs = specs(outs);
  return issue(op, device, all, outs);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::scatter(std::vector<Tensor>& outputs,
                                                   std::vector<std::vector<Tensor>>& inputs,
                                                   const ScatterOptions& opts) {
  checkRoot(opts.rootRank, size_, "scatter");
  TORCH_CHECK_VALUE(outputs.size() == 1, "vccl scatter: expects one output tensor per process");
  std::vector<Tensor> all = outputs;
  std::vector<Tensor> ins;
  if (rank_ == opts.rootRank) {
    TORCH_CHECK_VALUE(inputs.size() == 1, "vccl scatter: the root expects one input list");
    checkListSize(inputs[0].size(), size_, "scatter", "scatter_list");
    ins = inputs[0];
    for (const auto& i : ins) checkSameDtype(i, outputs[0], "scatter");
    all.insert(all.end(), ins.begin(), ins.end());
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(), "vccl scatter: only the root passes scatter_list");
  }
  auto device = deviceOf(all, "scatter");
  auto op = newOp(OpType::SCATTER, "scatter", opts.timeout);
  op->root = opts.rootRank;
  op->inputs = specs(ins);
  op->outputs = specs(outputs);
  return issue(op, device, all, outputs);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::reduce_scatter(std::vector<Tensor>& outputs,
                                                          std::vector<std::vector<Tensor>>& inputs,
                                                          const ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                    "vccl reduce_scatter: expects one output tensor and one input list per process");
  checkListSize(inputs[0].size(), size_, "reduce_scatter", "the input list");
  std::vector<Tensor> all = inputs[0];
  all.push_back(outputs[0]);
  auto device = deviceOf(all, "reduce_scatter");
  for (const auto& i : inputs[0]) {
    checkSameDtype(i, outputs[0], "reduce_scatter");
    TORCH_CHECK_VALUE(i.numel() == outputs[0].numel(), "vccl reduce_scatter: every input must have the output's "
                      "number of elements (", outputs[0].numel(), "), got ", i.numel());
  }
  checkReduceOp(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
  auto op = newOp(OpType::REDUCE_SCATTER, "reduce_scatter", opts.timeout);
  op->reduce_op = opts.reduceOp.op_;
  if (op->reduce_op == ReduceOp::PREMUL_SUM) {
    auto* s = dynamic_cast<PreMulSumSupplement*>(opts.reduceOp.supplement_.get());
    TORCH_CHECK_VALUE(s && !s->tensor_factor.defined(), "vccl reduce_scatter: PREMUL_SUM needs a scalar factor");
    op->premul_factor = s->double_factor;
  }
  op->inputs = specs(inputs[0]);
  op->outputs = specs(outputs);
  return issue(op, device, all, outputs);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::_reduce_scatter_base(Tensor& output, Tensor& input,
                                                                const ReduceScatterOptions& opts) {
  std::vector<Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                                           std::vector<Tensor>& inputs,
                                                                           const ReduceScatterOptions& opts) {
  const char* fn = "reduce_scatter_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "vccl ", fn, ": expects as many outputs as inputs");
  std::vector<Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto device = deviceOf(all, fn);
  for (size_t k = 0; k < inputs.size(); ++k) {
    checkSameDtype(outputs[k], inputs[k], fn);
    TORCH_CHECK_VALUE(inputs[k].numel() == outputs[k].numel() * size_, "vccl ", fn,
                      ": the input must hold world_size (", size_, ") times the output's elements (",
                      outputs[k].numel(), "), but holds ", inputs[k].numel());
    checkReduceOp(opts.reduceOp, outputs[k].scalar_type(), fn);
  }
  auto op = newOp(inputs.size() > 1 ? OpType::REDUCE_SCATTER_TENSOR_COALESCED : OpType::_REDUCE_SCATTER_BASE, fn,
                  opts.timeout);
  op->reduce_op = opts.reduceOp.op_;
  if (op->reduce_op == ReduceOp::PREMUL_SUM) {
    auto* s = dynamic_cast<PreMulSumSupplement*>(opts.reduceOp.supplement_.get());
    TORCH_CHECK_VALUE(s != nullptr, "vccl ", fn, ": PREMUL_SUM without a factor");
    if (s->tensor_factor.defined()) {
      const Tensor& f = s->tensor_factor;
      TORCH_CHECK_VALUE(f.numel() == 1, "vccl ", fn, ": the PREMUL_SUM factor must have one element");
      if (f.device().is_cpu()) {
        op->premul_factor = f.item<double>();
      } else {
        op->premul_tensor = at::vnpu::spec_of(f);
        all.push_back(f);
      }
    } else {
      op->premul_factor = s->double_factor;
    }
  }
  op->inputs = specs(inputs);
  op->outputs = specs(outputs);
  return issue(op, device, all, outputs);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::alltoall_base(Tensor& output, Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const AllToAllOptions& opts) {
  const char* fn = "all_to_all_single";
  std::vector<Tensor> all{output, input};
  auto device = deviceOf(all, fn);
  checkSameDtype(output, input, fn);
  auto checkSplits = [&](const std::vector<int64_t>& splits, const Tensor& t, const char* what) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "vccl ", fn, ": the ", what, "'s first dimension (", rows,
                        ") must divide evenly by world_size (", size_, ") when no split sizes are given");
      return;
    }
    checkListSize(splits.size(), size_, fn, what == std::string("input") ? "input_split_sizes" : "output_split_sizes");
    int64_t sum = 0;
    for (auto s : splits) {
      TORCH_CHECK_VALUE(s >= 0, "vccl ", fn, ": split sizes must be non-negative, got ", s);
      sum += s;
    }
    TORCH_CHECK_VALUE(sum == rows, "vccl ", fn, ": the ", what, " split sizes add up to ", sum,
                      " but the ", what, "'s first dimension is ", rows);
  };
  checkSplits(input_split_sizes, input, "input");
  checkSplits(output_split_sizes, output, "output");
  auto op = newOp(OpType::ALLTOALL_BASE, fn, opts.timeout);
  op->inputs = specs({input});
  op->outputs = specs({output});
  op->input_splits = input_split_sizes;
  op->output_splits = output_split_sizes;
  return issue(op, device, all, {output});
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                                    const AllToAllOptions& opts) {
  checkListSize(outputs.size(), size_, "all_to_all", "output_tensor_list");
  checkListSize(inputs.size(), size_, "all_to_all", "input_tensor_list");
  std::vector<Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto device = deviceOf(all, "all_to_all");
  for (size_t r = 0; r < inputs.size(); ++r) checkSameDtype(outputs[r], inputs[r], "all_to_all");
  auto op = newOp(OpType::ALLTOALL, "all_to_all", opts.timeout);
  op->inputs = specs(inputs);
  op->outputs = specs(outputs);
  return issue(op, device, all, outputs);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "vccl send: expects one tensor");
  auto device = deviceOf(tensors, "send");
  TORCH_CHECK_VALUE(dst_rank >= 0 && dst_rank < size_ && dst_rank != rank_, "vccl send: invalid destination rank ",
                    dst_rank, " (group size ", size_, ", this rank ", rank_, ")");
  auto op = newOp(OpType::SEND, "send", options_->timeout);
  op->peer = dst_rank;
  op->tag = tag;
  op->inputs = specs(tensors);
  return issue(op, device, tensors, tensors);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "vccl recv: expects one tensor");
  auto device = deviceOf(tensors, "recv");
  TORCH_CHECK_VALUE(src_rank >= 0 && src_rank < size_ && src_rank != rank_, "vccl recv: invalid source rank ",
                    src_rank, " (group size ", size_, ", this rank ", rank_, ")");
  auto op = newOp(OpType::RECV, "recv", options_->timeout);
  op->peer = src_rank;
  op->tag = tag;
  op->outputs = specs(tensors);
  return issue(op, device, tensors, tensors);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::recvAnysource(std::vector<Tensor>& tensors, int tag) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "vccl recv: expects one tensor");
  auto device = deviceOf(tensors, "recv");
  TORCH_CHECK_VALUE(!coalescing_, "vccl: recv from any source cannot be coalesced");
  auto op = newOp(OpType::RECVANYSOURCE, "recv", options_->timeout);
  op->tag = tag;
  op->outputs = specs(tensors);
  // Host-blocking wait(): the caller asks for the source rank right after it (as Gloo's).
  return issue(op, device, tensors, tensors, /*blocking=*/true);
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::barrier(const BarrierOptions& opts) {
  c10::DeviceIndex device;
  if (opts.device.has_value() && opts.device->type() == c10::DeviceType::PrivateUse1 && opts.device->has_index()) {
    device = opts.device->index();
  } else if (!opts.device_ids.empty()) {
    device = static_cast<c10::DeviceIndex>(opts.device_ids[0]);
  } else if (auto bound = getBoundDeviceId()) {
    device = bound->index();
  } else {
    device = c10::vnpu::current_device();
  }
  c10::vnpu::check_device_index(device);
  auto op = newOp(OpType::BARRIER, "barrier", opts.timeout);
  return issue(op, device, {}, {}, /*blocking=*/true);
}

void ProcessGroupVCCL::monitoredBarrier(const BarrierOptions& opts, bool wait_all_ranks) {
  TORCH_CHECK_VALUE(!coalescing_, "vccl: monitored_barrier cannot be coalesced");
  auto op = newOp(OpType::BARRIER, "monitored_barrier", opts.timeout);
  op->monitored = true;
  op->wait_all_ranks = wait_all_ranks;
  auto work = issue(op, c10::vnpu::current_device(), {}, {}, /*blocking=*/true);
  work->wait();
}

// ---- coalescing ----

void ProcessGroupVCCL::startCoalescing() {
  TORCH_CHECK(!coalescing_, "vccl: startCoalescing() called twice without endCoalescing()");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<Work> ProcessGroupVCCL::endCoalescing() {
  TORCH_CHECK(coalescing_, "vccl: endCoalescing() without startCoalescing()");
  coalescing_ = false;
  std::vector<Member> members;
  members.swap(coalesced_);
  auto op = newOp(OpType::COALESCED, "coalesced", options_->timeout);
  std::vector<Tensor> tensors, outputs;
  c10::DeviceIndex device = members.empty() ? c10::vnpu::current_device() : members[0].device;
  for (auto& m : members) {
    TORCH_CHECK_VALUE(m.device == device, "vccl: coalesced operations must use one device, got vnpu:", int(device),
                      " and vnpu:", int(m.device));
    op->batch.push_back(m.op);
    tensors.insert(tensors.end(), m.tensors.begin(), m.tensors.end());
    outputs.insert(outputs.end(), m.outputs.begin(), m.outputs.end());
  }
  if (members.empty()) op->finish();
  auto work = issue(op, device, tensors, outputs);
  // Members' futures complete as the batch's (same stream order).
  for (auto& m : members) completeFuture(m.op, m.future, m.outputs, device);
  return work;
}

// ---- split ----

c10::intrusive_ptr<Backend> ProcessGroupVCCL::split(const c10::intrusive_ptr<Store>& store,
                                                    const std::vector<int>& ranks,
                                                    const c10::intrusive_ptr<Backend::Options>& opts) {
  // Every rank of this group calls split() once per split_group(), members or not: the count names the
  // split the same on all of them. (The store torch passes is prefixed with a name hashed from the number
  // of groups each process knows, which differs on a rank left out of an earlier new_group: the members'
  // rendezvous would then never meet.)
  const uint64_t k = split_count_++;
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  std::string members;
  for (int r : ranks) members += c10::str(members.empty() ? "" : ",", r);
  (void)store;
  auto split_store = c10::make_intrusive<PrefixStore>(c10::str("vccl/split/", k, "/", members, "/"), store_);
  const int new_rank = static_cast<int>(it - ranks.begin());
  const int new_size = static_cast<int>(ranks.size());
  auto vopts = c10::make_intrusive<Options>(opts ? opts->timeout : options_->timeout);
  vopts->check_args = options_->check_args;
  if (auto mine = c10::dynamic_intrusive_pointer_cast<Options>(opts)) vopts->check_args = mine->check_args;
  if (opts) {
    vopts->group_name = opts->group_name;
    vopts->global_ranks_in_group = opts->global_ranks_in_group;
  }
  TORCH_CHECK(glooFactory(), "vccl: split() needs torch_vnpu.distributed to be imported");
  auto gloo_store = c10::make_intrusive<PrefixStore>("gloo/", split_store);
  auto gloo = glooFactory()(gloo_store, new_rank, new_size, vopts->timeout);
  auto pg = c10::make_intrusive<ProcessGroupVCCL>(split_store, new_rank, new_size, vopts, gloo);
  pg->setBoundDeviceId(getBoundDeviceId());
  return pg;
}

}  // namespace c10d::vnpu
