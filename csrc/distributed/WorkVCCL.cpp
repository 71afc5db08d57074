#include "WorkVCCL.h"

#include "../core/VNPUException.h"
#include "../core/VNPUStream.h"

#include <c10/util/Exception.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/StringUtil.h>

#include <thread>

namespace c10d::vnpu {
namespace {

// A gate waits a little longer than the op's own timeout, so the transport's
// error (which names the cause) normally arrives first.
constexpr std::chrono::milliseconds kGateSlack{10000};
// How long a waiter that did not claim a failure's report waits for the claimer to post it (the claimer's next
// task, normally microseconds; bounded so that no stream can hang on it).
constexpr std::chrono::milliseconds kReportPostWait{10000};

std::exception_ptr errorOf(const std::string& msg) {
  return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
}

// Work.wait() raises a failure on the host; when a gate already claimed the
// report (Note [A failed collective is reported once]), its exception is, or is
// about to become, the device's pending error: take it, so the next
// synchronization does not raise the same failure again.
void takeGateReport(CollectiveOp& op) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, op.device));
  const std::string error = op.error();
  op.waitReportPosted(kReportPostWait);
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  while (Clock::now() < deadline) {
    if (vnpuPeekAtLastError() != vnpuSuccess) {
      if (std::string(vnpuGetLastErrorString()).find(error) != std::string::npos) (void)vnpuGetLastError();
      return;  // another failure stays pending: the first one is what the device reports
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

void enqueueGate(const OpPtr& op, void* stream, std::chrono::milliseconds timeout) {
  // Orders `stream` after the op's declared accesses for the sanitizer; no
  // real wait: the collective cannot finish before its ready task ran.
  if (op->declared) VNPU_CHECK(vnpuStreamWaitEvent(static_cast<vnpuStream_t>(stream), op->declared));
  if (op->state() == CollectiveOp::State::kDone) return;  // nothing left to wait for
  std::chrono::milliseconds limit = timeout.count() > 0 ? timeout : op->timeout + kGateSlack;
  std::string name = c10::str("vccl:", op->name);
  auto claimed = std::make_shared<std::atomic<bool>>(false);
  VNPU_CHECK(vnpuLaunchKernel(static_cast<vnpuStream_t>(stream), name.c_str(), [op, limit, claimed] {
    const bool done = op->waitDone(limit);
    if (done && op->state() != CollectiveOp::State::kFailed) return;
    if (op->claimReport()) {
      claimed->store(true);  // the runtime posts the error when this task ends; the task after it says so
      if (!done) {
        throw std::runtime_error(c10::str(
            "vccl: ", describe(*op), " did not complete within ", limit.count(),
            " ms; a peer may have died, be stuck, or not call this collective"));
      }
      throw std::runtime_error(op->error());
    }
    // Another waiter reports it: what this stream runs next must not finish before that report is visible.
    op->waitReportPosted(kReportPostWait);
  }));
  VNPU_CHECK(vnpuLaunchKernel(static_cast<vnpuStream_t>(stream), name.c_str(), [op, claimed] {
    if (claimed->load()) op->markReportPosted();
  }));
}

WorkVCCL::WorkVCCL(OpPtr op, int rank, c10::Device device, std::vector<at::Tensor> outputs,
                   c10::intrusive_ptr<c10::ivalue::Future> future, bool blocking)
    : Work(rank, op->type, nullptr), op_(std::move(op)), device_(device), outputs_(std::move(outputs)),
      future_(std::move(future)), blocking_(blocking) {}

bool WorkVCCL::isCompleted() { return op_->completed(); }

bool WorkVCCL::isSuccess() const { return op_->state() == CollectiveOp::State::kDone; }

std::exception_ptr WorkVCCL::exception() const {
  if (op_->state() != CollectiveOp::State::kFailed) return nullptr;
  return errorOf(op_->error());
}

int WorkVCCL::sourceRank() const {
  op_->waitDone(op_->timeout);
  int r = op_->sourceRank();
  TORCH_CHECK(r >= 0, "vccl: sourceRank() is only available for a completed recv from any source");
  return r;
}

std::vector<at::Tensor> WorkVCCL::result() { return outputs_; }

void WorkVCCL::gateCurrentStream(std::chrono::milliseconds timeout) {
  auto stream = c10::vnpu::getCurrentVNPUStream(device_.index());
  enqueueGate(op_, stream.stream(), timeout);
}

void WorkVCCL::synchronize() { gateCurrentStream(kNoTimeout); }

void WorkVCCL::blockCurrentStream() { gateCurrentStream(kNoTimeout); }

bool WorkVCCL::wait(std::chrono::milliseconds timeout) {
  if (timeout != kNoTimeout && timeout.count() > 0 && !blocking_) {
    // An explicit timeout blocks the host, as WorkNCCL::wait(timeout) does,
    // and raises in this call when the op did not complete in time.
    if (!op_->waitDone(timeout)) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("vccl: ", describe(*op_), " on rank ", rank_, " did not complete within the wait "
                               "timeout of ", timeout.count(), " ms; a peer may have died, be stuck, or not call "
                               "this collective"));
    }
  }
  if (blocking_) {
    // Host-blocking (barrier, as ProcessGroupNCCL's): also waits for the op's stream work.
    std::chrono::milliseconds limit = timeout.count() > 0 ? timeout : op_->timeout + kGateSlack;
    if (!op_->waitDone(limit)) {
      C10_THROW_ERROR(DistBackendError,
                      c10::str("vccl: ", describe(*op_), " timed out after ", limit.count(),
                               " ms on rank ", rank_, "; a peer may have died or not reached it"));
    }
  }
  if (op_->state() == CollectiveOp::State::kFailed) {
    if (op_->claimReport()) {
      op_->markReportPosted();  // raised here and now
    } else {
      takeGateReport(*op_);
    }
    C10_THROW_ERROR(DistBackendError, op_->error());
  }
  gateCurrentStream(timeout);
  return true;
}

void WorkVCCL::abort() {
  op_->finish(c10::str("vccl: ", describe(*op_), " was aborted"));
}

c10::intrusive_ptr<c10::ivalue::Future> WorkVCCL::getFuture() { return future_; }

float WorkVCCL::getDuration() const { return op_->durationMs(); }

uint64_t WorkVCCL::getSequencenumber() const { return op_->seq; }

}  // namespace c10d::vnpu
