// Events: markers recorded into a stream; CUDA semantics for wait/query/synchronize/elapsed time.
#include "internal.h"

#include <chrono>
#include <memory>

using namespace vnpu::rt;

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

vnpuError_t vnpuEventCreate(vnpuEvent_t* event) { return vnpuEventCreateWithFlags(event, 0); }

vnpuError_t vnpuEventCreateWithFlags(vnpuEvent_t* event, unsigned flags) {
  if (event == nullptr) return vnpuErrorInvalidValue;
  auto e = std::make_shared<vnpuEvent_st>();
  e->flags = flags;
  e->handle_ref = e;  // See Note [Event lifetime and generations] (internal.h)
  *event = e.get();
  return vnpuSuccess;
}

vnpuError_t vnpuEventDestroy(vnpuEvent_t event) {
  if (event == nullptr) return vnpuErrorInvalidResourceHandle;
  // Like cudaEventDestroy: returns at once. Queued record/wait tasks hold their
  // own reference, so the event is freed when the last of them has run. (The
  // old "wait, then delete" freed it while a vnpuStreamWaitEvent task could
  // still be blocked on its condition variable.) No device error is consumed.
  std::shared_ptr<vnpuEvent_st> last_ref = std::move(event->handle_ref);
  return vnpuSuccess;
}

vnpuError_t vnpuEventRecord(vnpuEvent_t event, vnpuStream_t stream) {
  if (event == nullptr) return vnpuErrorInvalidResourceHandle;
  // (no workers in a forked child: work would never run)
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (auto c = capture_of(s)) {
    // Recorded into the capture: a marker only (waits on it from the same
    // capture are already ordered); nothing is queued.
    if (c->invalidated) return finish_submission(s, vnpuStream_st::Dropped);
    capture_record_event(c, s, event);
    return vnpuSuccess;
  }
  if (san::on()) {  // Note [Sanitizer clocks]
    san::begin_task(s, "event record", nullptr, 0);
    san::event_recorded(event, s);
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> g(event->mu);
    gen = ++event->recorded;
    event->pending.insert(gen);
    event->captured_in.reset();
    event->captured_known.clear();
  }
  // Published in on_complete: once the event reads complete, the stream reads
  // idle up to this point too (cudaStreamQuery after cudaEventSynchronize).
  s->submit("event record", [] {}, [event = event->shared_from_this(), gen] {
    {
      std::lock_guard<std::mutex> g(event->mu);
      event->pending.erase(gen);
      if (gen > event->completed) {
        event->completed = gen;
        event->time_ns = now_ns();
      }
    }
    event->cv.notify_all();
  }, {vnpuActivityKindSync});
  return vnpuSuccess;
}

namespace {
// The live capture `event` was last recorded in, or null.
std::shared_ptr<Capture> live_capture_of(vnpuEvent_st* event) {
  if (!any_capture()) return nullptr;
  std::lock_guard<std::mutex> g(event->mu);
  auto c = event->captured_in.lock();
  return c && !c->ended ? c : nullptr;
}

vnpuError_t refuse_captured_event(Capture& c, const char* call) {
  return refuse_on_capture(c, vnpuErrorCapturedEvent,
                           std::string(call) + " of an event recorded in the capturing stream (it completes only "
                           "when the graph is replayed); query or synchronize it after the capture ends");
}
}  // namespace

vnpuError_t vnpuEventQuery(vnpuEvent_t event) {
  if (event == nullptr) return vnpuErrorInvalidResourceHandle;
  if (auto c = live_capture_of(event)) return refuse_captured_event(*c, "vnpuEventQuery");
  bool done;
  if (san::on()) san::release_event(event);  // Note [Deferred host copies]
  {
    std::lock_guard<std::mutex> g(event->mu);
    done = event->pending.count(event->recorded) == 0;
  }
  if (done && san::on()) san::host_waited_event(event);
  return done ? vnpuSuccess : vnpuErrorNotReady;
}

vnpuError_t vnpuEventSynchronize(vnpuEvent_t event) {
  if (event == nullptr) return vnpuErrorInvalidResourceHandle;
  if (vnpuIsInBadFork()) return vnpuErrorForkedAfterInit;  // a pending record would never complete
  if (auto c = live_capture_of(event)) return refuse_captured_event(*c, "vnpuEventSynchronize");
  if (san::on()) san::release_event(event);
  std::unique_lock<std::mutex> lk(event->mu);
  uint64_t target = event->recorded;  // See Note [Event lifetime and generations]
  if (!wait_interruptible(lk, event->cv, [&] { return event->pending.count(target) == 0; }))
    return vnpuErrorInterrupted;
  lk.unlock();
  if (san::on()) {
    san::host_waited_event(event);
    san::host_waited();
    if (vnpuError_t e = san::report_host_access(nullptr, "vnpuEventSynchronize"); e != vnpuSuccess) return e;
  }
  return take_device_error(current_device());
}

vnpuError_t vnpuStreamWaitEvent(vnpuStream_t stream, vnpuEvent_t event, unsigned /*flags*/) {
  if (event == nullptr) return vnpuErrorInvalidResourceHandle;
  // (no workers in a forked child: work would never run)
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (any_capture()) {  // See Note [Stream capture] and Note [Cross-stream capture] (graph.cpp)
    auto waiter = capture_of(s);
    auto recorded_in = live_capture_of(event);
    if (recorded_in) return capture_wait_event(recorded_in, s, event);  // a fork, a join, or ordered already
    if (waiter) {
      bool never_recorded;
      {
        std::lock_guard<std::mutex> g(event->mu);
        never_recorded = event->recorded == 0;
      }
      if (never_recorded) return vnpuSuccess;  // nothing to wait for, as outside a capture
      return refuse_on_capture(*waiter, vnpuErrorStreamCaptureIsolation,
                               "the capturing stream waits on an event recorded outside the capture (wait_event, "
                               "wait_stream): a replay cannot depend on work outside the graph; make the "
                               "capturing stream wait before the capture begins");
    }
  }
  if (san::on()) san::stream_waits_event(s, event);  // ordered even if already complete
  uint64_t target;
  {
    std::lock_guard<std::mutex> g(event->mu);
    target = event->recorded;  // waits for the record current at call time only
    if (event->pending.count(target) == 0) return vnpuSuccess;
  }
  if (san::on()) san::begin_task(s, "event wait", nullptr, 0);
  // The task owns a reference: the handle may be destroyed while it waits.
  s->submit("event wait", [event = event->shared_from_this(), target] {
    std::unique_lock<std::mutex> lk(event->mu);
    event->cv.wait(lk, [&] { return event->pending.count(target) == 0; });
  }, nullptr, {vnpuActivityKindSync});
  return vnpuSuccess;
}

vnpuError_t vnpuEventElapsedTime(float* ms, vnpuEvent_t start, vnpuEvent_t end) {
  if (ms == nullptr) return vnpuErrorInvalidValue;
  if (start == nullptr || end == nullptr) return vnpuErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & vnpuEventDisableTiming) return vnpuErrorInvalidResourceHandle;
  int64_t t0, t1;
  {
    std::lock_guard<std::mutex> g(start->mu);
    if (start->recorded == 0) return vnpuErrorInvalidResourceHandle;
    if (start->pending.count(start->recorded) != 0) return vnpuErrorNotReady;
    t0 = start->time_ns;
  }
  {
    std::lock_guard<std::mutex> g(end->mu);
    if (end->recorded == 0) return vnpuErrorInvalidResourceHandle;
    if (end->pending.count(end->recorded) != 0) return vnpuErrorNotReady;
    t1 = end->time_ns;
  }
  *ms = static_cast<float>(static_cast<double>(t1 - t0) / 1e6);
  return vnpuSuccess;
}
