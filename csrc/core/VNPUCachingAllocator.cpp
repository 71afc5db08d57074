#include "VNPUCachingAllocator.h"

#include <c10/core/impl/COW.h>

#include "VNPUException.h"
#include "VNPUFunctions.h"

#include <c10/util/flat_hash_map.h>

#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace c10::vnpu::allocator {
namespace {

using c10::CachingAllocator::format_size;
using c10::CachingAllocator::StatType;
using c10::CachingAllocator::StatTypes;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlockSize = 512;               // bytes; every block is a multiple
constexpr size_t kSmallSize = 1048576;              // largest "small" request
constexpr size_t kSmallBuffer = 2097152;            // small-pool segment size
constexpr size_t kMinLargeAlloc = 10485760;         // below this, large requests share
constexpr size_t kLargeBuffer = 20971520;           // ... a 20 MiB segment
constexpr size_t kRoundLarge = 2097152;             // large segments round to this

struct Block;
struct BlockComparator {
  bool operator()(const Block* a, const Block* b) const;
};
using BlockPool = std::set<Block*, BlockComparator>;

struct Block {
  DeviceIndex device;
  vnpuStream_t stream;        // allocation stream
  size_t size;                // bytes
  size_t requested = 0;       // bytes asked for (unrounded)
  BlockPool* pool;
  char* ptr;
  bool allocated = false;
  Block* prev = nullptr;      // neighbours within the same segment
  Block* next = nullptr;
  int event_count = 0;        // outstanding recordStream events
  std::set<vnpuStream_t> stream_uses;
  Block(DeviceIndex d, vnpuStream_t s, size_t n, BlockPool* p, char* ptr_)
      : device(d), stream(s), size(n), pool(p), ptr(ptr_) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

bool BlockComparator::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

size_t round_size(size_t n) {
  return n < kMinBlockSize ? kMinBlockSize : (n + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t segment_size(size_t n) {
  if (n <= kSmallSize) return kSmallBuffer;
  if (n < kMinLargeAlloc) return kLargeBuffer;
  return (n + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

class DeviceCachingAllocator {
 public:
  explicit DeviceCachingAllocator(DeviceIndex d) : device_(d) {}

  Block* malloc(size_t orig, vnpuStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    process_events();
    size_t size = round_size(orig);
    BlockPool& pool = size <= kSmallSize ? small_ : large_;
    Block* block = take_free(pool, stream, size);
    if (block == nullptr) block = alloc_segment(pool, stream, size, orig);
    if (should_split(block, size)) {
      auto* rest = new Block(device_, stream, block->size - size, &pool, block->ptr + size);
      rest->prev = block;
      rest->next = block->next;
      if (rest->next) rest->next->prev = rest;
      block->next = rest;
      block->size = size;
      pool.insert(rest);
      update(stats_.inactive_split, pool, rest->size, true, true);
    }
    block->allocated = true;
    block->requested = orig;
    active_[block->ptr] = block;
    update(stats_.allocation, pool, 1, true);
    update(stats_.allocated_bytes, pool, block->size, true);
    update(stats_.active, pool, 1, true);
    update(stats_.active_bytes, pool, block->size, true);
    update(stats_.requested_bytes, pool, orig, true);
    return block;
  }

  void free(Block* block) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    block->allocated = false;
    active_.erase(block->ptr);
    update(stats_.allocation, *block->pool, 1, false);
    update(stats_.allocated_bytes, *block->pool, block->size, false);
    update(stats_.requested_bytes, *block->pool, block->requested, false);
    if (!block->stream_uses.empty()) {
      // Reuse only after every stream that used the block is past this point.
      for (vnpuStream_t s : block->stream_uses) {
        vnpuEvent_t e = nullptr;
        VNPU_CHECK(vnpuEventCreateWithFlags(&e, vnpuEventDisableTiming));
        VNPU_CHECK(vnpuEventRecord(e, s));
        ++block->event_count;
        events_.emplace_back(e, block);
      }
      block->stream_uses.clear();
      return;
    }
    free_block(block);
  }

  // Frees the block that starts at `ptr` (the DataPtr's deleter).
  void free_ptr(void* ptr) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = active_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != active_.end(), "vnpu caching allocator: freeing an unknown pointer ", ptr);
    free(it->second);
  }

  void record_stream(void* ptr, vnpuStream_t stream) {
    std::lock_guard<std::recursive_mutex> g(mu_);
    auto it = active_.find(ptr);
    if (it == active_.end()) return;  // freed already, or not the start of a block
    if (it->second->stream != stream) it->second->stream_uses.insert(stream);
  }

  void empty_cache() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    for (auto& [e, b] : events_) VNPU_CHECK(vnpuEventSynchronize(e));
    process_events();
    release(small_);
    release(large_);
  }

  DeviceStats stats() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    return stats_;
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

  std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot() {
    std::lock_guard<std::recursive_mutex> g(mu_);
    std::vector<c10::CachingDeviceAllocator::SegmentInfo> out;
    for (Block* head : segments_) {
      c10::CachingDeviceAllocator::SegmentInfo seg;
      seg.device = device_;
      seg.address = reinterpret_cast<size_t>(head->ptr);
      seg.stream = head->stream;
      seg.is_large = head->pool == &large_;
      for (Block* b = head; b != nullptr; b = b->next) {
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = b->size;
        bi.requested_size = b->requested;
        bi.allocated = b->allocated;
        bi.active = b->allocated || b->event_count > 0;
        seg.total_size += b->size;
        if (b->allocated) {
          seg.allocated_size += b->size;
          seg.requested_size += b->requested;
        }
        if (bi.active) seg.active_size += b->size;
        seg.blocks.push_back(bi);
      }
      out.push_back(std::move(seg));
    }
    return out;
  }

 private:
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

  void update(c10::CachingAllocator::StatArray& arr, const BlockPool& pool, size_t amount,
              bool increase, bool split_bytes = false) {
    StatTypes types{};
    types[static_cast<size_t>(StatType::AGGREGATE)] = true;
    types[static_cast<size_t>(&pool == &small_ ? StatType::SMALL_POOL : StatType::LARGE_POOL)] = true;
    c10::CachingAllocator::for_each_selected_stat_type(types, [&](size_t t) {
      if (increase) arr[t].increase(amount); else arr[t].decrease(amount);
    });
    if (split_bytes) {
      c10::CachingAllocator::for_each_selected_stat_type(types, [&](size_t t) {
        if (increase) stats_.inactive_split_bytes[t].increase(amount);
        else stats_.inactive_split_bytes[t].decrease(amount);
      });
    }
  }

  Block* take_free(BlockPool& pool, vnpuStream_t stream, size_t size) {
    Block key(device_, stream, size, &pool, nullptr);
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    // Don't hand a huge cached block to a small request (fragmentation).
    if (&pool == &large_ && (*it)->size > size + kLargeBuffer && !(*it)->is_split()) {
      if ((*it)->size >= size * 2) return nullptr;
    }
    Block* b = *it;
    pool.erase(it);
    if (b->is_split()) update(stats_.inactive_split, pool, b->size, false, true);
    return b;
  }

  bool should_split(const Block* b, size_t size) const {
    size_t rest = b->size - size;
    return b->pool == &small_ ? rest >= kMinBlockSize : rest > kSmallSize;
  }

  Block* alloc_segment(BlockPool& pool, vnpuStream_t stream, size_t size, size_t orig) {
    size_t n = segment_size(size);
    void* ptr = nullptr;
    vnpuError_t err = device_malloc(&ptr, n);
    if (err == vnpuErrorMemoryAllocation) {
      // Free every cached segment and retry once, as CUDA's allocator does.
      ++stats_.num_alloc_retries;
      for (auto& [e, b] : events_) vnpuEventSynchronize(e);
      process_events();
      release(small_);
      release(large_);
      err = device_malloc(&ptr, n);
    }
    if (err == vnpuErrorMemoryAllocation) {
      ++stats_.num_ooms;
      size_t free_b = 0, total = 0;
      DeviceIndex prev = ExchangeDevice(device_);
      vnpuMemGetInfo(&free_b, &total);
      set_device(prev);
      const auto& agg = static_cast<size_t>(StatType::AGGREGATE);
      size_t allocated = stats_.allocated_bytes[agg].current;
      size_t reserved = stats_.reserved_bytes[agg].current;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "vNPU out of memory. Tried to allocate ",
                       format_size(orig), ". vnpu:", int(device_), " has a total capacity of ",
                       format_size(total), " of which ", format_size(free_b),
                       " is free. Of the allocated memory ", format_size(allocated),
                       " is allocated by PyTorch, and ", format_size(reserved - allocated),
                       " is reserved by PyTorch but unallocated (reserved in total: ",
                       format_size(reserved),
                       "). Free tensors you no longer need, lower the batch size, or raise "
                       "VNPU_MEMORY_PER_DEVICE (bytes; K/M/G suffixes).");
    }
    VNPU_CHECK(err);
    ++stats_.num_device_alloc;
    auto* b = new Block(device_, stream, n, &pool, static_cast<char*>(ptr));
    segments_.insert(b);
    update(stats_.segment, pool, 1, true);
    update(stats_.reserved_bytes, pool, n, true);
    return b;
  }

  vnpuError_t device_malloc(void** ptr, size_t n) {
    DeviceIndex prev = ExchangeDevice(device_);
    vnpuError_t err = vnpuMalloc(ptr, n);
    set_device(prev);
    return err;
  }

  void free_block(Block* block) {
    BlockPool& pool = *block->pool;
    update(stats_.active, pool, 1, false);
    update(stats_.active_bytes, pool, block->size, false);
    for (Block* nb : {block->prev, block->next}) {
      if (nb == nullptr || nb->allocated || nb->event_count > 0) continue;
      pool.erase(nb);
      update(stats_.inactive_split, pool, nb->size, false, true);
      if (nb == block->prev) {
        block->ptr = nb->ptr;
        block->prev = nb->prev;
        if (block->prev) block->prev->next = block;
        segments_.erase(nb);
        if (block->prev == nullptr) segments_.insert(block);
      } else {
        block->next = nb->next;
        if (block->next) block->next->prev = block;
      }
      block->size += nb->size;
      delete nb;
    }
    if (block->is_split()) update(stats_.inactive_split, pool, block->size, true, true);
    pool.insert(block);
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

  void release(BlockPool& pool) {
    for (auto it = pool.begin(); it != pool.end();) {
      Block* b = *it;
      if (b->is_split()) {
        ++it;
        continue;
      }
      it = pool.erase(it);
      VNPU_CHECK(vnpuFree(b->ptr));  // synchronizes the device, like cudaFree
      ++stats_.num_device_free;
      update(stats_.segment, pool, 1, false);
      update(stats_.reserved_bytes, pool, b->size, false);
      segments_.erase(b);
      delete b;
    }
  }

  DeviceIndex device_;
  std::recursive_mutex mu_;  // guards everything below
  BlockPool small_, large_;
  ska::flat_hash_map<void*, Block*> active_;           // allocated blocks by pointer
  std::set<Block*> segments_;                          // first block of each segment
  std::deque<std::pair<vnpuEvent_t, Block*>> events_;  // pending recordStream events
  DeviceStats stats_;
};

DeviceCachingAllocator& device_allocator(DeviceIndex d) {
  static std::vector<std::unique_ptr<DeviceCachingAllocator>>* all = [] {
    auto* v = new std::vector<std::unique_ptr<DeviceCachingAllocator>>();  // never freed: see below
    for (DeviceIndex i = 0; i < device_count(); ++i) v->emplace_back(new DeviceCachingAllocator(i));
    return v;
  }();
  check_device_index(d);
  return *(*all)[d];
}

// The DataPtr's context is its data pointer, as CUDA's caching allocator does:
// storages with such "simple" DataPtrs can be lazily cloned (copy-on-write,
// torch._lazy_clone), which wraps the DataPtr and calls this deleter later.
void delete_block(void* ptr) {
  vnpuPointerAttributes attr{};
  VNPU_CHECK(vnpuPointerGetAttributes(&attr, ptr));
  TORCH_INTERNAL_ASSERT(attr.type == vnpuMemoryTypeDevice && attr.device >= 0);
  device_allocator(static_cast<DeviceIndex>(attr.device)).free_ptr(ptr);
}

// Tensors may die during interpreter shutdown: the allocator is intentionally
// leaked so their deleters never see a destroyed allocator.
class VNPUAllocator final : public c10::DeviceAllocator {
 public:
  DataPtr allocate(size_t n) override {
    DeviceIndex d = current_device();
    Device device(DeviceType::PrivateUse1, d);
    if (n == 0) return DataPtr(nullptr, device);
    Block* b = device_allocator(d).malloc(n, getCurrentVNPUStream(d).stream());
    return DataPtr(b->ptr, b->ptr, &delete_block, device);
  }
  DeleterFnPtr raw_deleter() const override { return &delete_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    auto s = getCurrentVNPUStream();
    VNPU_CHECK(vnpuMemcpyAsync(dest, src, count, vnpuMemcpyDeviceToDevice, s.stream()));
    s.synchronize();
  }
  bool initialized() override { return true; }
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

}  // namespace

c10::DeviceAllocator* get() { return g_allocator; }

void recordStream(const DataPtr& ptr, VNPUStream stream) {
  // A copy-on-write DataPtr (torch._lazy_clone) wraps the allocator's: record on the block all the same.
  if (ptr.get() == nullptr || ptr.device().type() != DeviceType::PrivateUse1) return;
  if (ptr.get_deleter() != &delete_block && !c10::impl::cow::is_cow_data_ptr(ptr)) return;
  device_allocator(ptr.device().index()).record_stream(ptr.get(), stream.stream());
}

void emptyCache() {
  for (DeviceIndex d = 0; d < device_count(); ++d) device_allocator(d).empty_cache();
}

DeviceStats getDeviceStats(DeviceIndex d) { return device_allocator(d).stats(); }
void resetPeakStats(DeviceIndex d) { device_allocator(d).reset_peak(); }
void resetAccumulatedStats(DeviceIndex d) { device_allocator(d).reset_accumulated(); }

std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot() {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> out;
  for (DeviceIndex d = 0; d < device_count(); ++d) {
    auto s = device_allocator(d).snapshot();
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

REGISTER_ALLOCATOR(DeviceType::PrivateUse1, g_allocator);

}  // namespace c10::vnpu::allocator
