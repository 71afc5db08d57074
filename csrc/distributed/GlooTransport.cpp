#include "GlooTransport.h"

#include "OpCheck.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <vnpu/runtime.h>

#include <numeric>

namespace c10d::vnpu {
namespace {

using at::Tensor;
using at::vnpu::AliasContext;

// Gloo sends and receives device memory in place from the kernel (sockets): under
// VNPU_SANITIZE check 4 without protection keys it must stay open meanwhile
// (vnpuSanitizerSystemAccessBegin). No-op otherwise.
struct SystemAccess {
  SystemAccess() { vnpuSanitizerSystemAccessBegin(); }
  ~SystemAccess() { vnpuSanitizerSystemAccessEnd(); }
  SystemAccess(const SystemAccess&) = delete;
  SystemAccess& operator=(const SystemAccess&) = delete;
};

int64_t numelOf(const TensorSpec& s) {
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  return n;
}

// The same memory as a flat uint8 tensor spec (spec must be contiguous).
TensorSpec asBytes(const TensorSpec& s) {
  TensorSpec b = s;
  int64_t item = static_cast<int64_t>(c10::elementSize(s.dtype));
  b.dtype = at::kByte;
  b.sizes = {numelOf(s) * item};
  b.strides = {1};
  b.storage_offset = s.storage_offset * item;
  b.conj = b.neg = false;
  return b;
}

// [rows, bytes per row] uint8 view (dim 0 kept, for split sizes in rows).
TensorSpec asByteRows(const TensorSpec& s) {
  TensorSpec b = asBytes(s);
  int64_t rows = s.sizes.empty() ? 1 : s.sizes[0];
  int64_t total = b.sizes[0];
  b.sizes = {rows, rows == 0 ? 0 : total / rows};
  b.strides = {rows == 0 ? 1 : total / rows, 1};
  return b;
}

std::vector<Tensor> aliases(AliasContext& ctx, const std::vector<TensorSpec>& specs, bool bytes) {
  std::vector<Tensor> out;
  out.reserve(specs.size());
  for (const auto& s : specs) out.push_back(ctx.make(bytes ? asBytes(s) : s));
  return out;
}

// Note [Gloo dtype adaptation]
// How a reduction of `dtype` with `op` runs on Gloo: directly on the alias, or
// on a staging copy of `staging` dtype; `premul` scales first, `divide`
// averages after the sum; `flip_sign` maps uint64 order onto int64 for MIN/MAX.
struct ReducePlan {
  bool stage = false;
  at::ScalarType staging = at::kFloat;
  bool complex_as_real = false;
  bool flip_sign = false;
  bool premul = false;
  bool divide = false;
  bool integral = false;
  ReduceOp gloo_op = ReduceOp::SUM;
};

bool glooReduces(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kInt:
    case at::kLong: case at::kChar: case at::kByte: case at::kBool:
      return true;
    default:
      return false;
  }
}

ReducePlan planReduction(at::ScalarType dtype, ReduceOp::RedOpType op) {
  ReducePlan p;
  p.complex_as_real = at::isComplexType(dtype);
  at::ScalarType t = p.complex_as_real ? c10::toRealValueType(dtype) : dtype;
  if (!glooReduces(t)) {
    p.stage = true;
    p.staging = at::isFloatingType(t) ? at::kFloat : at::kLong;  // fp8 -> float32; int16/uint* -> int64
    p.flip_sign = t == at::kUInt64 && (op == ReduceOp::MIN || op == ReduceOp::MAX);
  }
  p.integral = at::isIntegralType(t, /*includeBool=*/true);
  switch (op) {
    case ReduceOp::AVG:
      p.divide = true;
      p.gloo_op = ReduceOp::SUM;
      break;
    case ReduceOp::PREMUL_SUM:
      p.premul = true;
      p.gloo_op = ReduceOp::SUM;
      break;
    default:
      p.gloo_op = op;
  }
  return p;
}

// The tensor Gloo reduces for `t` (the alias itself or a staging copy).
Tensor stageIn(const ReducePlan& p, const Tensor& t, bool copy) {
  Tensor w = p.complex_as_real ? at::view_as_real(t) : t;
  if (p.stage) {
    if (w.scalar_type() == at::kUInt64) {
      w = w.view(at::kLong).clone();  // same bits; int64 wraps like uint64 for SUM/PRODUCT/bitwise ops
      if (p.flip_sign) w.bitwise_xor_(std::numeric_limits<int64_t>::min());
    } else {
      w = w.to(p.staging);
    }
  } else if (copy) {
    w = w.clone();
  }
  return w;
}

// Writes the reduced `w` back into `t` (averaging if asked).
void stageOut(const ReducePlan& p, const Tensor& w, const Tensor& t, int world) {
  Tensor r = w;
  if (p.divide) {
    if (p.integral) r = r.div(world, "trunc");
    else r = r.div(world);
  }
  Tensor dst = p.complex_as_real ? at::view_as_real(t) : t;
  if (p.flip_sign) r = r.bitwise_xor(std::numeric_limits<int64_t>::min());
  if (dst.scalar_type() == at::kUInt64) r = r.view(at::kUInt64);
  if (!r.is_same(dst)) dst.copy_(r);
}

// PREMUL_SUM's factor: the scalar, or the 1-element tensor's value now.
double premulFactor(const CollectiveOp& op, AliasContext& ctx) {
  if (!op.premul_tensor.defined) return op.premul_factor;
  return ctx.make(op.premul_tensor).to(at::kDouble).item<double>();
}

std::string glooError(const CollectiveOp& op, const std::exception& e) {
  std::string what = e.what();
  // c10::Error messages carry a C++ backtrace after the first lines; keep the message.
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) what = ce->msg();
  return c10::str("vccl: ", describe(op), " failed in Gloo: ", what);
}

}  // namespace

GlooTransport::GlooTransport(c10::intrusive_ptr<Backend> gloo, int rank, int world, bool check_args,
                             std::function<void(const std::string&)> on_fatal)
    : gloo_(std::move(gloo)), rank_(rank), world_(world), check_args_(check_args),
      on_fatal_(std::move(on_fatal)) {}

GlooTransport::~GlooTransport() { shutdown("the process group was destroyed"); }

void GlooTransport::shutdown(const std::string& reason) {
  std::vector<Waiter> waiters;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopped_) return;
    stopped_ = true;
    for (auto& w : pending_) w->abort();
    pending_.clear();
    waiters.swap(waiters_);
  }
  for (auto& w : waiters) w.thread.join();
}

void GlooTransport::drain(Clock::time_point deadline) {
  for (;;) {
    {
      std::lock_guard<std::mutex> g(mu_);
      bool busy = false;
      for (auto& w : waiters_) busy = busy || !w.done->load();
      if (!busy) return;
    }
    if (Clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void GlooTransport::check(const CollectiveOp& op) {
  // A monitored barrier exists to name ranks that do not arrive: no exchange before it.
  if (!check_args_ || !isCheckedCollective(op.type) || op.monitored) return;
  std::vector<int64_t> fp = fingerprint(op, rank_, world_);
  Tensor mine = at::from_blob(fp.data(), {static_cast<int64_t>(fp.size())}, at::kLong);
  Tensor all = at::empty({static_cast<int64_t>(fp.size()) * world_}, at::kLong);
  AllgatherOptions opts;
  opts.timeout = op.timeout;
  gloo_->_allgather_base(all, mine, opts)->wait();
  std::string msg = checkFingerprints(op, rank_, world_, all.data_ptr<int64_t>());
  if (!msg.empty()) throw TransportError(msg, /*fatal=*/false);
}

void GlooTransport::start(const OpPtr& op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopped_) throw TransportError("vccl: the process group was shut down", true);
  }
  try {
    if (isP2P(op->type)) {
      startP2P(op);
      return;
    }
    if (op->type == OpType::COALESCED) {
      for (auto& m : op->batch) {
        if (isP2P(m->type)) {
          startP2P(m);
        } else {
          check(*m);
          runCollective(*m);
          m->finish();
        }
      }
      // The batch completes with its last member.
      spawn([op] {
        std::string error;
        for (auto& m : op->batch) {
          m->waitDone(op->timeout + std::chrono::milliseconds(10000));
          if (error.empty() && !m->error().empty()) error = m->error();
        }
        op->finish(error);
      });
      return;
    }
    check(*op);
    runCollective(*op);
    op->finish();
  } catch (const TransportError&) {
    throw;
  } catch (const std::exception& e) {
    throw TransportError(glooError(*op, e), /*fatal=*/true);
  }
}

bool GlooTransport::isP2P(OpType t) { return t == OpType::SEND || t == OpType::RECV || t == OpType::RECVANYSOURCE; }

void GlooTransport::spawn(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = waiters_.begin(); it != waiters_.end();) {  // reap finished waiters
    if (it->done->load()) {
      it->thread.join();
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  waiters_.push_back(Waiter{std::thread([fn = std::move(fn), done] {
                              fn();
                              done->store(true);
                            }),
                            done});
}

void GlooTransport::track(const c10::intrusive_ptr<Work>& w, bool add) {
  std::lock_guard<std::mutex> g(mu_);
  if (add) {
    pending_.push_back(w);
    return;
  }
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (*it == w) {
      pending_.erase(it);
      return;
    }
  }
}

// Note [Point-to-point size check]
// Gloo aborts the whole process when a message is larger than the buffer posted
// for it (an enforce in its I/O thread), and silently fills part of a larger
// buffer with a smaller one. So every send is preceded, on the same (peer, tag)
// slot, by a 32-byte header (magic, bytes, dtype). A receive first takes the
// header, then posts the payload receive: into the caller's tensor when sizes
// and dtypes match, else into scratch memory of the sent size (the slot stays in
// step) and fails with both sizes. Receives on one (peer, tag) slot take turns
// (a ticket each, in issue order) from posting the header receive to posting the
// payload receive, so each header is followed by its own payload.
namespace {
constexpr int64_t kHeaderMagic = 0x76636c70327000;  // "vcclp2p"
}

void GlooTransport::startP2P(const OpPtr& op) {
  auto access = std::make_shared<SystemAccess>();  // until the spawned wait ends
  if (op->type == OpType::SEND) {
    AliasContext ctx;
    const TensorSpec& spec = op->inputs[0];
    Tensor header = at::empty({4}, at::kLong);
    auto* h = header.data_ptr<int64_t>();
    h[0] = kHeaderMagic;
    h[1] = numelOf(spec) * static_cast<int64_t>(c10::elementSize(spec.dtype));
    h[2] = static_cast<int64_t>(spec.dtype);
    h[3] = 0;
    std::vector<Tensor> hv{header}, pv{ctx.make(asBytes(spec))};
    auto hw = gloo_->send(hv, op->peer, op->tag);
    auto pw = gloo_->send(pv, op->peer, op->tag);
    track(hw, true);
    track(pw, true);
    spawn([this, op, hw, pw, access] {
      std::string error;
      for (const auto& w : {hw, pw}) {
        try {
          w->wait(op->timeout);
        } catch (const std::exception& e) {
          if (error.empty()) error = glooError(*op, e);
        }
        track(w, false);
      }
      if (!error.empty() && on_fatal_) on_fatal_(error);
      op->finish(error);
    });
    return;
  }
  const bool any = op->type == OpType::RECVANYSOURCE;
  std::shared_ptr<RecvSlot> slot;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto& s = slots_[{any ? -1 : op->peer, op->tag}];
    if (!s) s = std::make_shared<RecvSlot>();
    slot = s;
    ticket = slot->next++;
  }
  spawn([this, op, slot, ticket, any, access] {
    std::string error, mismatch;
    bool fatal = false;
    int source = any ? -1 : op->peer;
    c10::intrusive_ptr<Work> payload;
    const auto deadline = Clock::now() + op->timeout;
    {
      std::unique_lock<std::mutex> g(slot->mu);
      if (!slot->cv.wait_until(g, deadline, [&] { return slot->serving == ticket; })) {
        error = c10::str("vccl: ", describe(*op), " on rank ", rank_, " timed out behind earlier receives on the "
                         "same (peer, tag)");
      }
    }
    if (error.empty()) {
      try {
        Tensor header = at::zeros({4}, at::kLong);
        std::vector<Tensor> hv{header};
        auto hw = any ? gloo_->recvAnysource(hv, op->tag) : gloo_->recv(hv, op->peer, op->tag);
        track(hw, true);
        hw->wait(op->timeout);
        track(hw, false);
        if (any) source = hw->sourceRank();
        const auto* h = header.data_ptr<int64_t>();
        const TensorSpec& spec = op->outputs[0];
        const int64_t want = numelOf(spec) * static_cast<int64_t>(c10::elementSize(spec.dtype));
        if (h[0] != kHeaderMagic) {
          throw std::runtime_error(c10::str("rank ", source, " sent a message vccl did not frame; it is probably "
                                            "running a different operation on this tag"));
        }
        AliasContext ctx;
        Tensor target;
        if (h[1] == want && h[2] == static_cast<int64_t>(spec.dtype)) {
          target = ctx.make(asBytes(spec));
        } else {
          target = at::empty({h[1]}, at::kByte);  // drained, so the slot stays in step
          mismatch = c10::str("vccl: recv from rank ", source, " (tag ", op->tag, ") on rank ", rank_, ": rank ",
                              source, " sent ", h[1], " bytes of ", c10::toString(static_cast<at::ScalarType>(h[2])),
                              " but this receive expects ", want, " bytes of ", spec.dtype,
                              "; the send and the receive must use tensors of the same size and dtype");
        }
        std::vector<Tensor> pv{target};
        payload = gloo_->recv(pv, source, op->tag);
        track(payload, true);
      } catch (const std::exception& e) {
        error = glooError(*op, e);
        fatal = true;
      }
      {
        std::lock_guard<std::mutex> g(slot->mu);
        ++slot->serving;
      }
      slot->cv.notify_all();
    }
    if (payload) {
      try {
        payload->wait(op->timeout);
      } catch (const std::exception& e) {
        if (error.empty()) error = glooError(*op, e);
        fatal = true;
      }
      track(payload, false);
    }
    if (error.empty()) error = mismatch;
    if (fatal && on_fatal_) on_fatal_(error);
    op->finish(error, error.empty() ? source : -1);
  });
}

void GlooTransport::runCollective(CollectiveOp& op) {
  SystemAccess access;
  AliasContext ctx;
  const int W = world_;
  auto timeoutOf = [&](auto& opts) { opts.timeout = op.timeout; };
  switch (op.type) {
    case OpType::BARRIER: {
      BarrierOptions opts;
      timeoutOf(opts);
      if (op.monitored) gloo_->monitoredBarrier(opts, op.wait_all_ranks);
      else gloo_->barrier(opts)->wait();
      return;
    }
    case OpType::BROADCAST: {
      for (const auto& s : op.inputs) {
        std::vector<Tensor> t{ctx.make(asBytes(s))};
        BroadcastOptions opts;
        opts.rootRank = op.root;
        timeoutOf(opts);
        gloo_->broadcast(t, opts)->wait();
      }
      return;
    }
    case OpType::ALLREDUCE:
    case OpType::ALLREDUCE_COALESCED:
    case OpType::REDUCE: {
      const bool is_reduce = op.type == OpType::REDUCE;
      double factor = op.reduce_op == ReduceOp::PREMUL_SUM ? premulFactor(op, ctx) : 1.0;
      for (const auto& s : op.inputs) {
        Tensor t = ctx.make(s);
        ReducePlan p = planReduction(s.dtype, op.reduce_op);
        // reduce keeps non-root inputs intact when it has to scale them.
        Tensor w = stageIn(p, t, /*copy=*/is_reduce && p.premul);
        if (p.premul) w.mul_(factor);
        std::vector<Tensor> v{w};
        if (is_reduce) {
          ReduceOptions opts;
          opts.reduceOp = p.gloo_op;
          opts.rootRank = op.root;
          timeoutOf(opts);
          gloo_->reduce(v, opts)->wait();
          if (rank_ == op.root) stageOut(p, w, t, W);
        } else {
          AllreduceOptions opts;
          opts.reduceOp = p.gloo_op;
          timeoutOf(opts);
          gloo_->allreduce(v, opts)->wait();
          stageOut(p, w, t, W);
        }
      }
      return;
    }
    case OpType::REDUCE_SCATTER:
    case OpType::_REDUCE_SCATTER_BASE:
    case OpType::REDUCE_SCATTER_TENSOR_COALESCED: {
      double factor = op.reduce_op == ReduceOp::PREMUL_SUM ? premulFactor(op, ctx) : 1.0;
      const bool list = op.type == OpType::REDUCE_SCATTER;
      const size_t n = list ? 1 : op.inputs.size();
      for (size_t k = 0; k < n; ++k) {
        const TensorSpec& out_spec = op.outputs[k];
        ReducePlan p = planReduction(out_spec.dtype, op.reduce_op);
        Tensor out = ctx.make(out_spec);
        // Inputs are never modified: scale or widen copies of them.
        auto in_of = [&](const TensorSpec& s) {
          Tensor w = stageIn(p, ctx.make(s), /*copy=*/p.premul);
          if (p.premul) w.mul_(factor);
          return w;
        };
        // Gloo writes the output itself, or a staging tensor copied back (rounded, averaged).
        Tensor w_out = p.stage ? stageIn(p, out, /*copy=*/false)
                               : (p.complex_as_real ? at::view_as_real(out) : out);
        ReduceScatterOptions opts;
        opts.reduceOp = p.gloo_op;
        timeoutOf(opts);
        if (list) {
          std::vector<Tensor> ins;
          for (const auto& s : op.inputs) ins.push_back(in_of(s));
          std::vector<std::vector<Tensor>> inputs{ins};
          std::vector<Tensor> outputs{w_out};
          gloo_->reduce_scatter(outputs, inputs, opts)->wait();
        } else {
          Tensor in = in_of(op.inputs[k]);
          gloo_->_reduce_scatter_base(w_out, in, opts)->wait();
        }
        stageOut(p, w_out, out, W);
      }
      return;
    }
    case OpType::_ALLGATHER_BASE: {
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        Tensor out = ctx.make(asBytes(op.outputs[k]));
        Tensor in = ctx.make(asBytes(op.inputs[k]));
        AllgatherOptions opts;
        timeoutOf(opts);
        gloo_->_allgather_base(out, in, opts)->wait();
      }
      return;
    }
    case OpType::ALLGATHER:
    case OpType::ALLGATHER_COALESCED: {
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        Tensor in = ctx.make(asBytes(op.inputs[k]));
        std::vector<Tensor> outs;
        bool even = true;
        for (int r = 0; r < W; ++r) {
          outs.push_back(ctx.make(asBytes(op.outputs[k * W + r])));
          even = even && outs.back().numel() == in.numel();
        }
        if (even) {
          std::vector<std::vector<Tensor>> outputs{outs};
          std::vector<Tensor> inputs{in};
          AllgatherOptions opts;
          timeoutOf(opts);
          gloo_->allgather(outputs, inputs, opts)->wait();
        } else {
          // Uneven sizes (allowed for the list form, as on NCCL): one broadcast per rank.
          outs[rank_].copy_(in);
          for (int r = 0; r < W; ++r) {
            std::vector<Tensor> t{outs[r]};
            BroadcastOptions opts;
            opts.rootRank = r;
            timeoutOf(opts);
            gloo_->broadcast(t, opts)->wait();
          }
        }
      }
      return;
    }
    case OpType::GATHER: {
      std::vector<Tensor> inputs{ctx.make(asBytes(op.inputs[0]))};
      std::vector<std::vector<Tensor>> outputs;
      if (rank_ == op.root) outputs.push_back(aliases(ctx, op.outputs, /*bytes=*/true));
      GatherOptions opts;
      opts.rootRank = op.root;
      timeoutOf(opts);
      gloo_->gather(outputs, inputs, opts)->wait();
      return;
    }
    case OpType::SCATTER: {
      std::vector<Tensor> outputs{ctx.make(asBytes(op.outputs[0]))};
      std::vector<std::vector<Tensor>> inputs;
      if (rank_ == op.root) inputs.push_back(aliases(ctx, op.inputs, /*bytes=*/true));
      ScatterOptions opts;
      opts.rootRank = op.root;
      timeoutOf(opts);
      gloo_->scatter(outputs, inputs, opts)->wait();
      return;
    }
    case OpType::ALLTOALL_BASE: {
      Tensor out = ctx.make(asByteRows(op.outputs[0]));
      Tensor in = ctx.make(asByteRows(op.inputs[0]));
      std::vector<int64_t> out_splits = op.output_splits, in_splits = op.input_splits;
      AllToAllOptions opts;
      timeoutOf(opts);
      gloo_->alltoall_base(out, in, out_splits, in_splits, opts)->wait();
      return;
    }
    case OpType::ALLTOALL: {
      std::vector<Tensor> outs = aliases(ctx, op.outputs, /*bytes=*/true);
      std::vector<Tensor> ins = aliases(ctx, op.inputs, /*bytes=*/true);
      AllToAllOptions opts;
      timeoutOf(opts);
      bool even = true;
      for (int r = 0; r < W; ++r) even = even && ins[r].numel() == ins[0].numel() && outs[r].numel() == ins[0].numel();
      if (even) {
        gloo_->alltoall(outs, ins, opts)->wait();
        return;
      }
      // Gloo's list form needs equal sizes; pairs of different sizes go through one
      // alltoall_base on packed byte buffers with byte split sizes.
      std::vector<int64_t> in_splits, out_splits;
      for (int r = 0; r < W; ++r) {
        in_splits.push_back(ins[r].numel());
        out_splits.push_back(outs[r].numel());
      }
      Tensor packed_in = at::cat(ins);
      Tensor packed_out = at::empty({static_cast<int64_t>(std::accumulate(out_splits.begin(), out_splits.end(),
                                                                           int64_t{0}))},
                                    at::kByte);
      {
        // Gloo may move from the split vectors it is given.
        std::vector<int64_t> out_counts = out_splits, in_counts = in_splits;
        gloo_->alltoall_base(packed_out, packed_in, out_counts, in_counts, opts)->wait();
      }
      int64_t off = 0;
      for (int r = 0; r < W; ++r) {
        outs[r].copy_(packed_out.narrow(0, off, out_splits[r]));
        off += out_splits[r];
      }
      return;
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "vccl: unexpected op type ", opTypeToString(op.type));
  }
}

}  // namespace c10d::vnpu
