// ProcessGroupVCCL: the c10d backend "vccl" for vnpu tensors (as
// ProcessGroupNCCL is for cuda). Registered from Python
// (src/torch_vnpu/distributed) with devices=["vnpu"].
//
// Note [vccl execution model]
// A collective is stream-ordered like NCCL's, but the bytes move on the
// group's progress thread, never on a stream worker:
//  1. Calling thread: check the arguments, snapshot the tensors (TensorSpec),
//     record their memory on the hold stream (Note [vccl memory lifetime]),
//     enqueue a "ready" task on the current vnpu stream of the tensors'
//     device and hand the op to the ProgressEngine. Returns at once.
//  2. The stream's worker runs "ready" after the work queued before the
//     collective (which produced its inputs) and goes on with its queue.
//  3. The progress thread starts ops in issue order once ready and drives the
//     transport (Gloo over TCP on CPU aliases, or shared memory on one host).
//  4. Work::wait() enqueues on the caller's current stream a gate task that
//     blocks that stream until the op completed: later kernels see the
//     results; the host does not block (barrier() does, as NCCL's, and so
//     does wait(timeout) with an explicit timeout). Work::getFuture()
//     completes at issue, stream-ordered after the op (Note [vccl futures
//     complete at issue], FutureCompletion.h).
// A blocking transfer on a stream worker would deadlock: with send-then-recv
// on both ranks each worker would sit in its send while the receive it needs
// waits behind it in the peer's queue. Here sends are posted and awaited off
// the streams, so point-to-point ops complete in any order.
//
// Transports (csrc/distributed/*Transport): when every rank of the group runs
// on this host, collectives use shared memory (ShmTransport: peers' device
// memory mapped into each process, no copies); otherwise, and for
// point-to-point transfers, Gloo over TCP (GlooTransport). VNPU_VCCL_TRANSPORT
// = auto (default) | gloo | shm forces one.
//
// Note [vccl memory lifetime]
// Like ProcessGroupNCCL's recordStream on its NCCL stream: every tensor of an
// op is recorded (caching allocator record_stream) on one per-device "hold"
// stream, on which a gate task per op waits for the op's completion. A tensor
// the caller frees before the op finished is therefore not reused until then,
// without the op holding a reference (which a stream worker or the progress
// thread could only drop with the GIL). Futures (Work::getFuture) are marked
// completed on the hold stream too, so their consumers wait on the device.
// With VNPU_LAUNCH_BLOCKING=1 every collective completes before its call
// returns (point-to-point transfers excepted, which must be able to overlap).
#pragma once

#include "CollectiveOp.h"
#include "FutureCompletion.h"
#include "ProgressEngine.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d::vnpu {

class ProcessGroupVCCL : public Backend {
 public:
  struct Options : Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout);
    // Cross-rank check of every collective's arguments (OpCheck.h).
    // VNPU_VCCL_CHECK=0 turns it off.
    bool check_args = true;
  };

  // `gloo`: a ProcessGroupGloo over the same ranks (built in Python), the
  // transport between hosts and for monitored_barrier.
  ProcessGroupVCCL(c10::intrusive_ptr<Store> store, int rank, int size, c10::intrusive_ptr<Options> options,
                   c10::intrusive_ptr<Backend> gloo);
  ~ProcessGroupVCCL() override;

  const std::string getBackendName() const override { return "vccl"; }
  c10::intrusive_ptr<Backend::Options> getBackendOptions() override { return options_; }
  const c10::intrusive_ptr<Options>& options() const { return options_; }
  const c10::intrusive_ptr<Backend>& glooBackend() const { return gloo_; }
  // "shm" (all ranks on this host, device memory mapped by peers) or "gloo".
  const std::string& transportName() const { return transport_name_; }
  void setTimeout(std::chrono::milliseconds timeout) override { options_->timeout = timeout; }
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const BroadcastOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const AllreduceOptions& opts) override;
  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors, const ReduceOptions& opts) override;
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                           const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs,
                                               const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const AllgatherOptions& opts) override;
  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const GatherOptions& opts) override;
  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const ScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                         std::vector<int64_t>& output_split_sizes,
                                         std::vector<int64_t>& input_split_sizes,
                                         const AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                    const AllToAllOptions& opts) override;
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<Work> barrier(const BarrierOptions& opts) override;
  void monitoredBarrier(const BarrierOptions& opts, bool wait_all_ranks) override;

  void startCoalescing() override;
  c10::intrusive_ptr<Work> endCoalescing() override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;

  c10::intrusive_ptr<Backend> split(const c10::intrusive_ptr<Store>& store, const std::vector<int>& ranks,
                                    const c10::intrusive_ptr<Backend::Options>& opts) override;
  void abort() override;
  void shutdown() override;
  ErrorType getError() override;

  // Creates a ProcessGroupGloo (store, rank, size, timeout) for split(): set
  // once from Python, since Gloo can only be built there.
  using GlooFactory = std::function<c10::intrusive_ptr<Backend>(const c10::intrusive_ptr<Store>&, int, int,
                                                                 std::chrono::milliseconds)>;
  static void setGlooFactory(GlooFactory factory);

 private:
  struct Issued;
  OpPtr newOp(OpType type, const char* name, std::chrono::milliseconds timeout);
  // Publishes `op` (see Note [vccl execution model]); `tensors`: every tensor it touches.
  // Completes an op's future (Note [vccl futures complete at issue]).
  void completeFuture(const OpPtr& op, const c10::intrusive_ptr<c10::ivalue::Future>& future,
                      const std::vector<at::Tensor>& outputs, c10::DeviceIndex device);
  c10::intrusive_ptr<Work> issue(OpPtr op, c10::DeviceIndex device, const std::vector<at::Tensor>& tensors,
                                 std::vector<at::Tensor> outputs, bool blocking = false);
  c10::DeviceIndex deviceOf(const std::vector<at::Tensor>& tensors, const char* fn);

  c10::intrusive_ptr<Store> store_;
  uint64_t split_count_ = 0;  // split() calls so far (Note in split())
  c10::intrusive_ptr<Options> options_;
  c10::intrusive_ptr<Backend> gloo_;
  std::unique_ptr<ProgressEngine> engine_;
  std::shared_ptr<FutureCompletion> futures_ = std::make_shared<FutureCompletion>();  // Note [vccl futures complete at issue]
  std::string transport_name_;
  std::string group_ranks_note_;   // Note on CollectiveOp::group_ranks_note; empty for a group of all ranks
  uint64_t seq_ = 0;              // collectives issued (calling thread only, as c10d requires)

  // Coalescing (startCoalescing .. endCoalescing), calling thread only.
  bool coalescing_ = false;
  struct Member {
    OpPtr op;
    c10::DeviceIndex device;
    std::vector<at::Tensor> tensors, outputs;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  std::vector<Member> coalesced_;
};

}  // namespace c10d::vnpu
