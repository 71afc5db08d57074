// Transport: moves the bytes of CollectiveOps between the ranks of a group.
//
// A transport is driven by one ProgressEngine thread, one op at a time, in
// issue order (the order every rank issues them in). Implementations:
//  * GlooTransport: Gloo over TCP on CPU aliases of device memory (any host);
//  * ShmTransport: shared memory between processes of one host.
#pragma once

#include "CollectiveOp.h"

#include <stdexcept>
#include <string>

namespace c10d::vnpu {

// A failed op. `fatal`: the ranks may now disagree about what ran (a peer
// died, a timeout, a transport error), so no later op of the group can be
// trusted; non-fatal errors (argument mismatches found before any payload
// moved) leave the group usable.
class TransportError : public std::runtime_error {
 public:
  TransportError(const std::string& what, bool fatal) : std::runtime_error(what), fatal_(fatal) {}
  bool fatal() const { return fatal_; }

 private:
  bool fatal_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Runs `op`, whose inputs are ready (the issuing stream reached it). Called
  // on the progress thread. Collectives and barriers complete before start()
  // returns; point-to-point transfers (and batches holding them) may complete
  // later. Either way the transport calls op->finish(), also on failure, or
  // throws TransportError (then the engine fails the op).
  virtual void start(const OpPtr& op) = 0;
  // Waits (until `deadline`) for transfers still in flight to complete.
  virtual void drain(Clock::time_point deadline) {}
  // Fails pending transfers with `reason` and stops helper threads. Idempotent.
  virtual void shutdown(const std::string& reason) = 0;
};

}  // namespace c10d::vnpu
