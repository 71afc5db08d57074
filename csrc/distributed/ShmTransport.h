// ShmTransport: collectives between the processes of one host through shared
// memory, with no copy in or out: every rank maps its peers' vnpu device
// memory (vnpuIpc*, the runtime's CUDA IPC) and reads or writes their tensors
// in place, as NCCL does over NVLink/P2P. Point-to-point transfers and
// monitored barriers go to the Gloo transport.
//
// Note [Shared-memory collective protocol]
// Each rank owns a small control segment (ShmSegment) that only it writes and
// every peer maps: a `posted` and a `done` word (futex-waitable) and a
// descriptor (the op's fingerprint, this rank's tensor addresses, device and
// PREMUL_SUM factor). For collective number k, every rank:
//  1. writes its descriptor, then posted = k (release) and wakes waiters;
//  2. waits until every peer's posted reached k (acquire): their inputs are
//     ready and their outputs may be written;
//  3. checks all fingerprints (OpCheck; every rank reaches the same verdict);
//  4. does its share: reduce its slice of every rank's buffers into every
//     rank's outputs (all_reduce), pull peers' inputs into its own outputs
//     (all_gather, all_to_all, broadcast, scatter), ...;
//  5. sets done = k and waits until every peer's done reached k: nobody
//     returns (letting its stream reuse the buffers) while a peer may still
//     read or write them.
// A rank only publishes k+1 after step 5 of k, so descriptors are never
// overwritten while read. Waits spin briefly, then sleep on the futex; a peer
// whose process died or a deadline fails the op (fatal for the group).
//
// Threads: the ProgressEngine's thread only (plus shutdown()).
#pragma once

#include "GlooTransport.h"
#include "ShmSegment.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace c10d::vnpu {

class ShmTransport final : public Transport {
 public:
  // Sets up the transport with every rank of the group through `store`, or
  // returns nullptr (and why, in `why_not`) when the ranks are not all on this
  // host or cannot map each other's memory. All ranks reach the same answer.
  // `mode`: "auto", or "shm" (then failure throws).
  static std::shared_ptr<ShmTransport> create(const c10::intrusive_ptr<Store>& store, int rank, int world,
                                              std::chrono::milliseconds timeout, bool check_args,
                                              std::shared_ptr<GlooTransport> gloo, const std::string& mode,
                                              std::string* why_not);
  ~ShmTransport() override;
  const char* name() const override { return "shm"; }
  void start(const OpPtr& op) override;
  void drain(Clock::time_point deadline) override { gloo_->drain(deadline); }
  void shutdown(const std::string& reason) override;

  struct Ctrl;  // the control segment's layout (ShmTransport.cpp)

 private:
  ShmTransport(int rank, int world, bool check_args, std::shared_ptr<GlooTransport> gloo);
  void runCollective(CollectiveOp& op);
  // Blocks until every peer's posted (or done) word reached `seq`.
  void waitAll(bool done, uint32_t seq, const CollectiveOp& op);
  // This process's address of peer `r`'s device address `addr` on `device`
  // (maps r's memory of that device on first use).
  char* local(int r, int device, uint64_t addr);
  Ctrl* ctrl(int r) const;

  const int rank_, world_;
  const bool check_args_;
  std::shared_ptr<GlooTransport> gloo_;
  ShmSegment mine_;
  std::vector<ShmSegment> peers_;             // by rank (empty for this rank)
  std::vector<int64_t> pids_;                 // by rank
  std::vector<std::vector<int64_t>> delta_;   // [rank][device]: local - remote address (once mapped)
  std::vector<std::vector<void*>> opened_;    // [rank][device]: opened IPC mappings (closed at destruction)
  std::atomic<bool> stopped_{false};
};

}  // namespace c10d::vnpu
