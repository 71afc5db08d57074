// ProgressEngine: the thread that drives a ProcessGroupVCCL's transport.
//
// Ops are started strictly in issue order (every rank issues a group's ops in
// the same order, which is what lets the transports match them up). The
// engine waits until the head op is ready (its issuing stream ran the work
// queued before it), then hands it to the transport. Transfers never run on a
// stream worker: a blocking send there would stall every later task of that
// stream, including the one the peer's matching receive waits for.
//
// Failures: an op that fails fatally (peer gone, timeout, transport error)
// poisons the engine; every later op fails at once with a message naming the
// first failure (the ranks no longer agree on what ran). Non-fatal failures
// (argument mismatches found before data moved) only fail their op.
//
// Threads: submit() from any thread; one progress thread; `mu_` guards
// queue_, busy_, stop_, poison_.
#pragma once

#include "Transport.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace c10d::vnpu {

class ProgressEngine {
 public:
  explicit ProgressEngine(std::string group_name);
  ~ProgressEngine();
  // Starts the thread; `transport` must outlive the engine's thread (shutdown()).
  void start(std::shared_ptr<Transport> transport);
  void submit(OpPtr op);
  // Waits up to `limit` for every op issued so far to complete (as a graceful
  // shutdown of Gloo or NCCL does: peers still need this rank for them).
  void drain(std::chrono::milliseconds limit);
  // Fails queued ops with `reason`, stops the transport and joins the thread.
  void shutdown(const std::string& reason);
  // Marks the group unusable (first reason wins); later ops fail at once.
  void poison(const std::string& reason);
  // The first fatal failure, or "".
  std::string poisoned();

 private:
  void loop();
  void run(const OpPtr& op);

  std::string group_name_;
  std::shared_ptr<Transport> transport_;
  std::mutex mu_;
  std::condition_variable cv_;       // queue_ grew, or stop_
  std::condition_variable idle_cv_;  // the engine went idle (queue_ empty, !busy_)
  std::deque<OpPtr> queue_;
  bool busy_ = false;                // an op is in the transport's start()
  bool stop_ = false;
  std::string poison_;
  std::thread thread_;
};

}  // namespace c10d::vnpu
