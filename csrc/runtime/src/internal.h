// Internal state of the vNPU runtime. Not part of the contract (runtime.h).
//
// Threads: every stream owns one worker thread (started at its first task)
// that runs tasks in submission order. Device objects live for the whole
// process (never destroyed, like a driver context) so worker threads never
// touch freed state at exit.
#pragma once

#include <vnpu/runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace vnpu::rt {
struct Capture;
namespace san {
// An access a captured task declared; `name` (interned) names the task for reports.
struct GraphAccess {
  vnpuMemAccess access;
  const char* name;
};
}  // namespace san
// What a task is, for its activity record (kernels need none).
struct TaskInfo {
  vnpuActivityKind kind = vnpuActivityKindKernel;
  size_t bytes = 0;
  vnpuMemcpyKind copy_kind = vnpuMemcpyHostToHost;
  bool host_pinned = false;
  int src_device = -1, dst_device = -1;  // memcpy
};

// Note [Task names]
// Tasks carry their name (for errors and activity records) as a pointer into a
// process-wide table of names, so a submission copies no string: a std::string
// of an op name ("aten::add.Tensor" is over the 15-byte inline limit) would be
// allocated by the submitting thread and freed by the worker, and such
// cross-thread frees contend on malloc's arena locks. Names are few (op and
// kernel names), so the table only grows at first use of each.
const char* intern_task_name(const char* name);
}  // namespace vnpu::rt

struct vnpuStream_st {
  struct Task {
    const char* name = "";  // interned (Note [Task names])
    vnpuKernel_t fn;
    // Runs right after the task is counted complete, under `mu`, so that what it
    // publishes (an event's completion) and the stream's idleness agree.
    std::function<void()> on_complete;
    // Activity recording (Note [Activity records], activity.cpp); set at submission.
    vnpuActivityKind kind = vnpuActivityKindKernel;
    vnpuMemcpyKind copy_kind = vnpuMemcpyHostToHost;
    bool host_pinned = false;
    int src_device = -1, dst_device = -1;
    bool record = false;
    size_t bytes = 0;
    uint64_t correlation_id = 0;
    uint64_t host_thread = 0;
    int64_t queued_ns = 0;
  };

  int device = 0;
  int priority = 0;
  bool is_default = false;

  std::mutex mu;                   // guards everything below
  std::condition_variable cv_work; // worker waits for tasks
  std::condition_variable cv_done; // synchronizers wait for progress
  // Note [Task ring]: a ring of reused Task slots, not a std::deque: a deque
  // frees a block on the worker for every few tasks the submitting thread
  // allocated (cross-thread frees, see Note [Task names]).
  class TaskRing {
   public:
    bool empty() const { return count_ == 0; }
    Task& front() { return slots_[head_]; }
    void pop_front() {
      head_ = (head_ + 1) & (slots_.size() - 1);
      --count_;
    }
    void push_back(Task&& t) {
      if (count_ == slots_.size()) grow();
      slots_[(head_ + count_) & (slots_.size() - 1)] = std::move(t);
      ++count_;
    }

   private:
    void grow() {
      std::vector<Task> bigger(std::max<size_t>(64, slots_.size() * 2));  // a power of two
      for (size_t i = 0; i < count_; ++i) bigger[i] = std::move(slots_[(head_ + i) & (slots_.size() - 1)]);
      slots_.swap(bigger);
      head_ = 0;
    }
    std::vector<Task> slots_;
    size_t head_ = 0, count_ = 0;
  };
  TaskRing queue;
  uint64_t submitted = 0;          // tasks ever submitted (count)
  uint64_t completed = 0;          // tasks ever finished (count)
  // Note [Completion wake-ups]: the smallest `completed` count a thread blocked
  // on cv_done waits for. The worker wakes cv_done only once it is reached, not
  // after every task: a synchronize behind N queued tasks otherwise costs the
  // worker N futex wake-ups and the waiter N reschedules. Waiters register
  // through completed_or_wake_at, the predicate of every cv_done wait.
  uint64_t wake_at = UINT64_MAX;
  bool worker_started = false;
  bool worker_waiting = false;     // the worker blocks on cv_work (submit() must notify)
  // `submitted` mirrored for the worker's lock-free spin (Note [Worker spin], stream.cpp).
  std::atomic<uint64_t> submitted_hint{0};
  // cv_done wait predicate (mu held): true once `target` tasks completed, else registers the wait.
  bool completed_or_wake_at(uint64_t target) {
    if (completed >= target) return true;
    if (target < wake_at) wake_at = target;
    return false;
  }
  // Non-null while the stream captures (graph.cpp): submit() records instead of queuing.
  std::shared_ptr<vnpu::rt::Capture> capture;
  int san_slot = -1;               // sanitizer: index of the stream's clock (sanitizer.cpp's lock)

  // What submit() did: queued the task, recorded it into the stream's capture,
  // or dropped it (the capture was invalidated).
  enum Submitted { Queued, Recorded, Dropped };
  // A task with on_complete must not be submitted to a capturing stream.
  Submitted submit(const char* name, vnpuKernel_t fn, std::function<void()> on_complete = nullptr,
                   const vnpu::rt::TaskInfo& info = vnpu::rt::TaskInfo());
  // Blocks until completed == submitted at call. An interruptible wait may end
  // early (returns false) when the wait-interrupt hook asks it to.
  // orders_host=false: a wait the program did not ask for (VNPU_LAUNCH_BLOCKING's after each launch); the
  // sanitizer does not count it as ordering the host after the stream (Note [Launch blocking and the sanitizer]).
  bool wait_idle(bool interruptible = false, bool orders_host = true);
  bool idle();
};

// Note [Event lifetime and generations]
// Each vnpuEventRecord is a new generation. A wait or synchronize targets the
// generation current at its call and ends when *that* record has run, even if
// the event is re-recorded elsewhere meanwhile (CUDA semantics); so completion
// is tracked per generation (`pending`), not as "latest completed >= target".
// The handle owns one reference (`handle_ref`); every queued record/wait task
// holds another, so vnpuEventDestroy may drop the handle while work still
// refers to the event (like cudaEventDestroy) without a use-after-free.
struct vnpuEvent_st : std::enable_shared_from_this<vnpuEvent_st> {
  unsigned flags = 0;
  std::mutex mu;                   // guards recorded/pending/completed/time_ns
  std::condition_variable cv;      // notified when a generation completes
  uint64_t recorded = 0;           // generation of the latest record (0 = never recorded)
  std::set<uint64_t> pending;      // generations recorded whose stream has not reached them
  uint64_t completed = 0;          // highest completed generation
  int64_t time_ns = 0;             // steady clock at completion of `completed`
  std::shared_ptr<vnpuEvent_st> handle_ref;  // released by vnpuEventDestroy
  // Set when last recorded in a capturing stream (graph.cpp); such a record
  // queues nothing. Guarded by mu.
  std::weak_ptr<vnpu::rt::Capture> captured_in;
  // Recorded in a capture: what the recording stream was ordered after then (Note [Cross-stream capture]).
  std::unordered_map<vnpuStream_st*, size_t> captured_known;
  std::vector<uint64_t> san_clock;  // sanitizer: the recording stream's clock at the latest record (its lock)
};

namespace vnpu::rt {

// A device's memory (Note [Physical memory and mappings], vmm.cpp): `capacity`
// bytes of physical pages (a memfd; untouched pages cost no RAM), mapped in
// full at `base` (the linear range vnpuMalloc hands out). free_ lists the
// physical offsets no allocation or vnpuMemCreate handle owns.
struct MemoryRegion {
  char* base = nullptr;            // reserved at discovery, backed at initialization
  size_t capacity = 0;             // bytes
  int fd = -1;                     // the memfd of the physical pages; -1: private anonymous memory (no VMM, no IPC)
  uint64_t nonce = 0;              // random id in the memfd's name, checked by vnpuIpcOpenMemHandle
  std::mutex mu;                   // guards free_/used_/used_bytes
  std::map<size_t, size_t> free_;  // offset -> bytes
  std::map<size_t, size_t> used_;  // offset -> bytes (vnpuMalloc blocks)
  size_t used_bytes = 0;           // bytes owned by vnpuMalloc blocks and vnpuMemCreate handles
};

struct Device {
  int index = 0;                   // visible index
  int physical = 0;                // physical id (VNPU_VISIBLE_DEVICES)
  MemoryRegion mem;
  std::mutex streams_mu;           // guards streams
  std::vector<vnpuStream_st*> streams;
  vnpuStream_st* default_stream = nullptr;
  std::mutex err_mu;               // guards error/error_msg
  vnpuError_t error = vnpuSuccess;
  std::string error_msg;
};

std::vector<Device*>& devices();   // discovers the devices on first use (no initialization)
// Initializes the runtime (backs every device's memory) on first call; afterwards a
// fork() makes the child a bad fork. vnpuErrorForkedAfterInit in such a child.
vnpuError_t initialize();
bool launch_blocking();
int& current_device();             // thread-local
void set_last_error_message(std::string msg);
// Records an asynchronous failure on a device (first one wins until reported).
void record_device_error(int device, vnpuError_t err, std::string msg);
// Returns and clears the device's pending asynchronous error.
vnpuError_t take_device_error(int device);
vnpuError_t peek_device_error(int device);
bool valid_device(int device);
vnpuStream_st* resolve(vnpuStream_t s);  // null -> default stream of current device
bool is_pinned(const void* p);
// Device whose memory holds `p` (its linear range, a vnpuMemMap mapping, or
// another process's memory opened by vnpuIpcOpenMemHandle), or -1.
int device_of(const void* p);
// Device of a vnpuMemMap-ped address, or -1 (vmm.cpp).
int mapped_device_of(const void* p, void** base = nullptr, size_t* size = nullptr);
// Device of an address in another process's device memory mapped by
// vnpuIpcOpenMemHandle (the device current when it was first opened), or -1.
int ipc_device_of(const void* p, void** base = nullptr, size_t* size = nullptr);
// Gives the RAM of physical pages [off, off+len) back (they read as zeros afterwards).
void release_pages(MemoryRegion& m, size_t off, size_t len);
// Takes `n` bytes (a multiple of 4096) of free physical pages, as one extent or
// (contiguous = false) as several; false if the device has too little free.
// Both need m.mu held.
bool take_physical_locked(MemoryRegion& m, size_t n, bool contiguous,
                          std::vector<std::pair<size_t, size_t>>* extents);
// Returns pages to the free list (their RAM to the host).
void give_physical_locked(MemoryRegion& m, size_t off, size_t len);
// Waits for every stream of `device`; no error is consumed.
bool wait_device_idle(int device, bool interruptible);

// Activity records (activity.cpp). recording() is the one relaxed load a
// submission pays when recording is off.
extern std::atomic<bool> g_activity_on;
inline bool recording() { return g_activity_on.load(std::memory_order_relaxed); }
uint64_t current_correlation_id();  // top of this thread's stack, 0 if empty
uint64_t host_thread_id();          // Linux tid of the calling thread (cached)
int64_t activity_now_ns();
// Note [Busy time] (utilization.cpp): a stream worker starts and ends a task of `kind` on `device`.
void busy_begin(int device, vnpuActivityKind kind);
void busy_end(int device, vnpuActivityKind kind);
void activity_submitted();         // a task with record = true was queued
void add_activity(vnpuStream_st* s, vnpuStream_st::Task& task, int64_t start_ns, int64_t end_ns, bool failed);

// Sanitizer (sanitizer.cpp; the contract is in runtime.h). on() is the one
// relaxed load a call pays when it is off; every other function takes the
// sanitizer's lock and is called only when on().
namespace san {
extern std::atomic<bool> g_on;
inline bool on() { return g_on.load(std::memory_order_relaxed); }
// Checks and records a task about to be submitted to s; vnpuSuccess or the
// refusal (the report is stored for vnpuSanitizerGetLastReport).
// On a capturing stream, nothing is checked or recorded: the accesses are kept
// in the capture for its replays (Note [Sanitizer and graphs]).
vnpuError_t begin_task(vnpuStream_st* s, const char* name, const vnpuMemAccess* acc, size_t n);
// A graph replay on s: one task whose accesses are the captured tasks' (each named by its task).
vnpuError_t begin_replay(vnpuStream_st* s, const std::vector<GraphAccess>& acc);
void event_recorded(vnpuEvent_st* e, vnpuStream_st* s);  // after begin_task of the record
void stream_waits_event(vnpuStream_st* s, vnpuEvent_st* e);
void host_waited_stream(vnpuStream_st* s);
void host_waited_event(vnpuEvent_st* e);
// Note [Deferred host copies]: a device->pinned-host copy waits on the stream
// until the host waits for or queries something ordered after it (gate_ticket
// at the submission, wait_gate on the worker; release_stream / release_event
// at the host's waits and queries).
struct Gate {
  uint32_t slot = 0;  // the copy's stream (its sanitizer slot); 0: no gate
  uint64_t pos = 0;   // the copy's position on it
};
Gate gate_ticket(vnpuStream_st* s);  // after begin_task of the copy
void wait_gate(Gate gate);
void release_stream(vnpuStream_st* s);  // the host waits for or queries s
void release_event(vnpuEvent_st* e);    // the host waits for or queries e
void set_report(vnpuSanitizerReport report);  // this thread's vnpuSanitizerGetLastReport
// Check 4, host access to device memory (host_access.cpp, Note [Protection
// keys]). host_check_on() is one relaxed load; the rest is called only when on.
extern std::atomic<int> g_pkey;  // protection key of device memory; -1: none
// How check 4 runs (vnpuSanitizerHostAccessCheckEnabled's answer): off, protection keys, or page
// protection where there are no keys (Note [Host access without protection keys]).
enum { kHostCheckOff = 0, kHostCheckPkey = 1, kHostCheckMprotect = 2 };
extern std::atomic<int> g_host_mode;
inline bool host_check_on() { return g_host_mode.load(std::memory_order_relaxed) != kHostCheckOff; }
void setup_host_check();         // when the sanitizer turns on: allocates the key
void protect(void* p, size_t n); // tags a device memory mapping with the key
void unprotect(void* p, size_t n);  // before a mapping in [p, p + n) goes away
// After the host waited for device work (a synchronize, a pageable device-to-host copy): the
// fallback protects the memory kernels opened again. No-op with keys.
void host_waited();
void protect_devices();          // at initialization: tags the linear ranges, installs the fault handler
void grant_worker();             // on a stream worker's thread: access for good
// vnpuErrorHostAccess (report set) once per recorded host access, else vnpuSuccess.
// One relaxed load when nothing was recorded.
// Also returns a pending deferred race first (Note [Frees without record_stream], Note [Pinned
// uploads], sanitizer.cpp).
vnpuError_t report_host_access(vnpuStream_st* s, const char* name);
extern std::atomic<bool> g_deferred_pending;
vnpuError_t take_deferred(vnpuStream_st* s, const char* name);  // vnpuErrorStreamRace (report set) once
// A non_blocking copy from pinned memory at `src` was just queued on s (after its begin_task).
// A pinned upload / download queued on s (Note [Pinned uploads], Note [Pinned buffers both ways]). The upload's
// task sets the returned flag once it ran; note_download says whether the destination may be poisoned now.
// Device allocations seen by the sanitizer so far (vnpuSanitizerAlloc); read by check 4's fault handler.
extern std::atomic<uint64_t> g_alloc_epoch;
// Whether the memory at `addr` was allocated again after `epoch` allocations (check 4's report: the tensor
// there now is not the one host code touched).
bool allocated_since(uintptr_t addr, uint64_t epoch);
// `name`: the task that reads the source, for the report (a string that outlives the process's reports).
std::shared_ptr<std::atomic<bool>> note_upload(vnpuStream_st* s, const void* src, size_t bytes,
                                               const char* name = "memcpy HtoD");
bool note_download(vnpuStream_st* s, void* dst, size_t bytes);
}  // namespace san
// Calls f(start, bytes) for every vnpuMemMap mapping (vmm.cpp), under its lock.
void for_each_mapping(const std::function<void(void*, size_t)>& f);

// Note [Interruptible waits]
// A host thread blocked in a synchronizing call waits in slices when a
// wait-interrupt hook is installed (vnpuSetWaitInterruptHook) and runs the
// hook between slices with no runtime lock held; a nonzero answer ends the
// wait (vnpuErrorInterrupted). The work waited for is not touched: it keeps
// running on its stream.
using WaitHook = int (*)();
WaitHook wait_hook();
std::chrono::microseconds wait_slice();
struct BlockingWaitHooks {
  void* (*enter)() = nullptr;
  void (*leave)(void*) = nullptr;
};
BlockingWaitHooks blocking_wait_hooks();
template <class Pred>
bool wait_interruptible(std::unique_lock<std::mutex>& lk, std::condition_variable& cv, Pred done,
                        bool interruptible = true) {
  if (done()) return true;
  // vnpuSetBlockingWaitHooks: the layer above may release a lock of its own
  // (the GIL) for the wait; never with a runtime lock held.
  const BlockingWaitHooks hooks = interruptible ? blocking_wait_hooks() : BlockingWaitHooks{};
  void* token = nullptr;
  if (hooks.enter != nullptr) {
    lk.unlock();
    token = hooks.enter();
    lk.lock();
  }
  bool finished = false;
  for (;;) {
    WaitHook hook = interruptible ? wait_hook() : nullptr;
    if (hook == nullptr) {
      cv.wait(lk, done);
      finished = true;
      break;
    }
    if (cv.wait_for(lk, wait_slice(), done)) {
      finished = true;
      break;
    }
    lk.unlock();
    const bool stop = hook() != 0;
    lk.lock();
    if (stop) {
      finished = done();
      break;
    }
  }
  if (hooks.leave != nullptr) {
    lk.unlock();
    hooks.leave(token);
    lk.lock();
  }
  return finished;
}
// Stream capture (graph.cpp): See Note [Stream capture].
struct Capture {
  uint64_t id = 0;
  int device = 0;
  vnpuStream_st* stream = nullptr;
  vnpuStreamCaptureMode mode = vnpuStreamCaptureModeGlobal;
  std::thread::id thread;          // the thread that began it
  std::mutex nodes_mu;             // guards nodes, san_accesses, last_node, known
  std::vector<std::pair<std::string, vnpuKernel_t>> nodes;
  // Sanitizer: the accesses the recorded tasks declared, declared again by
  // every replay (Note [Sanitizer and graphs], sanitizer.cpp).
  std::vector<san::GraphAccess> san_accesses;
  // Sanitizer: the pinned sources of the captured uploads, snapshotted again by every replay (Note [Pinned
  // uploads], sanitizer.cpp).
  std::vector<std::pair<const void*, size_t>> san_uploads;
  // Note [Cross-stream capture] (graph.cpp): streams that joined through an
  // event wait (guarded by the registry's mutex), how many nodes each stream
  // had recorded at its last task, and how far each stream is known to be
  // ordered after the others' nodes (through captured events).
  std::vector<vnpuStream_st*> joined;
  std::unordered_map<vnpuStream_st*, size_t> last_node;
  std::unordered_map<vnpuStream_st*, std::unordered_map<vnpuStream_st*, size_t>> known;
  std::atomic<bool> invalidated{false};
  std::atomic<bool> ended{false};
  std::string invalidated_by;      // guarded by the capture registry's mutex (graph.cpp)
};
// The result of a launch-like call after submit(): vnpuErrorStreamCaptureInvalidated
// for a dropped task; under VNPU_LAUNCH_BLOCKING, waits for a queued one.
vnpuError_t finish_submission(vnpuStream_st* s, vnpuStream_st::Submitted submitted);
// Hot-path test: true while any capture is underway in the process (one relaxed load).
extern std::atomic<int> g_captures_underway;
inline bool any_capture() { return g_captures_underway.load(std::memory_order_relaxed) != 0; }
// The live capture of `s`, or null.
std::shared_ptr<Capture> capture_of(vnpuStream_st* s);
// Marks `c` invalidated by `why` (the first reason is kept) and sets this thread's last message.
void invalidate_capture(Capture& c, const std::string& why);
// `what` refused on capturing stream `s`: invalidates its capture; returns `err` with the message set.
vnpuError_t refuse_on_capture(Capture& c, vnpuError_t err, const std::string& what);
// Note [Cross-stream capture] (graph.cpp): `event` is recorded on `s`, which captures into `c`.
void capture_record_event(const std::shared_ptr<Capture>& c, vnpuStream_st* s, vnpuEvent_st* event);
// Stream `s` waits on `event`, recorded into the live capture `c`: `s` joins `c` if it is not capturing.
// vnpuErrorStreamCaptureIsolation if `s` captures into another capture.
vnpuError_t capture_wait_event(const std::shared_ptr<Capture>& c, vnpuStream_st* s, vnpuEvent_st* event);
// For vnpuDeviceSynchronize: the error to return if `device` has a capturing stream (invalidated).
vnpuError_t check_device_not_capturing(int device, const char* what);
// For "unsafe" calls (vnpuMalloc, vnpuFree, ...): See Note [Stream capture].
vnpuError_t check_unsafe_call(const char* what);

// The memfd name of a device's physical pages (its nonce lets an IPC importer
// check that /proc/<pid>/fd/<fd> is still that memfd).
std::string memfd_name(int physical, uint64_t nonce);
// VNPU_IPC: whether device memory may be exported to other processes.
bool ipc_enabled();

}  // namespace vnpu::rt
