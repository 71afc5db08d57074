// Internal state of the vNPU runtime. Not part of the contract (runtime.h).
//
// Threads: every stream owns one worker thread (started at its first task)
// that runs tasks in submission order. Device objects live for the whole
// process (never destroyed, like a driver context) so worker threads never
// touch freed state at exit.
#pragma once

#include <vnpu/runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

struct vnpuStream_st {
  struct Task {
    std::string name;
    vnpuKernel_t fn;
    // Runs right after the task is counted complete, under `mu`, so that what it
    // publishes (an event's completion) and the stream's idleness agree.
    std::function<void()> on_complete;
  };
  int device = 0;
  int priority = 0;
  bool is_default = false;

  std::mutex mu;                   // guards everything below
  std::condition_variable cv_work; // worker waits for tasks
  std::condition_variable cv_done; // synchronizers wait for progress
  std::deque<Task> queue;
  uint64_t submitted = 0;          // tasks ever submitted (count)
  uint64_t completed = 0;          // tasks ever finished (count)
  bool worker_started = false;

  void submit(std::string name, vnpuKernel_t fn, std::function<void()> on_complete = nullptr);
  void wait_idle();                // blocks until completed == submitted at call
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
};

namespace vnpu::rt {

// A device's memory: one reserved virtual range of `capacity` bytes
// (MAP_NORESERVE: unused capacity costs no RAM), carved first-fit.
struct MemoryRegion {
  char* base = nullptr;
  size_t capacity = 0;             // bytes
  int fd = -1;                     // memfd behind a shareable region (VNPU_IPC), else -1
  uint64_t nonce = 0;              // random id of the memfd, checked by vnpuIpcOpenMemHandle
  std::mutex mu;                   // guards free_/used_/used_bytes
  std::map<size_t, size_t> free_;  // offset -> bytes
  std::map<size_t, size_t> used_;  // offset -> bytes
  size_t used_bytes = 0;
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

std::vector<Device*>& devices();   // initializes the runtime on first use
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
// Device that owns [p, p+n), or -1 if that range is not inside one allocation region.
int device_of(const void* p);
// Reserves a device's memory range: a shared memfd mapping (IPC-capable) unless
// VNPU_IPC=0 or memfd is unavailable, then private anonymous memory. false on failure.
bool reserve_region(MemoryRegion& m, int physical);
// Gives the RAM of [off, off+len) back; the range stays reserved.
void release_pages(MemoryRegion& m, size_t off, size_t len);

}  // namespace vnpu::rt
