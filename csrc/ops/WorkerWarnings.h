// Kernel warnings raised on stream workers, re-issued on the host.
//
// Note [Worker warnings]
// ATen's CPU kernels warn with TORCH_WARN (e.g. "An output ... was resized").
// c10 hands a warning to the calling thread's WarningHandler; on a thread
// running Python bindings that is torch's PyWarningHandler, which turns it
// into a Python warning (so `warnings` filters, `pytest.warns` and
// warnings-as-errors apply). A stream worker has no such handler, so c10
// would print the warning to stderr. Workers instead queue their warnings
// and the host re-issues them at its next vnpu op, D2H copy or
// torch.vnpu.synchronize(): the warning appears once, in Python, attributed
// to that later line (the kernel itself ran asynchronously).
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

namespace at::vnpu {

// Makes the calling (worker) thread queue its c10 warnings. Idempotent.
void capture_warnings_on_this_thread();

// Holds the warnings of a kernel attempt that may be retried (e.g. an out=
// kernel that fails and reruns another way): commit() passes them on to the
// thread's previous handler, otherwise they are dropped with the attempt.
class AttemptWarnings final : public c10::WarningHandler {
 public:
  AttemptWarnings();
  ~AttemptWarnings() override;
  void process(const c10::Warning& w) override { held_.push_back(w); }
  void commit();

 private:
  c10::WarningHandler* prev_;
  std::vector<c10::Warning> held_;
};

// Re-issues queued worker warnings through c10::warn on the calling thread.
// Cheap (one atomic load) when nothing is queued.
void flush_worker_warnings();

// Removes and returns queued worker warnings as (message, is_deprecation)
// for Python's warnings.warn (used by torch.vnpu.synchronize()).
std::vector<std::pair<std::string, bool>> take_worker_warnings();

}  // namespace at::vnpu
