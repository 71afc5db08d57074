// FutureCompletion: completes the Futures of vccl operations (Work::getFuture).
//
// Note [vccl futures complete at issue]
// A vccl future completes when its operation is issued, as WorkNCCL's does:
// with the output tensors, its events recorded on the group's hold stream
// after the operation's gate (Note [vccl memory lifetime]), so whoever reads
// the outputs does so in stream order, after the operation finished. then()
// callbacks therefore run inline, on the thread that calls then(): a
// collective issued in a callback (PowerSGD's DDP hook) is issued in program
// order on every rank. (Completing when the operation finished ran callbacks
// on completion threads, racing the caller's next collective: ranks issued
// them in different orders and reduced unrelated tensors together.)
// A future completed before its operation failed cannot carry the error; the
// hold stream's gate reports it as the device's pending error, so the next
// synchronization (.item(), .cpu(), synchronize()) raises it, and every later
// collective of the group raises "failed earlier" when issued.
// One exception: under VNPU_LAUNCH_BLOCKING=1 a point-to-point operation has
// no gate (a blocking gate would deadlock a send/recv pair), so its future
// completes when the operation finished, on a completion thread (add()).
//
// Held by shared_ptr: an op may finish after its group is gone.
// Threads: add() from the issuing thread; completion threads of the process
// group run markCompleted/setError, and with them the futures' callbacks
// (Python callbacks take the GIL there; never on the progress thread or a
// stream worker, which must not wait for the GIL). CollectiveOp::finish()
// only wakes them. A thread about to run callbacks first makes sure another
// one is waiting to complete the rest (at most kMaxThreads: the depth of
// callbacks waiting for later operations). `mu_` guards pending_, stop_,
// idle_ and threads_.
#pragma once

#include "CollectiveOp.h"

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace c10d::vnpu {

class FutureCompletion : public std::enable_shared_from_this<FutureCompletion> {
 public:
  FutureCompletion();
  FutureCompletion(const FutureCompletion&) = delete;
  FutureCompletion& operator=(const FutureCompletion&) = delete;
  ~FutureCompletion();

  // Completes `future` now (Note [vccl futures complete at issue]): with
  // `outputs`, events recorded on `stream`, or with the op's error if it has
  // already failed.
  static void completeAtIssue(const OpPtr& op, const c10::intrusive_ptr<c10::ivalue::Future>& future,
                              const std::vector<at::Tensor>& outputs, c10::Stream stream);
  // Completes `future` with `outputs` (events on `stream`) once `op` finished,
  // or with its error. An op that already finished completes in this call.
  void add(const OpPtr& op, c10::intrusive_ptr<c10::ivalue::Future> future, std::vector<at::Tensor> outputs,
           c10::Stream stream);
  // Completes every pending future with `reason` and joins the threads.
  void stop(const std::string& reason);
  // stop() of every live instance: at interpreter exit (Python's atexit), so that no completion thread runs a
  // Python callback or drops a tensor's Python object while the interpreter finalizes (that aborts the
  // process). Call without the GIL: the threads may be waiting for it.
  static void stopAll(const std::string& reason);

 private:
  struct Pending {
    OpPtr op;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::vector<at::Tensor> outputs;
    c10::Stream stream;
  };
  static void complete(Pending& p, const std::string& reason = std::string());
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;  // an op finished, an entry was added, or stop_
  std::list<Pending> pending_;
  bool stop_ = false;
  int idle_ = 0;                     // threads waiting for completions (not inside callbacks)
  std::vector<std::thread> threads_;
  static constexpr size_t kMaxThreads = 8;
};

}  // namespace c10d::vnpu
