// Streams: in-order task queues, each drained by its own worker thread; kernel launches.
#include "internal.h"

#include <algorithm>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>

namespace vnpu::rt {
namespace {

std::atomic<void (*)()> g_idle_hook{nullptr};
std::atomic<unsigned> g_idle_linger_us{0};
std::atomic<WaitHook> g_wait_hook{nullptr};
std::atomic<unsigned> g_wait_slice_us{0};
std::mutex g_blocking_hooks_mu;  // guards g_blocking_hooks (set once at start-up; read per blocking wait)
BlockingWaitHooks g_blocking_hooks;

// Note [Worker spin]
// Waking a blocked worker costs the submitting thread a futex syscall and the
// worker a scheduler wake-up (several µs each in a VM, where the wake-up is an
// inter-processor interrupt). Eager Python loops submit a task every few µs,
// so a worker that blocks after each task makes every launch pay that. After a
// task, the worker polls for the next one for a short while (as CUDA's default
// schedule spins when there are CPUs to spare), and submit() notifies only a
// worker that really blocks. VNPU_WORKER_SPIN_US overrides the window (0: block
// at once). The poll yields the CPU (sched_yield) instead of busy-waiting: on a
// machine with as many cores as busy threads (the Python thread, this worker,
// its OpenMP helpers), a host thread that has work gets the core back at once,
// and the worker still sees the next task without a wake-up. Measured on the
// decode loop of benchmarks/hf_step.py (docs/benchmarks.md).
std::chrono::microseconds worker_spin() {
  static const std::chrono::microseconds us = [] {
    const char* v = std::getenv("VNPU_WORKER_SPIN_US");
    if (v == nullptr || *v == '\0') return std::chrono::microseconds(50);
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    return std::chrono::microseconds(end != v && n >= 0 ? n : 50);
  }();
  return us;
}

void spin_for_work(const vnpuStream_st& s, uint64_t popped, std::chrono::microseconds spin) {
  if (spin.count() == 0) return;
  const auto until = std::chrono::steady_clock::now() + spin;
  for (unsigned i = 1;; ++i) {
    if (s.submitted_hint.load(std::memory_order_acquire) != popped) return;
    sched_yield();
    if ((i & 7) == 0 && std::chrono::steady_clock::now() >= until) return;
  }
}

void run_worker(vnpuStream_st* s) {
  char name[16];
  std::snprintf(name, sizeof(name), "vnpu%d-s%p", s->device, static_cast<void*>(s));
  pthread_setname_np(pthread_self(), name);
  current_device() = s->device;
  if (san::on()) san::grant_worker();  // Note [Protection keys] (host_access.cpp)
  bool ran_since_idle = false;
  uint64_t popped = 0;
  const auto spin = worker_spin();
  for (;;) {
    vnpuStream_st::Task task;
    if (ran_since_idle) spin_for_work(*s, popped, spin);
    {
      std::unique_lock<std::mutex> lk(s->mu);
      auto has_work = [&] { return !s->queue.empty(); };
      if (!has_work()) {
        s->worker_waiting = true;
        auto hook = g_idle_hook.load();
        if (hook && ran_since_idle &&
            !s->cv_work.wait_for(lk, std::chrono::microseconds(g_idle_linger_us.load()), has_work)) {
          lk.unlock();
          hook();
          ran_since_idle = false;
          lk.lock();
        }
        s->cv_work.wait(lk, has_work);
        s->worker_waiting = false;
      }
      task = std::move(s->queue.front());
      s->queue.pop_front();
      ++popped;
    }
    if (!task.fn) return;  // shutdown marker from vnpuStreamDestroy
    ran_since_idle = true;
    const int64_t start_ns = task.record ? activity_now_ns() : 0;
    bool failed = true;
    busy_begin(s->device, task.kind);
    try {
      task.fn();
      failed = false;
    } catch (const std::exception& e) {
      record_device_error(s->device, vnpuErrorLaunchFailure,
                          std::string("vNPU kernel '") + task.name + "' failed on vnpu:" +
                              std::to_string(s->device) + ": " + e.what());
    } catch (...) {
      record_device_error(s->device, vnpuErrorLaunchFailure,
                          std::string("vNPU kernel '") + task.name + "' failed on vnpu:" +
                              std::to_string(s->device) + " with an unknown exception");
    }
    busy_end(s->device, task.kind);
    // Before the task counts as complete, so a synchronize sees its record.
    if (task.record) add_activity(s, task, start_ns, activity_now_ns(), failed);
    bool wake;
    {
      std::lock_guard<std::mutex> lk(s->mu);
      ++s->completed;
      if (task.on_complete) task.on_complete();  // lock order: stream, then event
      wake = s->completed >= s->wake_at;  // Note [Completion wake-ups] (internal.h)
      if (wake) s->wake_at = UINT64_MAX;
    }
    if (wake) s->cv_done.notify_all();
  }
}

}  // namespace

WaitHook wait_hook() { return g_wait_hook.load(); }
BlockingWaitHooks blocking_wait_hooks() {
  std::lock_guard<std::mutex> g(g_blocking_hooks_mu);
  return g_blocking_hooks;
}

vnpuError_t finish_submission(vnpuStream_st* s, vnpuStream_st::Submitted submitted) {
  if (submitted == vnpuStream_st::Dropped) {
    auto c = capture_of(s);
    set_last_error_message("the stream's graph capture was invalidated by an earlier call; nothing more is "
                           "recorded. That call: " + (c ? c->invalidated_by : std::string("(capture ended)")));
    return vnpuErrorStreamCaptureInvalidated;
  }
  if (submitted == vnpuStream_st::Queued && launch_blocking()) {
    if (!s->wait_idle(/*interruptible=*/true, /*orders_host=*/false)) return vnpuErrorInterrupted;  // the kernel still runs
    return take_device_error(s->device);
  }
  return vnpuSuccess;
}
std::chrono::microseconds wait_slice() { return std::chrono::microseconds(g_wait_slice_us.load()); }

vnpuStream_st* resolve(vnpuStream_t s) {
  if (s != nullptr) return s;
  int dev = current_device();
  return valid_device(dev) ? devices()[dev]->default_stream : nullptr;
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuStream_st::Submitted vnpuStream_st::submit(const char* name, vnpuKernel_t fn,
                                               std::function<void()> on_complete,
                                               const vnpu::rt::TaskInfo& info) {
  if (any_capture()) {  // See Note [Stream capture] (graph.cpp)
    std::lock_guard<std::mutex> lk(mu);
    if (capture) {
      if (capture->invalidated) return Dropped;
      std::lock_guard<std::mutex> g(capture->nodes_mu);
      capture->nodes.emplace_back(name, std::move(fn));
      capture->last_node[this] = capture->nodes.size();
      return Recorded;
    }
  }
  Task task{vnpu::rt::intern_task_name(name), std::move(fn), std::move(on_complete)};
  task.kind = info.kind;  // also without activity records: Note [Busy time] (utilization.cpp)
  bool notify = false;
  if (recording()) {  // Note [Activity records]
    task.bytes = info.bytes;
    task.copy_kind = info.copy_kind;
    task.host_pinned = info.host_pinned;
    task.src_device = info.src_device;
    task.dst_device = info.dst_device;
    task.record = true;
    task.correlation_id = current_correlation_id();
    task.host_thread = host_thread_id();
    task.queued_ns = activity_now_ns();
    activity_submitted();  // before the worker can see the task
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!worker_started) {
      worker_started = true;
      std::thread(run_worker, this).detach();
    }
    queue.push_back(std::move(task));
    ++submitted;
    submitted_hint.store(submitted, std::memory_order_release);
    notify = worker_waiting;
  }
  if (notify) cv_work.notify_one();
  return Queued;
}

// Note [Launch blocking and the sanitizer]
// VNPU_LAUNCH_BLOCKING waits after every launch, so counted as host waits these
// would order every stream after everything before (the host is ordered after
// each stream, and later launches after the host): no race could be reported.
// The sanitizer checks the program's own ordering, so these waits order nothing.
// Deferred host copies are still released (their wait would never end).
bool vnpuStream_st::wait_idle(bool interruptible, bool orders_host) {
  bool done;
  if (san::on()) san::release_stream(this);  // Note [Deferred host copies]
  {
    std::unique_lock<std::mutex> lk(mu);
    uint64_t target = submitted;
    done = wait_interruptible(lk, cv_done, [&] { return completed_or_wake_at(target); }, interruptible);
  }
  if (done && orders_host && san::on()) san::host_waited_stream(this);  // Note [Sanitizer clocks]
  return done;
}

bool vnpuStream_st::idle() {
  bool done;
  if (san::on()) san::release_stream(this);
  {
    std::lock_guard<std::mutex> lk(mu);
    done = completed == submitted;
  }
  if (done && san::on()) san::host_waited_stream(this);
  return done;
}

vnpuError_t vnpuSetWorkerIdleHook(void (*fn)(), unsigned linger_us) {
  g_idle_linger_us.store(linger_us);
  g_idle_hook.store(fn);
  return vnpuSuccess;
}

vnpuError_t vnpuSetWaitInterruptHook(int (*fn)(), unsigned slice_us) {
  if (fn != nullptr && slice_us == 0) return vnpuErrorInvalidValue;
  g_wait_slice_us.store(slice_us);
  g_wait_hook.store(fn);
  return vnpuSuccess;
}

vnpuError_t vnpuSetBlockingWaitHooks(void* (*enter)(), void (*leave)(void*)) {
  if ((enter == nullptr) != (leave == nullptr)) return vnpuErrorInvalidValue;
  std::lock_guard<std::mutex> g(g_blocking_hooks_mu);
  g_blocking_hooks = {enter, leave};
  return vnpuSuccess;
}

vnpuError_t vnpuDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least == nullptr || greatest == nullptr) return vnpuErrorInvalidValue;
  *least = 0;
  *greatest = -1;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamCreate(vnpuStream_t* stream) {
  return vnpuStreamCreateWithPriority(stream, 0, 0);
}

vnpuError_t vnpuStreamCreateWithPriority(vnpuStream_t* stream, unsigned /*flags*/, int priority) {
  if (stream == nullptr) return vnpuErrorInvalidValue;
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  int dev = current_device();
  if (!valid_device(dev)) return vnpuErrorInvalidDevice;
  auto* s = new vnpuStream_st();
  s->device = dev;
  s->priority = priority < -1 ? -1 : (priority > 0 ? 0 : priority);  // clamp like CUDA
  Device* d = devices()[dev];
  std::lock_guard<std::mutex> g(d->streams_mu);
  d->streams.push_back(s);
  *stream = s;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamDestroy(vnpuStream_t stream) {
  if (stream == nullptr || stream->is_default) return vnpuErrorInvalidResourceHandle;
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;  // waiting for pending work would hang
  if (capture_of(stream)) {
    set_last_error_message("vnpuStreamDestroy: the stream is capturing; end the capture first");
    return vnpuErrorIllegalState;
  }
  Device* d = devices()[stream->device];
  {
    std::lock_guard<std::mutex> g(d->streams_mu);
    auto& v = d->streams;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (*it == stream) {
        v.erase(it);
        break;
      }
    }
  }
  // CUDA lets pending work finish; the worker exits at the marker. The stream
  // object itself is kept (a few bytes) because the detached worker may still
  // be touching it while it wakes up.
  stream->wait_idle();
  {
    std::lock_guard<std::mutex> lk(stream->mu);
    if (stream->worker_started) stream->queue.push_back(vnpuStream_st::Task{"", nullptr, nullptr});
  }
  stream->cv_work.notify_one();
  return vnpuSuccess;
}

vnpuError_t vnpuStreamGetPriority(vnpuStream_t stream, int* priority) {
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr || priority == nullptr) return vnpuErrorInvalidValue;
  *priority = s->priority;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamGetDevice(vnpuStream_t stream, int* device) {
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr || device == nullptr) return vnpuErrorInvalidValue;
  *device = s->device;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamCheckHandle(vnpuStream_t stream, int* device) {
  if (device == nullptr) return vnpuErrorInvalidValue;
  if (stream == nullptr) return vnpuErrorInvalidResourceHandle;
  for (Device* d : devices()) {
    std::lock_guard<std::mutex> g(d->streams_mu);
    if (stream == d->default_stream || std::find(d->streams.begin(), d->streams.end(), stream) != d->streams.end()) {
      *device = d->index;
      return vnpuSuccess;
    }
  }
  return vnpuErrorInvalidResourceHandle;
}

vnpuError_t vnpuGetDefaultStream(int device, vnpuStream_t* stream) {
  if (stream == nullptr) return vnpuErrorInvalidValue;
  if (!valid_device(device)) return vnpuErrorInvalidDevice;
  *stream = devices()[device]->default_stream;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamSynchronize(vnpuStream_t stream) {
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (auto c = capture_of(s)) {
    return refuse_on_capture(*c, vnpuErrorStreamCaptureUnsupported,
                             "vnpuStreamSynchronize of the capturing stream (a host synchronization: "
                             "torch.vnpu.synchronize(), Stream/Event.synchronize(), .item(), .cpu(), .tolist(), "
                             "printing a tensor, or an op whose output shape depends on the data, such as "
                             "nonzero or boolean-mask indexing); move it before the capture begins or after "
                             "it ends");
  }
  if (!s->wait_idle(/*interruptible=*/true)) return vnpuErrorInterrupted;
  if (san::on()) {
    san::host_waited();
    if (vnpuError_t e = san::report_host_access(s, "vnpuStreamSynchronize"); e != vnpuSuccess) return e;
  }
  return take_device_error(s->device);
}

vnpuError_t vnpuStreamQuery(vnpuStream_t stream) {
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (auto c = capture_of(s)) {
    return refuse_on_capture(*c, vnpuErrorStreamCaptureUnsupported,
                             "vnpuStreamQuery of the capturing stream (Stream.query(); query it after the "
                             "capture ends)");
  }
  return s->idle() ? vnpuSuccess : vnpuErrorNotReady;
}

vnpuError_t vnpuLaunchKernel(vnpuStream_t stream, const char* name, vnpuKernel_t kernel) {
  return vnpuLaunchKernelWithAccesses(stream, name, std::move(kernel), nullptr, 0);
}

vnpuError_t vnpuLaunchKernelWithAccesses(vnpuStream_t stream, const char* name, vnpuKernel_t kernel,
                                         const vnpuMemAccess* accesses, size_t count) {
  if (!kernel || (count > 0 && accesses == nullptr)) return vnpuErrorInvalidValue;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (san::on()) {
    if (vnpuError_t e = san::report_host_access(s, name); e != vnpuSuccess) return e;
    if (vnpuError_t e = san::begin_task(s, name, accesses, count); e != vnpuSuccess) return e;
  }
  return finish_submission(s, s->submit(name == nullptr ? "<kernel>" : name, std::move(kernel)));
}

vnpuError_t vnpuLaunchHostFunc(vnpuStream_t stream, vnpuHostFn_t fn, void* user_data) {
  if (fn == nullptr) return vnpuErrorInvalidValue;
  return vnpuLaunchKernel(stream, "host function", [fn, user_data] { fn(user_data); });
}
