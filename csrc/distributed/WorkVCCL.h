// WorkVCCL: the c10d::Work of a vccl operation (mirrors WorkNCCL's contract).
//
//  * wait()/synchronize()/blockCurrentStream(): the caller's current vnpu
//    stream waits for the operation (a gate task on that stream that blocks
//    its worker until the transport finished); the host does not block. A
//    barrier's wait() also blocks the host, as ProcessGroupNCCL's does, and so
//    does a receive from any source (its caller asks for the source rank).
//  * isCompleted()/isSuccess()/exception(): the transport's progress, polled
//    without blocking.
//    wait(timeout) with an explicit timeout blocks the host up to it and
//    raises DistBackendError if the operation has not completed (as
//    WorkNCCL's).
//  * getFuture(): a Future completed at issue with the output tensors, its
//    events on the group's hold stream after the operation's gate, as
//    WorkNCCL's (Note [vccl futures complete at issue], FutureCompletion.h):
//    then() callbacks run inline, so collectives issued in them keep program
//    order; a failure surfaces at the next synchronization.
// Errors surface on the host at wait() when the operation already failed,
// otherwise from the gate at the stream's next synchronization
// (torch.AcceleratorError naming the operation). A failed operation nobody
// waited for fails the device's next synchronization (the hold stream's gate),
// as an asynchronous CUDA error does; each failure is reported once
// (Note [A failed collective is reported once], CollectiveOp.h).
#pragma once

#include "CollectiveOp.h"

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

namespace c10d::vnpu {

class WorkVCCL : public Work {
 public:
  WorkVCCL(OpPtr op, int rank, c10::Device device, std::vector<at::Tensor> outputs,
           c10::intrusive_ptr<c10::ivalue::Future> future, bool blocking);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void blockCurrentStream() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  float getDuration() const override;
  uint64_t getSequencenumber() const override;

  const OpPtr& op() const { return op_; }

 private:
  // Enqueues the gate on the current stream of the op's device.
  void gateCurrentStream(std::chrono::milliseconds timeout);

  OpPtr op_;
  c10::Device device_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool blocking_;
};

// Enqueues on `stream` (a vnpuStream_t) a task that blocks it until `op`
// completed or `timeout` passed (0: the op's timeout plus a margin). The task
// then throws, naming the op, if it failed or timed out and no other waiter
// reported that yet (the device's pending error, raised at its next
// synchronization).
void enqueueGate(const OpPtr& op, void* stream, std::chrono::milliseconds timeout);

}  // namespace c10d::vnpu
