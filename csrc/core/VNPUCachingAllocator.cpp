#include "VNPUCachingAllocator.h"

#include "VNPUAllocatorConfig.h"
#include "VNPUException.h"
#include "VNPUFunctions.h"

#include <c10/core/Allocator.h>
#include <c10/core/impl/COW.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/llvmMathExtras.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <map>

#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_set>
#include <vector>

namespace c10::vnpu::allocator {
namespace {

using c10::CachingAllocator::format_size;
using c10::CachingAllocator::StatType;
using c10::CachingAllocator::StatTypes;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using Context = std::shared_ptr<c10::GatheredContext>;

constexpr size_t kMinBlockSize = 512;               // bytes; every block is a multiple
constexpr size_t kSmallSize = 1048576;              // largest "small" request
constexpr size_t kSmallBuffer = 2097152;            // small-pool segment size (and expandable page)
constexpr size_t kMinLargeAlloc = 10485760;         // below this, large requests share a large segment
constexpr size_t kRoundLarge = 2097152;             // large segments round to this

struct Block;
struct ExpandableSegment;
struct PrivatePool;
struct BlockComparator {
  bool operator()(const Block* a, const Block* b) const;
};
// Free blocks of one size class, of the device's general pools or of a graph's private pool.
struct BlockPool : std::set<Block*, BlockComparator> {
  explicit BlockPool(bool is_small, PrivatePool* of = nullptr) : small(is_small), owner(of) {}
  const bool small;            // the small (<= 1 MiB requests) size class
  PrivatePool* const owner;    // the graph pool it belongs to, or null
};

// Note [Graph memory pools]
// A graph's allocations (CUDA's beginAllocateToPool) come from a private pool
// of classic segments that only that capture (or captures sharing its pool id)
// use, so the addresses baked into the graph stay the graph's until it is
// reset: blocks freed during the capture are reused by later allocations of
// the capture only, in capture order, which replays keep. use_count counts the
// graphs holding the pool; at zero, its free segments go back to the device at
// the next empty_cache (or OOM retry), and blocks still held by tensors go when
// those die, as CUDA's releasePool.
struct PrivatePool {
  PrivatePool() : small(true, this), large(false, this) {}
  BlockPool small, large;
  int use_count = 1;           // graphs holding the pool
  int segments = 0;            // classic segments it owns (count)
};

// Note [Graph pool checkpoints]
// Inductor's graph trees (torch.compile mode="reduce-overhead") record many graphs
// into one private pool. After recording a graph they checkpoint the pool's
// layout (which blocks of which segments are allocated: its outputs); before
// recording a sibling, or replaying after a different path, they restore it:
// every allocated block of the pool is freed, each checkpointed segment is split
// as recorded and its allocated blocks are allocated again, so the new recording
// sees the memory exactly as the graph it continues left it. The restored blocks
// come back as owning DataPtrs that the trees hand to the storages still alive;
// the rest they free with raw_delete (CUDA's setCheckpointPoolState contract).

struct Block {
  DeviceIndex device;
  vnpuStream_t stream;        // allocation stream
  size_t size;                // bytes
  size_t requested = 0;       // bytes asked for (unrounded)
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  bool mapped = true;         // false: unmapped address space of an expandable segment (in no pool)
  ExpandableSegment* expandable = nullptr;  // the segment of a block of an expandable segment
  Block* prev = nullptr;      // neighbours within the same segment
  Block* next = nullptr;
  int event_count = 0;        // outstanding recordStream events
  bool deferred = false;      // freed during a capture, its stream events not recorded yet (free())
  uint64_t freed_at = 0;      // free counter when it last became free (garbage collection order)
  std::set<vnpuStream_t> stream_uses;
  Context context_when_allocated;          // memory history: where the block was last handed out
  Context context_when_segment_allocated;  // ... and, on a segment's first block, where the segment was made
  Context sanitizer_context;               // sanitizer: where it was allocated (setSanitizerRecorder)
  Block(DeviceIndex d, vnpuStream_t s, size_t n, BlockPool* p, char* ptr_)
      : device(d), stream(s), size(n), pool(p), ptr(ptr_) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool is_free() const { return !allocated && !deferred && event_count == 0 && mapped; }  // then in its pool
};

// Note [Expandable segments]
// With expandable_segments:True (PYTORCH_VNPU_ALLOC_CONF) each (stream, pool)
// pair gets segments: address ranges as large as the device
// (vnpuMemAddressReserve) whose 2 MiB pages are mapped on demand, each
// as its own physical handle (vnpuMemCreate + vnpuMemMap), and unmapped again
// when free in empty_cache, the OOM retry and garbage collection. (CUDA maps
// 20 MiB pages in the large pool because cuMemMap is costly; an mmap is not,
// and 20 MiB pages would leave up to 19 MiB of a small device unusable.) Its blocks
// cover the whole range: mapped ones are ordinary blocks (allocated, or free in
// the pool), unmapped ones are bare address space in no pool. A request that no
// free block fits grows a segment: the lowest run of free and unmapped blocks
// long enough gets the missing pages; if no segment of the stream has such a
// run (its address space is cut by live blocks), a new range is reserved,
// as CUDA does. Ranges left with no page mapped are returned when the cache is
// released. The pages come from wherever the device has free memory, so a
// request fits whenever enough memory is free in total (a classic segment needs one
// contiguous hole, vnpuMalloc), and freed pages in the middle of a segment go
// back to the device (a split classic segment keeps all its memory until every
// block in it is free). Off by default, as on CUDA (docs/environment.md).
struct ExpandableSegment {
  vnpuStream_t stream;
  bool small;
  char* base = nullptr;
  size_t size = 0;            // bytes of address space
  size_t page = 0;            // bytes mapped at a time
  size_t mapped_pages = 0;    // count
  Block* head = nullptr;      // the block at `base` (forward merges keep it)
};

bool BlockComparator::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Rounds up to the next 1/divisions step between two powers of two (roundup_power2_divisions).
size_t round_to_division(size_t size, size_t divisions) {
  if (c10::llvm::isPowerOf2_64(size)) return size;
  const size_t floor = c10::llvm::PowerOf2Floor(size);
  const size_t step = floor / divisions;
  return step == 0 ? floor * 2 : round_up(size, step);
}

// Note [Memory history]
// torch.vnpu.memory._record_memory_history mirrors CUDA's: while it is on, each
// device keeps a ring buffer of its last `max_entries` TraceEntry records (alloc,
// free_requested, free_completed, segment_alloc/free, segment_map/unmap for
// expandable segments, oom, snapshot), and blocks remember the context (a
// torch::CapturedTraceback, gathered by a function the Python module installs)
// of the call that allocated them. Contexts are gathered before the allocator's
// lock is taken (gathering may take the GIL), and only when the recording level
// asks for them, so that with recording off an allocation costs one relaxed
// atomic load more. Out-of-memory observers run after the lock is released,
// before OutOfMemoryError is raised, so that they may take a snapshot.

std::mutex g_observers_mu;  // guards g_oom_observers
std::atomic<c10::CachingDeviceAllocator::CreateContextFn> g_sanitizer_recorder{nullptr};  // setSanitizerRecorder
std::mutex g_free_race_mu;  // guards the two below (takeSanitizerFreeRace)
std::shared_ptr<c10::GatheredContext> g_free_race_allocated, g_free_race_dropped;
void note_free_race(std::shared_ptr<c10::GatheredContext> allocated, std::shared_ptr<c10::GatheredContext> dropped) {
  std::lock_guard<std::mutex> g(g_free_race_mu);
  g_free_race_allocated = std::move(allocated);
  g_free_race_dropped = std::move(dropped);
}

// The runtime's sanitizer flag; fixed once the runtime is initialized, so then one relaxed load.
bool sanitizing() {
  static std::atomic<int> known{-1};
  const int v = known.load(std::memory_order_relaxed);
  if (v >= 0) return v != 0;
  const bool on = vnpuSanitizerIsEnabled() != 0;
  if (vnpuIsInitialized()) known.store(on ? 1 : 0, std::memory_order_relaxed);
  return on;
}
std::vector<OutOfMemoryObserver> g_oom_observers;

// What an OutOfMemoryError will say, carried out of the locked region (see Note [Memory history]).
struct PendingOom {
  std::string message;
  size_t alloc = 0, total = 0, free = 0;  // bytes
};

int64_t unix_time_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

void delete_block(void* ptr);  // the caching DataPtrs' deleter (below)

class DeviceCachingAllocator {
 public:
  explicit DeviceCachingAllocator(DeviceIndex d) : device_(d), cfg_(config()) {
    vnpuDeviceProp prop{};
    if (vnpuGetDeviceProperties(&prop, d) == vnpuSuccess) capacity_ = prop.totalGlobalMem;
    use_expandable_ = cfg_.expandable_segments;
  }

  Block* malloc(size_t orig, vnpuStream_t stream) {
    Context context = maybe_gather(RecordContext::STATE);  // before the lock: See Note [Memory history]
    Context san_context;
    if (sanitizing()) {
      if (auto recorder = g_sanitizer_recorder.load()) san_context = recorder();
    }
    PendingOom oom_info;
    {
      std::lock_guard<std::recursive_mutex> g(mu_);
      call_context_ = &context;
      try {
        Block* b = malloc_locked(orig, stream, context);
        call_context_ = nullptr;
        if (sanitizing()) {
          b->sanitizer_context = std::move(san_context);
          forget_freed_sites(b->ptr, b->size);
          VNPU_CHECK(vnpuSanitizerAlloc(b->ptr, b->size));
        }
        return b;
      } catch (PendingOom& p) {
        oom_info = std::move(p);
      } catch (...) {
        call_context_ = nullptr;
        throw;
      }
      call_context_ = nullptr;
    }
    std::vector<OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> g(g_observers_mu);
      observers = g_oom_observers;
    }
    for (const auto& obs : observers) {
      obs(device_, static_cast<int64_t>(oom_info.alloc), static_cast<int64_t>(oom_info.total),
          static_cast<int64_t>(oom_info.free));
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, oom_info.message);
    return nullptr;  // unreachable
  }

  Block* malloc_locked(size_t orig, vnpuStream_t stream, const Context& context) {
    process_events();
    size_t size = round_size(orig);
    PrivatePool* graph_pool = nullptr;  // See Note [Graph memory pools]
    for (auto& [id, filter] : captures_underway_) {
      if (filter(stream)) {
        graph_pool = graph_pools_.at(id).get();
        break;
      }
    }
    BlockPool& pool = graph_pool != nullptr ? (size <= kSmallSize ? graph_pool->small : graph_pool->large)
                                            : (size <= kSmallSize ? small_ : large_);
    Block* block = take_free(pool, stream, size);
    if (block == nullptr) {
      block = use_expandable_ && graph_pool == nullptr ? grow(pool, stream, size, orig)
                                                       : alloc_segment(pool, stream, size, orig);
    }
    if (should_split(block, size)) insert_free(split_after(block, size));
    block->allocated = true;
    block->requested = orig;
    active_[block->ptr] = block;
    update(stats_.allocation, pool, 1, true);
    update(stats_.allocated_bytes, pool, block->size, true);
    update(stats_.active, pool, 1, true);
    update(stats_.active_bytes, pool, block->size, true);
    update(stats_.requested_bytes, pool, orig, true);
    if (is_oversize(block)) stats_.oversize_allocations.increase(1);
    block->context_when_allocated = context;
    record_trace(TraceEntry::ALLOC, block->ptr, orig, stream, context);
    report_to_profiler(block->ptr, static_cast<int64_t>(block->size));
    return block;
  }

  // torch.profiler(profile_memory=True) records device allocations and frees,
  // as CUDA's allocator reports them (free when nothing profiles memory).
  void report_to_profiler(void* ptr, int64_t delta) {
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    c10::reportMemoryUsageToProfiler(ptr, delta, stats_.allocated_bytes[agg].current,
                                     stats_.reserved_bytes[agg].current, c10::Device(c10::DeviceType::PrivateUse1, device_));
  }

  // ---- graph pools: See Note [Graph memory pools] ---------------------------------------------

  void begin_allocate_to_pool(MempoolId_t id, std::function<bool(vnpuStream_t)> filter) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = graph_pools_.find(id);
    if (it == graph_pools_.end()) {
      graph_pools_.emplace(id, std::make_unique<PrivatePool>());
    } else {
      TORCH_CHECK(it->second->use_count > 0, "vnpu graph pool (", id.first, ", ", id.second,
                  ") was released and cannot be shared any more; capture with a new pool");
      ++it->second->use_count;
    }
    captures_underway_.emplace_back(id, std::move(filter));
  }

  void end_allocate_to_pool(MempoolId_t id) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    for (auto it = captures_underway_.begin(); it != captures_underway_.end(); ++it) {
      if (it->first == id) {
        captures_underway_.erase(it);
        break;
      }
    }
    if (captures_underway_.empty()) {
      // Blocks freed during the capture while other streams used them: their events now (see free()).
      auto deferred = std::move(deferred_until_no_capture_);
      deferred_until_no_capture_.clear();
      for (Block* b : deferred) {
        b->deferred = false;
        free_after_stream_uses(b);
      }
    }
  }

  void release_pool(MempoolId_t id) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = graph_pools_.find(id);
    if (it == graph_pools_.end()) return;
    TORCH_INTERNAL_ASSERT(it->second->use_count > 0);
    --it->second->use_count;  // memory goes back at the next empty_cache once 0
  }

  int pool_use_count(MempoolId_t id) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = graph_pools_.find(id);
    return it == graph_pools_.end() ? 0 : it->second->use_count;
  }

  MempoolId_t pool_id_of(const PrivatePool* pool) {
    for (const auto& [id, p] : graph_pools_) if (p.get() == pool) return id;
    return {0, 0};
  }

  // ---- graph pool checkpoints: See Note [Graph pool checkpoints] ----------------------------

  PrivatePool* checkpointed_pool(MempoolId_t id) {
    auto it = graph_pools_.find(id);
    TORCH_CHECK(it != graph_pools_.end(), "vnpu graph pool (", id.first, ", ", id.second, ") does not exist on vnpu:",
                static_cast<int>(device_));
    return it->second.get();
  }

  std::vector<Block*> pool_segments(const PrivatePool* pool) {
    std::vector<Block*> heads;
    for (Block* head : segments_) if (head->pool->owner == pool) heads.push_back(head);
    std::sort(heads.begin(), heads.end(), [](Block* a, Block* b) { return a->ptr < b->ptr; });
    return heads;
  }

  std::shared_ptr<PoolCheckpoint> checkpoint_pool(MempoolId_t id) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto out = std::make_shared<PoolCheckpoint>();
    out->device = device_;
    out->pool = id;
    for (Block* head : pool_segments(checkpointed_pool(id))) {
      PoolCheckpoint::SegmentState seg;
      seg.ptr = head->ptr;
      for (Block* b = head; b != nullptr; b = b->next) seg.blocks.push_back({b->size, b->requested, b->allocated});
      out->segments.push_back(std::move(seg));
    }
    return out;
  }

  CheckpointDelta restore_pool(const PoolCheckpoint& cp) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    PrivatePool* pool = checkpointed_pool(cp.pool);
    for (const auto& [id, filter] : captures_underway_) {
      TORCH_CHECK(id != cp.pool, "vnpu graph pool checkpoint: the pool is being captured into");
    }
    CheckpointDelta delta;
    std::vector<void*> live;
    for (const auto& [ptr, b] : active_) if (b->pool->owner == pool) live.push_back(ptr);
    std::sort(live.begin(), live.end());
    for (void* ptr : live) {
      raw_blocks_.erase(ptr);
      free(active_.at(ptr), Context{});
      delta.ptrs_freed.push_back(ptr);
    }
    // A block another stream used is free once that stream passed the free: wait for it here, as
    // the checkpoint's layout needs every block of the pool back.
    for (auto it = events_.begin(); it != events_.end();) {
      Block* b = it->second;
      if (b->pool->owner != pool) {
        ++it;
        continue;
      }
      VNPU_CHECK(vnpuEventSynchronize(it->first));
      vnpuEventDestroy(it->first);
      it = events_.erase(it);
      if (--b->event_count == 0) free_block(b);
    }
    std::unordered_set<Block*> heads;
    for (Block* head : pool_segments(pool)) heads.insert(head);
    for (const auto& seg : cp.segments) {
      Block* head = nullptr;
      for (Block* h : heads) if (h->ptr == seg.ptr) head = h;
      TORCH_CHECK(head != nullptr, "vnpu graph pool checkpoint: segment ", seg.ptr, " of the pool was released");
      TORCH_CHECK(head->next == nullptr && head->is_free(), "vnpu graph pool checkpoint: a block of segment ",
                  seg.ptr, " is still in use (freed during a capture, or by a stream that has not reached its free)");
      size_t total = 0;
      for (const auto& bs : seg.blocks) total += bs.size;
      TORCH_CHECK(total == head->size, "vnpu graph pool checkpoint: segment ", seg.ptr, " has ", head->size,
                  " bytes, the checkpoint ", total);
      remove_free(head);
      std::vector<Block*> blocks;
      Block* cur = head;
      for (size_t i = 0; i < seg.blocks.size(); ++i) {
        if (i + 1 < seg.blocks.size()) split_after(cur, seg.blocks[i].size);
        blocks.push_back(cur);
        cur = cur->next;
      }
      for (size_t i = 0; i < blocks.size(); ++i) {
        Block* b = blocks[i];
        if (!seg.blocks[i].allocated) {
          insert_free(b);
          continue;
        }
        b->allocated = true;
        b->requested = seg.blocks[i].requested;
        active_[b->ptr] = b;
        raw_blocks_.insert(b->ptr);  // owned by whoever takes the DataPtr; else freed by rawDelete
        update(stats_.allocation, *b->pool, 1, true);
        update(stats_.allocated_bytes, *b->pool, b->size, true);
        update(stats_.active, *b->pool, 1, true);
        update(stats_.active_bytes, *b->pool, b->size, true);
        update(stats_.requested_bytes, *b->pool, b->requested, true);
        report_to_profiler(b->ptr, static_cast<int64_t>(b->size));
        delta.dataptrs_allocd.emplace_back(b->ptr, b->ptr, &delete_block, Device(DeviceType::PrivateUse1, device_));
      }
    }
    return delta;
  }

  bool check_pool_live(MempoolId_t id, const std::unordered_set<void*>& expected) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    const PrivatePool* pool = checkpointed_pool(id);
    size_t n = 0;
    for (const auto& [ptr, b] : active_) {
      if (b->pool->owner != pool) continue;
      if (expected.count(ptr) == 0) return false;
      ++n;
    }
    return n == expected.size();
  }

  void free(Block* block, const Context& context) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    block->allocated = false;
    record_trace(TraceEntry::FREE_REQUESTED, block->ptr, block->requested, block->stream,
                 context ? context : block->context_when_allocated);
    if (context) block->context_when_allocated = context;  // context:"all": free_completed names the free
    active_.erase(block->ptr);
    update(stats_.allocation, *block->pool, 1, false);
    update(stats_.allocated_bytes, *block->pool, block->size, false);
    update(stats_.requested_bytes, *block->pool, block->requested, false);
    if (is_oversize(block)) stats_.oversize_allocations.decrease(1);
    report_to_profiler(block->ptr, -static_cast<int64_t>(block->size));
    if (!block->stream_uses.empty()) {
      if (sanitizing() && block->pool->owner == nullptr) check_free_recorded(block);
      // An event recorded now on a capturing stream would be part of the graph: wait for the
      // captures to end, as CUDA's allocator does (the block stays out of every pool meanwhile).
      if (!captures_underway_.empty()) {
        block->deferred = true;  // not free: a neighbour freed meanwhile must not merge it
        deferred_until_no_capture_.push_back(block);
        return;
      }
      free_after_stream_uses(block);
      return;
    }
    free_block(block);
  }

  // Note [Frees with record_stream] (runtime sanitizer.cpp): a stream that used the block and was not
  // recorded is found at the free, where the Python stack names the line that dropped the tensor.
  void check_free_recorded(Block* block) {
    std::vector<vnpuStream_t> uses(block->stream_uses.begin(), block->stream_uses.end());
    const vnpuError_t e = vnpuSanitizerFreeRecorded(block->ptr, block->size, block->stream, uses.data(), uses.size());
    if (e == vnpuErrorStreamRace) {
      auto recorder = g_sanitizer_recorder.load();
      note_free_race(block->sanitizer_context, recorder != nullptr ? recorder() : nullptr);
    } else {
      VNPU_CHECK(e);
    }
  }

  // Reuse only after every stream that used the block is past this point.
  void free_after_stream_uses(Block* block) {
    for (vnpuStream_t s : block->stream_uses) {
      vnpuEvent_t e = nullptr;
      VNPU_CHECK(vnpuEventCreateWithFlags(&e, vnpuEventDisableTiming));
      VNPU_CHECK(vnpuEventRecord(e, s));
      ++block->event_count;
      events_.emplace_back(e, block);
    }
    block->stream_uses.clear();
  }

  // torch.vnpu.caching_allocator_alloc: a block for `stream`, owned by the caller.
  void* raw_alloc(size_t n, vnpuStream_t stream) {
    if (n == 0) return nullptr;
    void* p = malloc(n, stream)->ptr;
    std::lock_guard<std::recursive_mutex> g(mu_);
    raw_blocks_.insert(p);
    return p;
  }
  // torch.vnpu.caching_allocator_delete: as free_ptr, but an unknown pointer is the caller's error.
  void raw_delete(void* ptr) {
    {
      std::lock_guard<std::recursive_mutex> g(mu_);
      // Only blocks of caching_allocator_alloc: a tensor's block freed here would be reused under it.
      TORCH_CHECK(raw_blocks_.erase(ptr) != 0, "invalid device pointer: ", ptr,
                  " (not an address caching_allocator_alloc returned and caching_allocator_delete did not free)");
    }
    free_ptr(ptr);
  }

  // Frees the block that starts at `ptr` (the DataPtr's deleter).
  void free_ptr(void* ptr) {
    Context context = maybe_gather(RecordContext::ALL);  // before the lock: See Note [Memory history]
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = active_.find(ptr);
    if (it == active_.end()) {
      // A deleter must not throw (the process would abort). A storage whose block a graph pool checkpoint
      // already released (Note [Graph pool checkpoints]) gets here: its memory is the pool's again.
      TORCH_WARN("vnpu caching allocator: a storage released device memory the allocator no longer holds (", ptr,
                 "); ignored");
      return;
    }
    if (!raw_blocks_.empty()) raw_blocks_.erase(ptr);  // a checkpoint's block that a storage took
    free(it->second, context);
  }

  bool block_containing(const void* ptr, void** base, size_t* size) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    const char* p = static_cast<const char*>(ptr);
    for (const auto& [start, b] : active_) {  // rare (sanitizer reports): a scan is fine
      if (p >= b->ptr && p < b->ptr + b->size) {
        *base = b->ptr;
        *size = b->size;
        return true;
      }
    }
    return false;
  }

  Context sanitizer_context(const void* ptr) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = active_.find(const_cast<void*>(ptr));
    return it == active_.end() ? nullptr : it->second->sanitizer_context;
  }

  // Where the freed, not yet reused block holding `ptr` was allocated (a use-after-free report), or null.
  Context freed_sanitizer_context(const void* ptr) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = freed_sites_.upper_bound(p);
    if (it == freed_sites_.begin()) return nullptr;
    --it;
    return p < it->first + it->second.first ? it->second.second : nullptr;
  }

  void record_stream(void* ptr, vnpuStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = active_.find(ptr);
    if (it == active_.end()) return;  // freed already, or not the start of a block
    if (it->second->stream != stream) it->second->stream_uses.insert(stream);
  }

  void empty_cache() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    VNPU_CHECK(release_cached());
  }

  DeviceStats stats() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    DeviceStats s = stats_;
    s.max_split_size = cfg_.max_split_size == std::numeric_limits<size_t>::max()
                           ? -1 : static_cast<int64_t>(cfg_.max_split_size);
    return s;
  }
  void set_memory_fraction(double fraction) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    fraction_ = fraction;
    set_fraction_ = true;
    allowed_max_ = static_cast<size_t>(fraction * static_cast<double>(capacity_));
  }
  double memory_fraction() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    return fraction_;
  }

  // True (and remembered for the OOM message) if reserving `n` more bytes would pass the fraction's limit.
  bool over_limit(size_t n) {
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    limit_hit_ = set_fraction_ && stats_.reserved_bytes[agg].current + n > allowed_max_;
    return limit_hit_;
  }

  void reset_peak() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    for_all_stats([](auto& s) { s.reset_peak(); });
  }
  void reset_accumulated() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    for_all_stats([](auto& s) { s.reset_accumulated(); });
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  // Classic segments as they are; an expandable segment as one entry per run of mapped pages.
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    std::vector<c10::CachingDeviceAllocator::SegmentInfo> out;
    auto add_run = [&](Block* first, Block* stop) {
      c10::CachingDeviceAllocator::SegmentInfo seg;
      seg.device = device_;
      seg.address = reinterpret_cast<size_t>(first->ptr);
      seg.stream = first->stream;
      seg.is_large = !first->pool->small;
      seg.is_expandable = first->expandable != nullptr;
      seg.context_when_allocated = first->context_when_segment_allocated;
      if (first->pool->owner != nullptr) seg.owner_private_pool_id = pool_id_of(first->pool->owner);
      for (Block* b = first; b != stop; b = b->next) {
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = b->size;
        bi.requested_size = b->requested;
        bi.allocated = b->allocated;
        bi.active = b->allocated || b->event_count > 0;
        if (bi.active) bi.context_when_allocated = b->context_when_allocated;
        seg.total_size += b->size;
        if (b->allocated) {
          seg.allocated_size += b->size;
          seg.requested_size += b->requested;
        }
        if (bi.active) seg.active_size += b->size;
        seg.blocks.push_back(bi);
      }
      out.push_back(std::move(seg));
    };
    for (Block* head : segments_) add_run(head, nullptr);
    for (auto& [key, list] : expandable_) {
      for (auto& es : list) {
        for (Block* b = es->head; b != nullptr;) {
          if (!b->mapped) {
            b = b->next;
            continue;
          }
          Block* stop = b;
          while (stop != nullptr && stop->mapped) stop = stop->next;
          add_run(b, stop);
          b = stop;
        }
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
    size_t active = 0;
    for (const auto& seg : out) active += seg.active_size;
    record_trace(TraceEntry::SNAPSHOT, size_t{0}, active, nullptr, nullptr);
    return out;
  }

  // ---- memory history: See Note [Memory history] ---------------------------------------------

  void record_history(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                      RecordContext when, bool clear, uint32_t skip_actions) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    record_history_ = enabled;
    recorder_.store(enabled ? recorder : nullptr);
    record_context_.store(enabled && recorder != nullptr ? static_cast<int>(when) : 0);
    skip_actions_ = skip_actions;
    max_entries_ = std::max<size_t>(1, max_entries);  // CUDA keeps at least one entry (max_entries=0 too)
    if (!enabled || clear || trace_.size() > max_entries_) {
      // A smaller buffer keeps the newest entries.
      std::vector<TraceEntry> kept = enabled && !clear ? trace() : std::vector<TraceEntry>{};
      if (kept.size() > max_entries_) kept.erase(kept.begin(), kept.end() - static_cast<ptrdiff_t>(max_entries_));
      trace_ = std::move(kept);
      trace_next_ = 0;
    } else if (trace_next_ != 0) {
      trace_ = trace();  // oldest first, so that growing the buffer appends
      trace_next_ = 0;
    }
  }

  bool history_enabled() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    return record_history_;
  }

  // The recorded entries, oldest first.
  std::vector<TraceEntry> trace() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    std::vector<TraceEntry> out(trace_.begin() + static_cast<ptrdiff_t>(trace_next_), trace_.end());
    out.insert(out.end(), trace_.begin(), trace_.begin() + static_cast<ptrdiff_t>(trace_next_));
    return out;
  }

 private:
  // The context of the calling thread's stack if the recording level asks for it at `level`.
  Context maybe_gather(RecordContext level) {
    if (record_context_.load(std::memory_order_relaxed) < static_cast<int>(level)) return nullptr;
    auto recorder = recorder_.load();
    return recorder != nullptr ? recorder() : nullptr;
  }

  void record_trace(TraceEntry::Action action, const void* addr, size_t size, vnpuStream_t stream,
                    const Context& context) {
    record_trace(action, reinterpret_cast<size_t>(addr), size, stream, context);
  }
  void record_trace(TraceEntry::Action action, size_t addr, size_t size, vnpuStream_t stream,
                    const Context& context) {
    if (!record_history_ || (skip_actions_ & (1u << action)) != 0) return;
    const bool with_context = record_context_.load(std::memory_order_relaxed) >= static_cast<int>(RecordContext::ALLOC);
    TraceEntry te(action, device_, addr, size, stream, {0, 0}, 0, with_context ? context : nullptr);
    te.time_.t_ = static_cast<time_t>(unix_time_us());
    if (trace_.size() < max_entries_) {
      trace_.push_back(std::move(te));
    } else {
      trace_[trace_next_] = std::move(te);
      trace_next_ = (trace_next_ + 1) % max_entries_;
    }
  }
  const Context& call_context() const {
    static const Context none;
    return call_context_ != nullptr ? *call_context_ : none;
  }

  template <typename F>
  void for_all_stats(F f) {
    for (auto* arr : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                      &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                      &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (auto& s : *arr) f(s);
    }
    f(stats_.oversize_allocations);
    f(stats_.oversize_segments);
  }

  void update(c10::CachingAllocator::StatArray& arr, const BlockPool& pool, size_t amount, bool increase) {
    StatTypes types{};
    types[static_cast<size_t>(StatType::AGGREGATE)] = true;
    types[static_cast<size_t>(pool.small ? StatType::SMALL_POOL : StatType::LARGE_POOL)] = true;
    c10::CachingAllocator::for_each_selected_stat_type(types, [&](size_t t) {
      if (increase) arr[t].increase(amount); else arr[t].decrease(amount);
    });
  }

  // A free block of a split segment: inactive_split counts blocks, inactive_split_bytes their bytes.
  void split_stats(const BlockPool& pool, size_t bytes, bool increase) {
    update(stats_.inactive_split, pool, 1, increase);
    update(stats_.inactive_split_bytes, pool, bytes, increase);
  }

  // Every free mapped block is in its pool, counted in inactive_split if it has neighbours.
  void insert_free(Block* b) {
    b->pool->insert(b);
    if (b->is_split()) split_stats(*b->pool, b->size, true);
  }
  void remove_free(Block* b) {
    b->pool->erase(b);
    if (b->is_split()) split_stats(*b->pool, b->size, false);
  }

  // Cuts `b` after `bytes`; returns the new block holding the rest (same state, not in a pool).
  Block* split_after(Block* b, size_t bytes) {
    auto* rest = new Block(device_, b->stream, b->size - bytes, b->pool, b->ptr + bytes);
    rest->mapped = b->mapped;
    rest->expandable = b->expandable;
    rest->prev = b;
    rest->next = b->next;
    if (rest->next) rest->next->prev = rest;
    b->next = rest;
    b->size = bytes;
    return rest;
  }
  // `a` absorbs its next neighbour `b` (neither in a pool); returns `a`.
  Block* merge(Block* a, Block* b) {
    a->size += b->size;
    a->next = b->next;
    if (a->next) a->next->prev = a;
    delete b;
    return a;
  }

  size_t round_size(size_t n) const {
    if (n < kMinBlockSize) return kMinBlockSize;
    const size_t divisions = cfg_.divisions_for(n);
    if (divisions > 1 && n > kMinBlockSize * divisions) return round_to_division(n, divisions);
    return round_up(n, kMinBlockSize);
  }

  size_t segment_size(size_t n) const {
    if (n <= kSmallSize) return kSmallBuffer;
    if (n < kMinLargeAlloc) return cfg_.large_segment_size;
    return round_up(n, kRoundLarge);
  }

  bool is_oversize(const Block* b) const { return b->expandable == nullptr && b->size >= cfg_.max_split_size; }

  Block* take_free(BlockPool& pool, vnpuStream_t stream, size_t size) {
    Block key(device_, stream, size, &pool, nullptr);
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    if (b->expandable == nullptr) {
      // max_split_size_mb (CUDA's rules): oversize blocks serve only large requests, and only close fits.
      if (size < cfg_.max_split_size && b->size >= cfg_.max_split_size) return nullptr;
      if (size >= cfg_.max_split_size && b->size >= size + cfg_.max_non_split_rounding) return nullptr;
      // Don't hand a huge cached block to a small request (fragmentation).
      if (!pool.small && b->size > size + cfg_.large_segment_size && !b->is_split() && b->size >= size * 2)
        return nullptr;
    }
    remove_free(b);
    return b;
  }

  bool should_split(const Block* b, size_t size) const {
    const size_t rest = b->size - size;
    if (b->pool->small || b->expandable != nullptr) return rest >= kMinBlockSize;
    return size < cfg_.max_split_size && rest > kSmallSize;
  }

  // ---- classic segments: one vnpuMalloc each -------------------------------------------------

  Block* alloc_segment(BlockPool& pool, vnpuStream_t stream, size_t size, size_t orig) {
    const size_t n = segment_size(size);
    garbage_collect();
    void* ptr = nullptr;
    const bool for_graph = pool.owner != nullptr;
    vnpuError_t err = device_malloc(&ptr, n, for_graph);
    if (err == vnpuErrorMemoryAllocation) {
      // Free every cached segment and retry once, as CUDA's allocator does. A pending kernel error
      // surfacing here is raised (as cudaFree would), after the bookkeeping is complete.
      ++stats_.num_alloc_retries;
      VNPU_CHECK(release_cached());
      err = device_malloc(&ptr, n, for_graph);
    }
    if (err == vnpuErrorMemoryAllocation) oom(orig, size, n, stream, /*contiguous=*/true);
    VNPU_CHECK(err);
    ++stats_.num_device_alloc;
    auto* b = new Block(device_, stream, n, &pool, static_cast<char*>(ptr));
    b->context_when_segment_allocated = call_context();
    record_trace(TraceEntry::SEGMENT_ALLOC, ptr, n, stream, call_context());
    segments_.insert(b);
    if (pool.owner != nullptr) ++pool.owner->segments;
    update(stats_.segment, pool, 1, true);
    update(stats_.reserved_bytes, pool, n, true);
    if (n >= cfg_.max_split_size) stats_.oversize_segments.increase(1);
    return b;
  }

  // `for_graph`: a segment of a graph's pool, taken while its capture is underway: allowed in any
  // capture mode (as CUDA's allocator relaxes the thread's mode around cudaMalloc then).
  vnpuError_t device_malloc(void** ptr, size_t n, bool for_graph) {
    if (over_limit(n)) return vnpuErrorMemoryAllocation;
    DeviceIndex prev = ExchangeDevice(device_);
    vnpuStreamCaptureMode mode = vnpuStreamCaptureModeRelaxed;
    if (for_graph) vnpuThreadExchangeStreamCaptureMode(&mode);
    vnpuError_t err = vnpuMalloc(ptr, n);
    if (for_graph) vnpuThreadExchangeStreamCaptureMode(&mode);
    set_device(prev);
    return err;
  }

  // `size`: the rounded request; `needed`: bytes the device could not provide; `contiguous`: they had
  // to be one range (vnpuMalloc). Throws PendingOom: malloc raises OutOfMemoryError outside the lock.
  [[noreturn]] void oom(size_t orig, size_t size, size_t needed, vnpuStream_t stream, bool contiguous) {
    ++stats_.num_ooms;
    size_t free_b = 0, total = 0;
    DeviceIndex prev = ExchangeDevice(device_);
    vnpuMemGetInfo(&free_b, &total);
    set_device(prev);
    record_trace(TraceEntry::OOM, free_b, size, stream, call_context());  // addr: the free bytes, as CUDA
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    const size_t allocated = stats_.allocated_bytes[agg].current;
    const size_t reserved = stats_.reserved_bytes[agg].current;
    std::string advice =
        "Free tensors you no longer need, lower the batch size, or raise VNPU_MEMORY_PER_DEVICE (bytes; K/M/G "
        "suffixes).";
    if (limit_hit_) {
      advice = c10::str("The process's limit (torch.vnpu.set_per_process_memory_fraction(", fraction_, ") on vnpu:",
                        int(device_), ") is reached: raise the fraction, or free tensors you no longer need or "
                        "lower the batch size.");
    } else if (contiguous && free_b >= needed) {
      // Enough memory is free, but not in one piece: a classic segment needs one contiguous range.
      advice = "The free memory is fragmented: no contiguous range of " + format_size(needed) +
               " is free for a new segment, although " + format_size(free_b) +
               " is free in total. Set PYTORCH_VNPU_ALLOC_CONF=expandable_segments:True so that segments are "
               "mapped from scattered free memory, or free the tensors that sit between the free ranges. " + advice;
    } else if (!use_expandable_) {
      // CUDA's sentence: reserved but unallocated memory sits in split segments that requests of other
      // sizes cannot use; expandable segments return it page by page.
      advice = "If reserved but unallocated memory is large try setting PYTORCH_VNPU_ALLOC_CONF="
               "expandable_segments:True to avoid fragmentation. " + advice;
    }
    PendingOom p;
    p.message = c10::str("vNPU out of memory. Tried to allocate ", format_size(orig), ". vnpu:", int(device_),
                         " has a total capacity of ", format_size(total), " of which ", format_size(free_b),
                         " is free. ", set_fraction_ ? format_size(allowed_max_) + " allowed; " : std::string(),
                         "Of the allocated memory ", format_size(allocated),
                         " is allocated by PyTorch, and ", format_size(reserved - allocated),
                         " is reserved by PyTorch but unallocated (reserved in total: ", format_size(reserved),
                         "). ", advice);
    p.alloc = needed;
    p.total = total;
    p.free = free_b;
    throw p;
  }

  // ---- expandable segments: See Note [Expandable segments] ------------------------------------

  size_t address_space_size() const { return round_up(std::max(capacity_, kSmallBuffer), kSmallBuffer); }

  // A new address range for (stream, pool), as large as the device, with nothing mapped.
  ExpandableSegment* new_segment(BlockPool& pool, vnpuStream_t stream) {
    auto es = std::make_unique<ExpandableSegment>();
    es->stream = stream;
    es->small = pool.small;
    es->page = kSmallBuffer;  // both pools: mapping is cheap, and bigger pages strand memory on small devices
    es->size = address_space_size();
    void* base = nullptr;
    VNPU_CHECK(vnpuMemAddressReserve(&base, es->size, 0, nullptr, 0));  // pages need granularity alignment only
    es->base = static_cast<char*>(base);
    es->head = new Block(device_, stream, es->size, &pool, es->base);
    es->head->mapped = false;
    es->head->expandable = es.get();
    auto& list = expandable_[std::make_pair(stream, es->small)];
    list.push_back(std::move(es));
    return list.back().get();
  }

  // Returns the address range of a segment with no page mapped (its one block is unmapped).
  void drop_segment(ExpandableSegment* es) {
    auto& list = expandable_[std::make_pair(es->stream, es->small)];
    auto it = std::find_if(list.begin(), list.end(), [es](const auto& p) { return p.get() == es; });
    TORCH_INTERNAL_ASSERT(it != list.end() && es->mapped_pages == 0 && es->head->next == nullptr);
    vnpuMemAddressFree(es->base, es->size);
    delete es->head;
    list.erase(it);
  }

  // A free mapped block of at least `size` bytes for `stream`, made by mapping pages.
  Block* grow(BlockPool& pool, vnpuStream_t stream, size_t size, size_t orig) {
    garbage_collect();
    Block* b = nullptr;
    vnpuError_t err = try_grow(pool, stream, size, &b);
    if (err == vnpuErrorMemoryAllocation) {
      ++stats_.num_alloc_retries;  // as alloc_segment: release the cache, then once more
      VNPU_CHECK(release_cached());
      err = try_grow(pool, stream, size, &b);
    }
    if (err == vnpuErrorNotSupported) {
      // No shareable device memory (no memfd): classic segments it is.
      TORCH_WARN_ONCE("expandable_segments:True is not supported by this vnpu runtime (device memory is not a "
                      "memfd); using classic segments.");
      use_expandable_ = false;
      return alloc_segment(pool, stream, size, orig);
    }
    if (err == vnpuErrorMemoryAllocation) oom(orig, size, size, stream, /*contiguous=*/false);
    VNPU_CHECK(err);
    return b;
  }

  // Address space comes first, physical pages second: the lowest run of free and unmapped blocks
  // of the stream's segments that is long enough (as CUDA's find_expandable_block), else a new
  // address range. Only the pages then decide, and they may come from anywhere on the device.
  vnpuError_t try_grow(BlockPool& pool, vnpuStream_t stream, size_t size, Block** out) {
    if (size > address_space_size()) return vnpuErrorMemoryAllocation;  // more than the device holds
    auto it = expandable_.find(std::make_pair(stream, pool.small));
    if (it != expandable_.end()) {
      for (auto& es : it->second) {
        if (Block* first = find_run(es.get(), size)) return map_run(first, size, out);
      }
    }
    ExpandableSegment* es = new_segment(pool, stream);
    vnpuError_t err = map_run(es->head, size, out);
    if (err != vnpuSuccess) drop_segment(es);
    return err;
  }

  // The first block of the lowest run of `size` bytes made of free and unmapped blocks that holds
  // an unmapped one, or null.
  Block* find_run(ExpandableSegment* es, size_t size) {
    for (Block* u = es->head; u != nullptr; u = u->next) {
      if (u->mapped) continue;
      Block* first = u->prev != nullptr && u->prev->is_free() ? u->prev : u;
      size_t bytes = 0;
      for (Block* b = first; b != nullptr && bytes < size && (b->is_free() || !b->mapped); b = b->next)
        bytes += b->size;
      if (bytes >= size) return first;
    }
    return nullptr;
  }

  // Maps the pages the run from `first` needs for `size` bytes and makes it one free block (in no
  // pool). All or nothing: on failure nothing is mapped and the blocks are as they were.
  vnpuError_t map_run(Block* first, size_t size, Block** out) {
    ExpandableSegment* es = first->expandable;
    struct Piece {
      Block* block;
      size_t bytes;  // mapped now (whole pages), 0 for a free mapped block
    };
    std::vector<Piece> run;
    size_t covered = 0;
    for (Block* b = first; covered < size; b = b->next) {
      const size_t bytes = b->mapped ? 0 : std::min(b->size, round_up(size - covered, es->page));
      run.push_back({b, bytes});
      covered += b->mapped ? b->size : bytes;
    }
    // Physical pages first (one handle each), then mappings; undo everything on a failure.
    size_t new_bytes = 0;
    for (const Piece& p : run) new_bytes += p.bytes;
    if (over_limit(new_bytes)) return vnpuErrorMemoryAllocation;
    std::vector<std::pair<char*, size_t>> mapped;  // (address, bytes) mapped so far
    auto undo = [&] {
      for (auto [at, n] : mapped) vnpuMemUnmap(at, n);
    };
    vnpuMemAllocationProp prop{device_};
    for (const Piece& p : run) {
      for (size_t off = 0; off < p.bytes; off += es->page) {
        vnpuMemGenericAllocationHandle_t h = nullptr;
        vnpuError_t err = vnpuMemCreate(&h, es->page, &prop, 0);
        if (err == vnpuSuccess) {
          err = vnpuMemMap(p.block->ptr + off, es->page, 0, h, 0);
          vnpuMemRelease(h);  // the pages live while mapped
        }
        if (err != vnpuSuccess) {
          undo();
          return err;
        }
        mapped.emplace_back(p.block->ptr + off, es->page);
      }
      if (p.bytes > 0) record_trace(TraceEntry::SEGMENT_MAP, p.block->ptr, p.bytes, es->stream, call_context());
    }
    // The blocks: split off the unmapped rest, count the pages, merge the run into one block.
    BlockPool& pool = *first->pool;
    size_t pages = 0;
    for (const Piece& p : run) {
      if (p.block->mapped) {
        remove_free(p.block);
        continue;
      }
      if (p.block->size > p.bytes) split_after(p.block, p.bytes);  // the rest stays unmapped
      p.block->mapped = true;
      pages += p.bytes / es->page;
    }
    if (es->mapped_pages == 0) update(stats_.segment, pool, 1, true);
    es->mapped_pages += pages;
    stats_.num_device_alloc += static_cast<int64_t>(pages);
    update(stats_.reserved_bytes, pool, pages * es->page, true);
    Block* b = first;
    Block* const stop = run.back().block->next;
    while (b->next != stop) merge(b, b->next);
    // A free block right behind the run joins it (the rest goes back to the pool when split).
    if (b->next != nullptr && b->next->is_free()) {
      remove_free(b->next);
      merge(b, b->next);
    }
    *out = b;
    return vnpuSuccess;
  }

  // Unmaps the whole pages inside free block `b` of an expandable segment.
  vnpuError_t unmap_pages(Block* b) {
    ExpandableSegment* es = b->expandable;
    const size_t start = static_cast<size_t>(b->ptr - es->base), end = start + b->size;
    const size_t first = round_up(start, es->page), last = end / es->page * es->page;
    if (first >= last) return vnpuSuccess;
    vnpuError_t err = vnpuMemUnmap(es->base + first, last - first);  // waits for the device's queued work
    if (err != vnpuSuccess) return err;
    record_trace(TraceEntry::SEGMENT_UNMAP, es->base + first, last - first, es->stream, nullptr);
    BlockPool& pool = *b->pool;
    remove_free(b);
    Block* mid = b;
    if (first > start) {
      mid = split_after(b, first - start);
      insert_free(b);
    }
    if (end > last) insert_free(split_after(mid, last - first));
    mid->mapped = false;
    const size_t pages = (last - first) / es->page;
    es->mapped_pages -= pages;
    if (es->mapped_pages == 0) update(stats_.segment, pool, 1, false);
    stats_.num_device_free += static_cast<int64_t>(pages);
    update(stats_.reserved_bytes, pool, last - first, false);
    if (mid->next != nullptr && !mid->next->mapped) merge(mid, mid->next);
    if (mid->prev != nullptr && !mid->prev->mapped) merge(mid->prev, mid);
    return vnpuSuccess;
  }

  // ---- freeing --------------------------------------------------------------------------------

  // Freed blocks' allocation sites, kept until the memory is handed out again (bounded: a report of an
  // older free just has no site). Start -> (bytes, context). Under mu_.
  static constexpr size_t kMaxFreedSites = 4096;
  std::map<uintptr_t, std::pair<size_t, Context>> freed_sites_;

  void remember_freed_site(const void* ptr, size_t size, Context allocated) {
    if (!allocated) return;
    if (freed_sites_.size() >= kMaxFreedSites) freed_sites_.erase(freed_sites_.begin());
    forget_freed_sites(ptr, size);
    freed_sites_[reinterpret_cast<uintptr_t>(ptr)] = {size, std::move(allocated)};
  }

  void forget_freed_sites(const void* ptr, size_t size) {
    if (freed_sites_.empty()) return;
    const auto lo = reinterpret_cast<uintptr_t>(ptr), hi = lo + size;
    auto it = freed_sites_.upper_bound(lo);
    if (it != freed_sites_.begin() && std::prev(it)->first + std::prev(it)->second.first > lo) --it;
    while (it != freed_sites_.end() && it->first < hi) it = freed_sites_.erase(it);
  }

  void free_block(Block* block) {
    record_trace(TraceEntry::FREE_COMPLETED, block->ptr, block->requested, block->stream,
                 block->context_when_allocated);
    block->context_when_allocated = nullptr;
    // Every stream that used it is past the free point here (record_stream events): poison it on its
    // own stream, so a late reader sees NaN, never the next owner's data. Not a graph's private pool:
    // its replays keep using the memory after the tensors die (Note [Graph memory pools]).
    if (sanitizing() && block->pool->owner == nullptr) {
      Context allocated = std::move(block->sanitizer_context);
      block->sanitizer_context = nullptr;
      const vnpuError_t e = vnpuSanitizerFree(block->ptr, block->size, block->stream);
      if (e == vnpuErrorStreamRace) {
        // Another stream used it without record_stream (Note [Frees without record_stream], runtime
        // sanitizer.cpp): the runtime reports it at the next call; keep where it was allocated and dropped.
        auto recorder = g_sanitizer_recorder.load();
        note_free_race(std::move(allocated), recorder != nullptr ? recorder() : nullptr);
      } else {
        VNPU_CHECK(e);
        remember_freed_site(block->ptr, block->size, std::move(allocated));
      }
    }
    BlockPool& pool = *block->pool;
    update(stats_.active, pool, 1, false);
    update(stats_.active_bytes, pool, block->size, false);
    Block* b = block;
    if (b->prev != nullptr && b->prev->is_free()) {
      remove_free(b->prev);
      b = merge(b->prev, b);
    }
    if (b->next != nullptr && b->next->is_free()) {
      remove_free(b->next);
      b = merge(b, b->next);
    }
    b->freed_at = ++free_counter_;
    insert_free(b);
  }

  void process_events() {
    while (!events_.empty()) {
      auto [e, b] = events_.front();
      if (vnpuEventQuery(e) != vnpuSuccess) break;
      vnpuEventDestroy(e);
      events_.pop_front();
      if (--b->event_count == 0) free_block(b);
    }
  }

  // Note [Errors while releasing memory]
  // vnpuFree synchronizes the device first (as cudaFree) and so returns a kernel error that was
  // pending there, but it has freed the block all the same. Every release therefore finishes its
  // bookkeeping and goes on with the other blocks, and the first error is returned for the caller
  // to raise once the statistics and segment list match what the device holds.

  // Waits for pending record_stream events, then returns every releasable cached block's memory.
  vnpuError_t release_cached() {
    NoInterruptGuard no_interrupt;  // we hold mu_: see NoInterruptGuard
    vnpuError_t first = vnpuSuccess;
    auto keep = [&first](vnpuError_t e) {
      if (first == vnpuSuccess) first = e;
    };
    {
      DeviceIndex prev = ExchangeDevice(device_);  // vnpuEventSynchronize reports the current device's error
      for (auto& [e, b] : events_) keep(vnpuEventSynchronize(e));
      set_device(prev);
    }
    process_events();
    for (Block* b : releasable()) keep(release_block(b));
    // Address ranges left with no page mapped go too (as CUDA's release_expandable_segment).
    std::vector<ExpandableSegment*> empty;
    for (auto& [key, list] : expandable_) {
      for (auto& es : list) {
        if (es->mapped_pages == 0) empty.push_back(es.get());
      }
    }
    for (ExpandableSegment* es : empty) drop_segment(es);
    // Graph pools no graph holds any more and whose memory is all back: See Note [Graph memory pools].
    for (auto it = graph_pools_.begin(); it != graph_pools_.end();) {
      if (it->second->use_count == 0 && it->second->segments == 0) it = graph_pools_.erase(it);
      else ++it;
    }
    return first;
  }

  // Free blocks whose memory can go back: unsplit classic segments, expandable blocks holding whole pages.
  std::vector<Block*> releasable() {
    std::vector<Block*> out;
    for (BlockPool* pool : {&small_, &large_}) {
      for (Block* b : *pool) {
        if (b->expandable != nullptr || !b->is_split()) out.push_back(b);
      }
    }
    for (auto& [id, pp] : graph_pools_) {  // only pools no graph holds: See Note [Graph memory pools]
      if (pp->use_count > 0) continue;
      for (BlockPool* pool : {&pp->small, &pp->large}) {
        for (Block* b : *pool) {
          if (!b->is_split()) out.push_back(b);
        }
      }
    }
    return out;
  }

  vnpuError_t release_block(Block* b) {
    if (b->expandable != nullptr) return unmap_pages(b);
    vnpuError_t err = vnpuFree(b->ptr);  // synchronizes the device, like cudaFree
    // Not a block of the device, or refused during a graph capture: nothing was freed.
    if (err == vnpuErrorInvalidValue || err == vnpuErrorStreamCaptureUnsupported) return err;
    BlockPool& pool = *b->pool;
    record_trace(TraceEntry::SEGMENT_FREE, b->ptr, b->size, b->stream, nullptr);
    pool.erase(b);  // freed even if a pending kernel error is reported: See Note [Errors while releasing memory]
    ++stats_.num_device_free;
    update(stats_.segment, pool, 1, false);
    update(stats_.reserved_bytes, pool, b->size, false);
    if (b->size >= cfg_.max_split_size) stats_.oversize_segments.decrease(1);
    if (pool.owner != nullptr) --pool.owner->segments;
    segments_.erase(b);
    delete b;
    return err;
  }

  // garbage_collection_threshold: above threshold x capacity reserved, release cached blocks, least
  // recently freed first, until back under it (before new device memory is taken).
  void garbage_collect() {
    if (cfg_.garbage_collection_threshold <= 0 || capacity_ == 0) return;
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    const auto target = static_cast<int64_t>(cfg_.garbage_collection_threshold * static_cast<double>(capacity_));
    if (stats_.reserved_bytes[agg].current <= target) return;
    NoInterruptGuard no_interrupt;
    std::vector<Block*> candidates = releasable();
    std::sort(candidates.begin(), candidates.end(), [](Block* a, Block* b) { return a->freed_at < b->freed_at; });
    vnpuError_t first = vnpuSuccess;
    for (Block* b : candidates) {
      if (stats_.reserved_bytes[agg].current <= target) break;
      vnpuError_t err = release_block(b);
      if (first == vnpuSuccess) first = err;
    }
    VNPU_CHECK(first);
  }

  DeviceIndex device_;
  const AllocatorConfig& cfg_;
  size_t capacity_ = 0;           // bytes of the device
  bool use_expandable_ = false;
  // set_per_process_memory_fraction (CUDA's set_fraction / allowed_memory_maximum): segments and
  // mapped pages together stay within allowed_max_ bytes; limit_hit_: the last refusal was the limit's.
  double fraction_ = 1.0;
  bool set_fraction_ = false;
  size_t allowed_max_ = 0;
  bool limit_hit_ = false;
  std::recursive_mutex mu_;  // guards everything below
  BlockPool small_{true}, large_{false};
  // See Note [Graph memory pools]: pools by id, and the captures allocating now (pool id, which streams).
  std::map<MempoolId_t, std::unique_ptr<PrivatePool>> graph_pools_;
  std::vector<std::pair<MempoolId_t, std::function<bool(vnpuStream_t)>>> captures_underway_;
  std::vector<Block*> deferred_until_no_capture_;  // freed blocks waiting for their stream-use events
  ska::flat_hash_map<void*, Block*> active_;           // allocated blocks by pointer
  std::set<void*> raw_blocks_;                         // the ones caching_allocator_alloc handed out
  std::set<Block*> segments_;                          // first block of each classic segment
  // (stream, small) -> its expandable segments, oldest first
  std::map<std::pair<vnpuStream_t, bool>, std::vector<std::unique_ptr<ExpandableSegment>>> expandable_;
  std::deque<std::pair<vnpuEvent_t, Block*>> events_;  // pending recordStream events
  uint64_t free_counter_ = 0;                          // count of frees (garbage collection order)
  DeviceStats stats_;
  // Memory history (Note [Memory history]). The two atomics are read without the lock.
  std::atomic<int> record_context_{0};  // RecordContext
  std::atomic<c10::CachingDeviceAllocator::CreateContextFn> recorder_{nullptr};
  bool record_history_ = false;
  uint32_t skip_actions_ = 0;           // bit per TraceEntry::Action
  size_t max_entries_ = 1;
  std::vector<TraceEntry> trace_;       // ring buffer: the oldest entry is at trace_next_ once full
  size_t trace_next_ = 0;
  const Context* call_context_ = nullptr;  // the context of the malloc in progress
};

DeviceCachingAllocator& device_allocator(DeviceIndex d) {
  static std::vector<std::unique_ptr<DeviceCachingAllocator>>* all = [] {
    auto* v = new std::vector<std::unique_ptr<DeviceCachingAllocator>>();  // never freed: see below
    for (DeviceIndex i = 0; i < device_count(); ++i) v->emplace_back(new DeviceCachingAllocator(i));
    return v;
  }();
  // Valid indices skip check_device_index's runtime calls (twice per op: malloc and free).
  if (C10_UNLIKELY(d < 0 || static_cast<size_t>(d) >= all->size())) check_device_index(d);
  return *(*all)[d];
}

// The DataPtr's context is its data pointer, as CUDA's caching allocator does:
// storages with such "simple" DataPtrs can be lazily cloned (copy-on-write,
// torch._lazy_clone), which wraps the DataPtr and calls this deleter later.
void delete_block(void* ptr) {
  int device = -1;
  VNPU_CHECK(vnpuPointerGetDevice(&device, ptr));
  TORCH_INTERNAL_ASSERT(device >= 0, "vnpu caching allocator: freeing a pointer outside device memory ", ptr);
  device_allocator(static_cast<DeviceIndex>(device)).free_ptr(ptr);
}

// torch.vnpu.memory.caching_allocator_enable(False), as CUDA's: each allocation
// is its own vnpuMalloc and each free a vnpuFree (which waits for the device's
// queued work, so a block is never reused while a stream may still use it).
std::atomic<bool> g_caching_enabled{true};

void uncached_delete(void* ptr) {
  if (vnpuFree(ptr) != vnpuSuccess) {  // a deleter must not throw: report and go on
    TORCH_WARN("vnpu: freeing an uncached allocation failed: ", vnpuGetLastErrorString());
  }
}

// Tensors may die during interpreter shutdown: the allocator is intentionally
// leaked so their deleters never see a destroyed allocator.
class VNPUAllocator final : public c10::DeviceAllocator {
 public:
  DataPtr allocate(size_t n) override {
    DeviceIndex d = current_device();
    Device device(DeviceType::PrivateUse1, d);
    if (n == 0) return DataPtr(nullptr, device);
    if (!g_caching_enabled.load(std::memory_order_relaxed)) {
      void* p = nullptr;
      vnpuError_t err = vnpuMalloc(&p, n);
      if (err == vnpuErrorMemoryAllocation) {
        TORCH_CHECK_WITH(OutOfMemoryError, false, "vnpu out of memory allocating ", n,
                         " bytes without the caching allocator (caching_allocator_enable(False))");
      }
      VNPU_CHECK(err);
      return DataPtr(p, p, &uncached_delete, device);
    }
    Block* b = device_allocator(d).malloc(n, getCurrentVNPUStream(d).stream());
    return DataPtr(b->ptr, b->ptr, &delete_block, device);
  }
  DeleterFnPtr raw_deleter() const override { return &delete_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    auto s = getCurrentVNPUStream();
    VNPU_CHECK(vnpuMemcpyAsync(dest, src, count, vnpuMemcpyDeviceToDevice, s.stream()));
    VNPU_CHECK(vnpuStreamSynchronize(s.stream()));  // as CUDA's cudaMemcpy here: no sync debug report
  }
  // As CUDA's: false until the device is initialized, so that torch.accelerator.memory_* answer
  // without initializing it.
  bool initialized() override { return vnpuIsInitialized() != 0; }
  void emptyCache(MempoolId_t) override { allocator::emptyCache(); }
  void recordStream(const DataPtr& ptr, c10::Stream stream) override {
    allocator::recordStream(ptr, VNPUStream(stream));
  }
  DeviceStats getDeviceStats(DeviceIndex d) override { return device_allocator(d).stats(); }
  void resetAccumulatedStats(DeviceIndex d) override { device_allocator(d).reset_accumulated(); }
  void resetPeakStats(DeviceIndex d) override { device_allocator(d).reset_peak(); }
  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex d) override {
    size_t free_b = 0, total = 0;
    DeviceIndex prev = ExchangeDevice(d);
    vnpuError_t err = vnpuMemGetInfo(&free_b, &total);
    set_device(prev);
    VNPU_CHECK(err);
    return {free_b, total};
  }
};

VNPUAllocator* g_allocator = new VNPUAllocator();
std::atomic<c10::DeviceAllocator*> g_current{g_allocator};

// The caching allocator's own APIs (statistics, snapshots, pools) have no meaning for an allocator
// installed with change_current_allocator: raise, as CUDA's pluggable allocator does.
void check_caching(const char* what) {
  TORCH_CHECK(g_current.load() == g_allocator, "the current vnpu allocator (installed with "
              "torch.vnpu.memory.change_current_allocator) does not support ", what,
              "; these statistics and controls belong to vnpu's caching allocator");
}

}  // namespace

c10::DeviceAllocator* get() { return g_current.load(); }

void setCachingEnabled(bool enabled) { g_caching_enabled.store(enabled); }
bool isCachingEnabled() { return g_caching_enabled.load(); }

void changeCurrentAllocator(c10::DeviceAllocator* allocator) {
  TORCH_CHECK(allocator != nullptr, "change_current_allocator: no allocator");
  TORCH_CHECK(!get()->initialized(), "Can't swap an already initialized allocator: call "
              "torch.vnpu.memory.change_current_allocator before the first use of a vnpu device");
  g_current.store(allocator);
  c10::SetAllocator(DeviceType::PrivateUse1, allocator, /*priority=*/1);
}

bool isCachingAllocatorCurrent() { return g_current.load() == g_allocator; }

void recordStream(const DataPtr& ptr, VNPUStream stream) {
  // A copy-on-write DataPtr (torch._lazy_clone) wraps the allocator's: record on the block all the same.
  if (ptr.get() == nullptr || ptr.device().type() != DeviceType::PrivateUse1) return;
  if (ptr.get_deleter() != &delete_block && !c10::impl::cow::is_cow_data_ptr(ptr)) return;
  device_allocator(ptr.device().index()).record_stream(ptr.get(), stream.stream());
}

void emptyCache() {
  // Every device is emptied even if one reports a pending kernel error; the first error is raised.
  std::exception_ptr first;
  for (DeviceIndex d = 0; d < device_count(); ++d) {
    try {
      device_allocator(d).empty_cache();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

DeviceStats getDeviceStats(DeviceIndex d) {
  check_caching("memory statistics");
  return device_allocator(d).stats();
}

void beginAllocateToPool(DeviceIndex device, MempoolId_t id, std::function<bool(vnpuStream_t)> filter) {
  check_caching("graph memory pools");
  device_allocator(device).begin_allocate_to_pool(id, std::move(filter));
}
void endAllocateToPool(DeviceIndex device, MempoolId_t id) { device_allocator(device).end_allocate_to_pool(id); }
void releasePool(DeviceIndex device, MempoolId_t id) { device_allocator(device).release_pool(id); }
int poolUseCount(DeviceIndex device, MempoolId_t id) { return device_allocator(device).pool_use_count(id); }

std::shared_ptr<PoolCheckpoint> getCheckpointState(DeviceIndex device, MempoolId_t id) {
  check_caching("graph pool checkpoints");
  return device_allocator(device).checkpoint_pool(id);
}
CheckpointDelta setCheckpointPoolState(DeviceIndex device, const PoolCheckpoint& state) {
  check_caching("graph pool checkpoints");
  TORCH_CHECK(state.device == device, "a checkpoint of vnpu:", static_cast<int>(state.device),
              "'s graph pool cannot be restored on vnpu:", static_cast<int>(device));
  return device_allocator(device).restore_pool(state);
}
bool checkPoolLiveAllocations(DeviceIndex device, MempoolId_t id, const std::unordered_set<void*>& expected) {
  check_caching("graph pool checkpoints");
  return device_allocator(device).check_pool_live(id, expected);
}
DeleterFnPtr cachingDeleter() { return &delete_block; }

void resetPeakStats(DeviceIndex d) {
  check_caching("resetPeakStats");
  device_allocator(d).reset_peak();
}
void setMemoryFraction(double fraction, DeviceIndex d) {
  check_caching("setMemoryFraction");
  TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction: ", fraction, ". Please set within [0, 1].");
  device_allocator(d).set_memory_fraction(fraction);
}
double getMemoryFraction(DeviceIndex d) { return device_allocator(d).memory_fraction(); }

void* rawAlloc(size_t n, vnpuStream_t stream) {
  check_caching("caching_allocator_alloc");
  int device = -1;
  VNPU_CHECK(vnpuStreamGetDevice(stream, &device));
  return device_allocator(static_cast<DeviceIndex>(device)).raw_alloc(n, stream);
}

void rawDelete(void* ptr) {
  if (ptr == nullptr) return;
  int device = -1;
  TORCH_CHECK(vnpuPointerGetDevice(&device, ptr) == vnpuSuccess && device >= 0, "invalid device pointer: ", ptr);
  device_allocator(static_cast<DeviceIndex>(device)).raw_delete(ptr);
}
void resetAccumulatedStats(DeviceIndex d) {
  check_caching("resetAccumulatedStats");
  device_allocator(d).reset_accumulated();
}

SnapshotInfo snapshot() {
  check_caching("memory snapshots");
  SnapshotInfo out;
  for (DeviceIndex d = 0; d < device_count(); ++d) {
    auto s = device_allocator(d).snapshot();
    out.segments.insert(out.segments.end(), s.begin(), s.end());
    out.device_traces.push_back(device_allocator(d).trace());
  }
  return out;
}

void recordHistory(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                   RecordContext when, bool clear_history, uint32_t skip_actions) {
  for (DeviceIndex d = 0; d < device_count(); ++d)
    device_allocator(d).record_history(enabled, recorder, max_entries, when, clear_history, skip_actions);
}

bool isHistoryEnabled() { return device_count() > 0 && device_allocator(0).history_enabled(); }

void setSanitizerRecorder(c10::CachingDeviceAllocator::CreateContextFn recorder) {
  g_sanitizer_recorder.store(recorder);
}

void takeSanitizerFreeRace(std::shared_ptr<c10::GatheredContext>* allocated,
                           std::shared_ptr<c10::GatheredContext>* dropped) {
  std::lock_guard<std::mutex> g(g_free_race_mu);
  *allocated = std::move(g_free_race_allocated);
  *dropped = std::move(g_free_race_dropped);
  g_free_race_allocated = nullptr;
  g_free_race_dropped = nullptr;
}

std::shared_ptr<c10::GatheredContext> sanitizerContext(DeviceIndex device, const void* ptr) {
  if (device < 0 || device >= device_count()) return nullptr;
  return device_allocator(device).sanitizer_context(ptr);
}

std::shared_ptr<c10::GatheredContext> sanitizerFreedContext(DeviceIndex device, const void* ptr) {
  if (device < 0 || device >= device_count()) return nullptr;
  return device_allocator(device).freed_sanitizer_context(ptr);
}

bool blockContaining(DeviceIndex device, const void* ptr, void** base, size_t* size) {
  if (device < 0 || device >= device_count()) return false;
  return device_allocator(device).block_containing(ptr, base, size);
}

void attachOutOfMemoryObserver(OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> g(g_observers_mu);
  g_oom_observers.push_back(std::move(observer));
}

REGISTER_ALLOCATOR(DeviceType::PrivateUse1, g_allocator);

}  // namespace c10::vnpu::allocator
