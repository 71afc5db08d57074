// GlooTransport: runs CollectiveOps with a ProcessGroupGloo on CPU tensors
// that alias vnpu device memory (zero-copy: vnpu memory is host-addressable).
//
// The ProcessGroupGloo is built in Python (the torch wheel ships no Gloo
// headers) and held through its c10d::Backend interface. Gloo has no
// PREMUL_SUM, no AVG on integers and no 16-bit, unsigned (but uint8) or fp8
// dtypes, so the transport adapts (Note [Gloo dtype adaptation]):
//  * non-reducing ops (broadcast, gathers, scatters, all-to-all, send/recv)
//    move bytes (uint8 views of the same memory): every dtype works;
//  * reductions in a dtype Gloo lacks run on a staging copy of a wider dtype
//    (int16/uint16/uint32/uint64 -> int64, float8 -> float32), rounded back
//    once; complex tensors reduce as real views;
//  * PREMUL_SUM scales (a copy of) the input and sums; AVG sums and divides
//    (integers truncate, as NCCL's ncclAvg).
// Point-to-point transfers are posted on the progress thread and awaited on a
// waiter thread each, so a send never blocks the ops behind it (the peer may
// need one of them before it posts the matching receive).
#pragma once

#include "Transport.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace c10d::vnpu {

class GlooTransport final : public Transport {
 public:
  // `on_fatal` is called (from a waiter thread) when a point-to-point
  // transfer fails, so the engine can stop trusting the group.
  GlooTransport(c10::intrusive_ptr<Backend> gloo, int rank, int world, bool check_args,
                std::function<void(const std::string&)> on_fatal);
  ~GlooTransport() override;
  const char* name() const override { return "gloo"; }
  void start(const OpPtr& op) override;
  void drain(Clock::time_point deadline) override;
  void shutdown(const std::string& reason) override;

 private:
  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void check(const CollectiveOp& op);
  void runCollective(CollectiveOp& op);
  c10::intrusive_ptr<Work> post(const CollectiveOp& op);
  void waitLater(OpPtr op, std::vector<c10::intrusive_ptr<Work>> works);

  c10::intrusive_ptr<Backend> gloo_;
  const int rank_, world_;
  const bool check_args_;
  std::function<void(const std::string&)> on_fatal_;
  std::mutex mu_;                                  // guards waiters_, pending_, stopped_
  std::vector<Waiter> waiters_;
  std::vector<c10::intrusive_ptr<Work>> pending_;  // posted transfers (aborted at shutdown)
  bool stopped_ = false;
};

}  // namespace c10d::vnpu
