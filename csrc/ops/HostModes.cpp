#include "HostModes.h"

#include <ATen/Context.h>

#include <atomic>

namespace at::vnpu {
namespace {

std::atomic<int> g_flush_denormal{0};  // 0 off, 1 on: torch.set_flush_denormal as of the last drain

}  // namespace

void set_worker_flush_denormal(bool on) { g_flush_denormal.store(on ? 1 : 0, std::memory_order_relaxed); }

void apply_host_modes_on_worker() {
  thread_local int applied = 0;  // a new thread starts with denormals kept, as the host does
  const int want = g_flush_denormal.load(std::memory_order_relaxed);
  if (want != applied) {
    at::globalContext().setFlushDenormal(want == 1);
    applied = want;
  }
}

}  // namespace at::vnpu
