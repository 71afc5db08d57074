// One operation of a ProcessGroupVCCL (a collective, a point-to-point transfer
// or a coalesced batch of them), from the call that issued it to completion.
//
// Threads (see Note [vccl execution model] in ProcessGroupVCCL.h):
//  * the calling thread builds the op and hands it to the ProgressEngine;
//  * a stream worker runs the op's "ready" task (markReady) once the work
//    queued before the collective on the issuing stream has run;
//  * the progress thread waits for readiness, drives the transport and calls
//    finish() (a transport may finish a point-to-point op later from its own
//    thread);
//  * gate tasks on vnpu streams (WorkVCCL::wait, the hold stream) and host
//    waiters block in waitDone().
// `mu` guards the completion state; the arguments are written once by the
// calling thread before the op is published and are read-only afterwards.
//
// An op holds no at::Tensor: dropping a tensor that has a Python object takes
// the GIL, which a stream worker or the progress thread must never wait for
// (Note [No Python tensors in stream tasks], csrc/ops/CpuAlias.cpp). Tensors
// are snapshots (TensorSpec); their memory stays valid because the caller
// recorded it on the backend's hold stream (Note [vccl memory lifetime]).
#pragma once

#include "../ops/CpuAlias.h"

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vnpu/runtime.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d::vnpu {

using at::vnpu::TensorSpec;
using Clock = std::chrono::steady_clock;

struct CollectiveOp {
  enum class State : uint8_t { kQueued, kReady, kDone, kFailed };

  CollectiveOp() = default;
  CollectiveOp(const CollectiveOp&) = delete;
  CollectiveOp& operator=(const CollectiveOp&) = delete;
  ~CollectiveOp();

  // --- arguments (immutable once published) ---
  OpType type = OpType::UNKNOWN;
  const char* name = "";           // PyTorch's name of the call ("all_reduce", "send", ...)
  uint64_t seq = 0;                // collective number within the group (1, 2, ...); 0 for p2p
  c10::DeviceIndex device = 0;
  std::chrono::milliseconds timeout{0};
  // Layout of inputs/outputs per type, `world` = group size:
  //  ALLREDUCE(_COALESCED), BROADCAST, REDUCE: inputs = the tensors (in place)
  //  ALLGATHER(_COALESCED): inputs[k], outputs[k * world + r]
  //  _ALLGATHER_BASE: inputs[k], outputs[k] (k > 1: allgather_into_tensor_coalesced)
  //  REDUCE_SCATTER: inputs[r], outputs[0];  _REDUCE_SCATTER_BASE: inputs[k], outputs[k]
  //  ALLTOALL: inputs[r], outputs[r];  ALLTOALL_BASE: inputs[0], outputs[0] + splits
  //  GATHER: inputs[0], outputs[r] (root only);  SCATTER: inputs[r] (root only), outputs[0]
  //  SEND/RECV/RECVANYSOURCE: inputs[0] (send) / outputs[0] (recv);  BARRIER: none
  //  COALESCED: `batch` holds the member ops, run as one unit
  std::vector<TensorSpec> inputs, outputs;
  ReduceOp::RedOpType reduce_op = ReduceOp::SUM;
  double premul_factor = 1.0;      // PREMUL_SUM with a scalar factor
  TensorSpec premul_tensor;        // PREMUL_SUM with a tensor factor (1 element)
  int64_t root = 0;
  int peer = -1;                   // SEND/RECV group rank
  int tag = 0;
  std::vector<int64_t> input_splits, output_splits;  // ALLTOALL_BASE, in dim-0 rows
  bool monitored = false;          // BARRIER: monitored_barrier (names the ranks that miss it)
  bool wait_all_ranks = false;     // monitored_barrier(wait_all_ranks=True)
  std::vector<std::shared_ptr<CollectiveOp>> batch;
  // A subgroup's errors name group ranks; finish() appends this note, which maps them to global ranks.
  std::string group_ranks_note;
  // Sanitizer only: recorded on the issuing stream right after the ready task,
  // where the op's accesses are declared. Gates wait on it so the stream that
  // calls Work.wait() is ordered after those accesses (docs/sanitizer.md).
  vnpuEvent_t declared = nullptr;

  // --- completion state ---
  void markReady();
  // Waits until ready; false if `deadline` passed first.
  bool waitReady(Clock::time_point deadline);
  bool isReady();
  // Marks the op (and batch members) done, or failed with `error` when non-empty.
  void finish(const std::string& error = std::string(), int source_rank = -1);
  // Waits until done or failed; false if `timeout` passed first.
  bool waitDone(std::chrono::milliseconds timeout);
  State state();
  bool completed();                // done or failed
  std::string error();             // "" unless failed
  int sourceRank();
  // Runs `callback` once the op is done or failed (at once, here, if it is);
  // otherwise on the thread that finishes it, so it must be short and must not
  // take the GIL (FutureCompletion only wakes its thread).
  void onFinish(std::function<void()> callback);
  // Note [A failed collective is reported once]: every waiter of a failed op
  // (Work.wait() on the host, a gate on the caller's stream, the hold stream's
  // gate) may report it; the first to claim the report does, so the error is
  // neither lost (a collective nobody waited for fails the next
  // synchronization, as an asynchronous CUDA error does) nor raised twice.
  // True for the first caller only. The claimer calls markReportPosted() once
  // its report is visible (raised on the host, or the device's pending error
  // after its gate task ended); other waiters of the failed op first wait for
  // that (waitReportPosted), so that nothing ordered after them (a copy of the
  // outputs and its synchronize) can finish before the error is there to raise.
  bool claimReport() { return !reported_.exchange(true); }
  bool reportClaimed() const { return reported_.load(); }
  void markReportPosted();
  // False if `timeout` passed first.
  bool waitReportPosted(std::chrono::milliseconds timeout);

  Clock::time_point issued = Clock::now();
  float durationMs();              // issue to completion, -1 if not completed

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kQueued;
  std::string error_;
  int source_rank_ = -1;
  Clock::time_point finished_;
  std::vector<std::function<void()>> on_finish_;
  std::atomic<bool> reported_{false};
  bool report_posted_ = false;  // guarded by mu_
};

using OpPtr = std::shared_ptr<CollectiveOp>;

// "all_reduce #12" / "send to rank 1 (tag 0)" for messages.
std::string describe(const CollectiveOp& op);

}  // namespace c10d::vnpu
