// FutureCompletion: completes the Futures of vccl operations (Work::getFuture)
// once the operations have finished: with the output tensors, or with the
// operation's error.
//
// Note [vccl futures carry the outcome]
// A Future completed at issue time (stream-ordered, as WorkNCCL's) would hand
// its consumer the output tensors even when the collective then failed: DDP's
// reducer and comm hooks' then() would read the *un-reduced* gradients and
// training would go on as if they had been averaged. So a vccl future
// completes only when its operation did: `wait()` blocks the host until then
// and raises the operation's DistBackendError if it failed (a dead peer, a
// timeout), and then() callbacks see that exception. A successful future's
// events are recorded on the group's hold stream (Note [vccl memory
// lifetime]), which is ordered after the operation.
//
// Held by shared_ptr: an op may finish after its group is gone.
// Threads: add() from the issuing thread; completion threads of the process
// group run markCompleted/setError, and with them the futures' callbacks
// (Python callbacks take the GIL there; never on the progress thread or a
// stream worker, which must not wait for the GIL). CollectiveOp::finish()
// only wakes them. A callback may wait for another collective of the group
// (PowerSGD's hook: all_reduce(...).get_future().wait() inside then()), so a
// thread about to run callbacks first makes sure another one is waiting to
// complete the rest (at most kMaxThreads: the depth of such nesting). `mu_`
// guards pending_, stop_, idle_ and threads_.
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
