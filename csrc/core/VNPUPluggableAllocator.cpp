#include "VNPUPluggableAllocator.h"

#include "VNPUException.h"
#include "VNPUFunctions.h"
#include "VNPUStream.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>

namespace c10::vnpu::allocator {
namespace {

struct Allocation {
  size_t size;
  int device;
  vnpuStream_t stream;
  PluggableFreeFn free;
};

// Live allocations by pointer: the raw deleter only gets the pointer.
std::mutex g_mu;
std::unordered_map<void*, Allocation>& live() {
  static auto* m = new std::unordered_map<void*, Allocation>();  // leaked: deleters may run at exit
  return *m;
}

void pluggable_delete(void* ptr) {
  Allocation a{};
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = live().find(ptr);
    if (it == live().end()) return;
    a = it->second;
    live().erase(it);
  }
  a.free(ptr, a.size, a.device, a.stream);
}

class PluggableAllocator final : public c10::DeviceAllocator {
 public:
  PluggableAllocator(PluggableAllocFn alloc, PluggableFreeFn free) : alloc_(alloc), free_(free) {}

  DataPtr allocate(size_t n) override {
    const DeviceIndex d = current_device();
    const Device device(DeviceType::PrivateUse1, d);
    if (n == 0) return DataPtr(nullptr, device);
    vnpuStream_t stream = getCurrentVNPUStream(d).stream();
    void* p = alloc_(n, d, stream);
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "vnpu out of memory: the pluggable allocator returned no "
                     "memory for ", n, " bytes on vnpu:", static_cast<int>(d));
    {
      std::lock_guard<std::mutex> g(g_mu);
      live()[p] = Allocation{n, d, stream, free_};
    }
    return DataPtr(p, p, &pluggable_delete, device);
  }
  DeleterFnPtr raw_deleter() const override { return &pluggable_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    auto s = getCurrentVNPUStream();
    VNPU_CHECK(vnpuMemcpyAsync(dest, src, count, vnpuMemcpyDeviceToDevice, s.stream()));
    VNPU_CHECK(vnpuStreamSynchronize(s.stream()));
  }
  bool initialized() override { return true; }
  void emptyCache(MempoolId_t) override {}  // nothing cached here
  void recordStream(const DataPtr&, c10::Stream) override {}  // `free` gets the allocation stream, as on CUDA
  CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex) override {
    TORCH_CHECK(false, "VNPUPluggableAllocator does not support memory statistics");
  }
  void resetAccumulatedStats(DeviceIndex) override {
    TORCH_CHECK(false, "VNPUPluggableAllocator does not support resetAccumulatedStats");
  }
  void resetPeakStats(DeviceIndex) override {
    TORCH_CHECK(false, "VNPUPluggableAllocator does not support resetPeakStats");
  }
  // The device's own answer (CUDA's mem_get_info asks cudaMemGetInfo whatever the allocator).
  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex d) override {
    size_t free_b = 0, total = 0;
    DeviceIndex prev = ExchangeDevice(d);
    vnpuError_t err = vnpuMemGetInfo(&free_b, &total);
    set_device(prev);
    VNPU_CHECK(err);
    return {free_b, total};
  }

 private:
  PluggableAllocFn alloc_;
  PluggableFreeFn free_;
};

}  // namespace

c10::DeviceAllocator* createPluggableAllocator(PluggableAllocFn alloc, PluggableFreeFn free) {
  TORCH_CHECK_VALUE(alloc != nullptr && free != nullptr, "VNPUPluggableAllocator needs both functions");
  return new PluggableAllocator(alloc, free);
}

}  // namespace c10::vnpu::allocator
