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
// need one of them before it posts the matching receive); each carries a small
// header so that mismatched sizes fail clearly (Note [Point-to-point size check]).
#pragma once

#include "Transport.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <condition_variable>
#include <functional>
#include <map>
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
  // Receives on one (peer, tag) take turns; see Note [Point-to-point size check].
  struct RecvSlot {
    std::mutex mu;  // guards serving
    std::condition_variable cv;
    uint64_t next = 0;     // tickets handed out (under GlooTransport::mu_)
    uint64_t serving = 0;  // ticket allowed to post its receives
  };
  static bool isP2P(OpType t);
  void check(const CollectiveOp& op);
  void runCollective(CollectiveOp& op);
  void startP2P(const OpPtr& op);
  // Runs `fn` on a waiter thread (joined at shutdown).
  void spawn(std::function<void()> fn);
  // Adds/removes a posted Gloo work (aborted at shutdown).
  void track(const c10::intrusive_ptr<Work>& w, bool add);

  c10::intrusive_ptr<Backend> gloo_;
  const int rank_, world_;
  const bool check_args_;
  std::function<void(const std::string&)> on_fatal_;
  std::mutex mu_;                                  // guards waiters_, pending_, stopped_, slots_
  std::vector<Waiter> waiters_;
  std::map<std::pair<int, int>, std::shared_ptr<RecvSlot>> slots_;  // (peer or -1 for any, tag)
  std::vector<c10::intrusive_ptr<Work>> pending_;  // posted transfers (aborted at shutdown)
  bool stopped_ = false;
};

}  // namespace c10d::vnpu
