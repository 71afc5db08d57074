// Activity records: what each stream task was and when it ran, for profilers.
//
// Note [Activity records]
// Recording must cost nothing when no profiler is on: a submission reads one
// relaxed atomic (recording()) and, only when it is on, stamps the task with
// its kind, the launching thread's correlation id and the submission time.
// The worker checks the task's own flag (no atomic), takes the clock around
// the task and appends a record under g_mu. Records live in one list in the
// order tasks ended; vnpuActivityFlushAll moves them out.
// g_pending counts tasks submitted while recording that have not left their
// record yet, on every device: vnpuActivitySynchronize waits for it to reach
// 0, so a profiler that stops gets the tasks of every device, not only those
// of the device its host synchronized.
#include "internal.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace vnpu::rt {

std::atomic<bool> g_activity_on{false};

namespace {

std::mutex g_mu;  // guards g_records, g_pending
std::condition_variable g_cv;  // notified when g_pending reaches 0
std::vector<vnpuActivityRecord> g_records;
int64_t g_pending = 0;
thread_local std::vector<uint64_t> t_correlation;

}  // namespace

void activity_submitted() {
  std::lock_guard<std::mutex> g(g_mu);
  ++g_pending;
}

uint64_t current_correlation_id() { return t_correlation.empty() ? 0 : t_correlation.back(); }

uint64_t host_thread_id() {
  thread_local const uint64_t tid = static_cast<uint64_t>(::syscall(SYS_gettid));
  return tid;
}

int64_t activity_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void add_activity(vnpuStream_st* s, vnpuStream_st::Task& task, int64_t start_ns, int64_t end_ns, bool failed) {
  vnpuActivityRecord r{task.kind, std::string(task.name), s->device, s, task.queued_ns, start_ns, end_ns,
                       task.bytes, task.copy_kind, task.host_pinned ? 1 : 0, task.src_device, task.dst_device,
                       task.correlation_id, task.host_thread, failed ? 1 : 0};
  std::lock_guard<std::mutex> g(g_mu);
  g_records.push_back(std::move(r));
  if (--g_pending == 0) g_cv.notify_all();
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuError_t vnpuActivityEnable(int enable) {
  if (enable) {
    std::lock_guard<std::mutex> g(g_mu);
    g_records.clear();
  }
  g_activity_on.store(enable != 0);
  return vnpuSuccess;
}

int vnpuActivityIsEnabled() { return g_activity_on.load() ? 1 : 0; }

vnpuError_t vnpuActivityPushExternalCorrelationId(uint64_t id) {
  t_correlation.push_back(id);
  return vnpuSuccess;
}

vnpuError_t vnpuActivityPopExternalCorrelationId(uint64_t* id) {
  if (t_correlation.empty()) return vnpuErrorInvalidValue;
  if (id != nullptr) *id = t_correlation.back();
  t_correlation.pop_back();
  return vnpuSuccess;
}

vnpuError_t vnpuActivityFlushAll(std::vector<vnpuActivityRecord>* records) {
  if (records == nullptr) return vnpuErrorInvalidValue;
  std::vector<vnpuActivityRecord> taken;
  {
    std::lock_guard<std::mutex> g(g_mu);
    taken.swap(g_records);
  }
  if (records->empty()) {
    records->swap(taken);
  } else {
    records->insert(records->end(), std::make_move_iterator(taken.begin()), std::make_move_iterator(taken.end()));
  }
  return vnpuSuccess;
}

vnpuError_t vnpuActivitySynchronize(int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  auto done = [] { return g_pending <= 0; };
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (done()) return vnpuSuccess;
  }
  // As a stream wait (Note [Interruptible waits]): the layer above may release
  // the GIL (a Python kernel on a worker needs it), and the wait-interrupt hook
  // runs between slices with g_mu not held.
  const BlockingWaitHooks hooks = blocking_wait_hooks();
  void* token = hooks.enter != nullptr ? hooks.enter() : nullptr;
  vnpuError_t result = vnpuErrorNotReady;
  {
    std::unique_lock<std::mutex> lk(g_mu);
    for (;;) {
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      if (timeout_ms >= 0 && until > deadline) until = deadline;
      if (g_cv.wait_until(lk, until, done)) {
        result = vnpuSuccess;
        break;
      }
      if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) break;
      if (WaitHook hook = wait_hook()) {
        lk.unlock();
        const bool stop = hook() != 0;
        lk.lock();
        if (stop) {
          result = done() ? vnpuSuccess : vnpuErrorInterrupted;
          break;
        }
      }
    }
  }
  if (hooks.leave != nullptr) hooks.leave(token);
  return result;
}

vnpuError_t vnpuActivityGetTimestamp(int64_t* ns) {
  if (ns == nullptr) return vnpuErrorInvalidValue;
  *ns = activity_now_ns();
  return vnpuSuccess;
}
