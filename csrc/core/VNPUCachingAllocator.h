// The vnpu caching device allocator (mirrors c10/cuda/CUDACachingAllocator.h).
//
// Contract (CUDA's): a block freed on the host returns to a per-device pool
// tagged with the stream it was allocated on; only later allocations on that
// same stream reuse it, so in-order stream execution makes reuse safe without
// synchronizing. Use on another stream must be declared with recordStream
// (Tensor.record_stream), which delays reuse until that stream's work done so
// far has completed (tracked with events).
//
// Pools: requests <= 1 MiB come from 2 MiB segments (small pool); larger ones
// from 20 MiB segments (requests < 10 MiB) or exact 2 MiB-rounded segments.
// Blocks are split on allocation and merged with free neighbours on free.
// Segments go back to the device only in emptyCache or when an allocation
// would otherwise fail (then OutOfMemoryError if it still fails; it says when
// the free memory is there but fragmented).
//
// Settings (VNPUAllocatorConfig.h): PYTORCH_VNPU_ALLOC_CONF, else
// PYTORCH_ALLOC_CONF, read once. With expandable_segments:True each stream and
// pool has one segment mapped page by page from anywhere in the device's free
// memory (the runtime's vnpuMem* calls): see Note [Expandable segments].
//
// Threads: one mutex per device guards that device's pools, blocks and stats.
// Statistics are bytes or counts, in the format of torch.cuda.memory_stats.
#pragma once

#include "VNPUStream.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

namespace c10::vnpu::allocator {

// The allocator registered for DeviceType::PrivateUse1: the caching allocator, or the one
// changeCurrentAllocator installed.
c10::DeviceAllocator* get();
// torch.vnpu.memory.change_current_allocator (CUDA's): `allocator` serves every later vnpu allocation.
// Only before any device was used, else "Can't swap an already initialized allocator". The caching
// allocator's statistics, snapshots, pools and raw allocations then raise (as CUDA's pluggable allocator).
void changeCurrentAllocator(c10::DeviceAllocator* allocator);
bool isCachingAllocatorCurrent();
// torch.vnpu.memory.caching_allocator_enable (CUDA's): off, each allocation is its own vnpuMalloc and each
// free a vnpuFree (no cache, no statistics); on again, allocations come from the cache.
void setCachingEnabled(bool enabled);
bool isCachingEnabled();
// Marks `ptr` as used by `stream` (no-op for the allocation stream).
void recordStream(const DataPtr& ptr, VNPUStream stream);
// Releases all unused cached segments of every device (synchronizes devices first).
void emptyCache();
c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex device);
// Graph memory pools (CUDA's beginAllocateToPool / endAllocateToPool / releasePool; see Note [Graph
// memory pools] in the .cpp). While a capture is underway, allocations on `device` from streams that
// `filter` accepts come from pool `id` (created on first use with one holder; each further begin on
// an existing pool adds a holder). releasePool drops a holder; a pool with none left returns its
// memory at the next emptyCache (a block still held by a tensor, once that tensor dies).
void beginAllocateToPool(DeviceIndex device, MempoolId_t id, std::function<bool(vnpuStream_t)> filter);
void endAllocateToPool(DeviceIndex device, MempoolId_t id);
void releasePool(DeviceIndex device, MempoolId_t id);
// Holders of pool `id` on `device` (graphs, MemPools, open use_mem_pool scopes); 0 for an unknown pool.
int poolUseCount(DeviceIndex device, MempoolId_t id);
void resetPeakStats(DeviceIndex device);
// Graph pool checkpoints (CUDA's getCheckpointState / setCheckpointPoolState / checkPoolLiveAllocations),
// which Inductor's graph trees use to let a new recording continue where an earlier one left its pool: see
// Note [Graph pool checkpoints] in the .cpp.
struct PoolCheckpoint {
  struct BlockState {
    size_t size = 0;       // bytes
    size_t requested = 0;  // bytes asked for
    bool allocated = false;
  };
  struct SegmentState {
    void* ptr = nullptr;  // the segment's first byte
    std::vector<BlockState> blocks;  // in address order, covering the segment
  };
  DeviceIndex device = 0;
  MempoolId_t pool{0, 0};
  std::vector<SegmentState> segments;
};
struct CheckpointDelta {
  std::vector<void*> ptrs_freed;         // blocks of the pool that were allocated and are now free
  std::vector<DataPtr> dataptrs_allocd;  // blocks allocated by the checkpoint, owning (the caching deleter)
};
// The layout of pool `id` on `device` now: its segments and which of their blocks are allocated.
std::shared_ptr<PoolCheckpoint> getCheckpointState(DeviceIndex device, MempoolId_t id);
// Frees every allocated block of the checkpoint's pool, then splits the pool's segments as the checkpoint
// recorded them and allocates its allocated blocks again. Dropping a returned DataPtr frees its block;
// a block whose DataPtr released its context stays allocated until rawDelete. Raises if a segment of the
// checkpoint was released or a block is still in use by another stream's pending work.
CheckpointDelta setCheckpointPoolState(DeviceIndex device, const PoolCheckpoint& state);
// True if the allocated blocks of pool `id` are exactly those starting at `expected`.
bool checkPoolLiveAllocations(DeviceIndex device, MempoolId_t id, const std::unordered_set<void*>& expected);
// The deleter of the caching allocator's DataPtrs (CUDA's raw_deleter; a storage "has the standard deleter").
DeleterFnPtr cachingDeleter();
// torch.vnpu.set_per_process_memory_fraction (CUDA's setMemoryFraction): from now on, the device memory
// the allocator reserves on `device` (segments, mapped pages) stays within fraction x capacity; a request
// past it first releases cached memory, then raises OutOfMemoryError. Throws for a fraction outside [0, 1].
void setMemoryFraction(double fraction, DeviceIndex device);
double getMemoryFraction(DeviceIndex device);
// torch.vnpu.caching_allocator_alloc / _delete (CUDA's raw_alloc_with_stream / raw_delete): `n` bytes
// from the caching allocator of `stream`'s device, for `stream` (nullptr for 0 bytes); the caller frees them
// with rawDelete, which raises for a pointer that is not such a live block.
void* rawAlloc(size_t n, vnpuStream_t stream);
void rawDelete(void* ptr);
void resetAccumulatedStats(DeviceIndex device);

// Memory history and snapshots (torch.cuda.memory._record_memory_history / _snapshot): see
// Note [Memory history] in the .cpp.
struct SnapshotInfo {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments;  // every device's, as torch.cuda's
  std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> device_traces;  // per device, oldest first
};
// The segments of every device and, while history is recorded, each device's trace (the call is
// recorded as a "snapshot" entry).
SnapshotInfo snapshot();
// Starts (`enabled`) or stops recording on every device: `recorder` gathers the stack of the calling
// thread at allocations (`when` >= STATE), in the trace (>= ALLOC) and at frees (ALL); at most
// `max_entries` trace entries per device are kept (at least 1, as CUDA), the oldest overwritten;
// `skip_actions` has bit (1 << TraceEntry::Action) set for actions not to record. Stopping clears the trace.
void recordHistory(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                   c10::CachingDeviceAllocator::RecordContext when, bool clear_history, uint32_t skip_actions);
bool isHistoryEnabled();
// Called at every OutOfMemoryError (device, bytes the device was asked for, device capacity, free
// bytes), before it is raised and without the allocator's lock, as CUDA's observers.
using OutOfMemoryObserver =
    std::function<void(int64_t device, int64_t alloc, int64_t device_total, int64_t device_free)>;
void attachOutOfMemoryObserver(OutOfMemoryObserver observer);

// Sanitizer (VNPU_SANITIZE, csrc/sanitizer): when the runtime's sanitizer is on, every allocation
// gathers `recorder`'s context (where it was allocated; gathered before the allocator's lock), frees
// are poisoned in stream order and reported to the runtime (vnpuSanitizerFree / vnpuSanitizerAlloc).
void setSanitizerRecorder(c10::CachingDeviceAllocator::CreateContextFn recorder);
// The block of the runtime's pending free race (a free vnpuSanitizerFree answered with
// vnpuErrorStreamRace): where it was allocated and where it was freed (`recorder`'s contexts; null
// when unknown). Takes them: a second call returns nulls.
void takeSanitizerFreeRace(std::shared_ptr<c10::GatheredContext>* allocated,
                           std::shared_ptr<c10::GatheredContext>* dropped);
// The sanitizer context of the live block starting at `ptr` on `device`, or null.
std::shared_ptr<c10::GatheredContext> sanitizerContext(DeviceIndex device, const void* ptr);
// Where the freed block holding `ptr` on `device` was allocated, while the memory is not handed out again
// (and among the last 4096 such blocks), or null.
std::shared_ptr<c10::GatheredContext> sanitizerFreedContext(DeviceIndex device, const void* ptr);
// The live block of `device` that contains `ptr` (anywhere inside it): its start and size in bytes.
// False if no live block holds it (cached free memory, or not this allocator's).
bool blockContaining(DeviceIndex device, const void* ptr, void** base, size_t* size);

}  // namespace c10::vnpu::allocator
