#include "VNPUHostAllocator.h"

#include "VNPUException.h"
#include "VNPUStream.h"

namespace std {
template <>
struct hash<c10::vnpu::VNPUStream> {
  size_t operator()(const c10::vnpu::VNPUStream& s) const noexcept { return std::hash<c10::Stream>{}(s.unwrap()); }
};
}  // namespace std

namespace at::vnpu {
namespace {

// Owning, movable event handle (the allocator template moves events around).
struct HostEvent {
  vnpuEvent_t e = nullptr;
  HostEvent() { VNPU_CHECK(vnpuEventCreateWithFlags(&e, vnpuEventDisableTiming)); }
  HostEvent(HostEvent&& o) noexcept : e(std::exchange(o.e, nullptr)) {}
  HostEvent& operator=(HostEvent&& o) noexcept {
    std::swap(e, o.e);
    return *this;
  }
  HostEvent(const HostEvent&) = delete;
  ~HostEvent() {
    if (e != nullptr) vnpuEventDestroy(e);
  }
};

using Stream = c10::vnpu::VNPUStream;

struct VNPUCachingHostAllocatorImpl : public at::CachingHostAllocatorImpl<Stream, HostEvent> {
 private:
  void allocate_host_memory(size_t size, void** ptr) override { VNPU_CHECK(vnpuMallocHost(ptr, size)); }
  void free_block(at::HostBlock<Stream>* block) override { VNPU_CHECK(vnpuFreeHost(block->ptr_)); }
  void record_stream(std::optional<std::vector<HostEvent>>& events, Stream stream) override {
    HostEvent ev;
    VNPU_CHECK(vnpuEventRecord(ev.e, stream.stream()));
    events->push_back(std::move(ev));
  }
  bool query_event(HostEvent& event) override { return vnpuEventQuery(event.e) == vnpuSuccess; }
  Stream get_current_stream() const override { return c10::vnpu::getCurrentVNPUStream(); }
  // While a graph captures, PyTorch's host allocator keeps blocks used by the capture until it ends (an event
  // recorded then would be part of the graph).
  bool stream_is_capturing(Stream stream) const override {
    vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
    return vnpuStreamIsCapturing(stream.stream(), &status) == vnpuSuccess && status != vnpuStreamCaptureStatusNone;
  }
};

void raw_local_deleter(void* ptr);

struct VNPUCachingHostAllocator final
    : public at::CachingHostAllocatorInterface<VNPUCachingHostAllocatorImpl, raw_local_deleter> {};

VNPUCachingHostAllocator* g_host_allocator = new VNPUCachingHostAllocator();  // leaked: see device allocator

void raw_local_deleter(void* ptr) { g_host_allocator->free(ptr); }

}  // namespace

at::HostAllocator* getVNPUHostAllocator() { return g_host_allocator; }

bool isPinnedPtr(const void* ptr) {
  vnpuPointerAttributes attr{};
  return vnpuPointerGetAttributes(&attr, ptr) == vnpuSuccess && attr.type == vnpuMemoryTypeHost;
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, g_host_allocator)

}  // namespace at::vnpu
