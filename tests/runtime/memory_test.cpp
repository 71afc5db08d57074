// Device memory (fixed-capacity region per device), pinned host memory and
// pointer attributes.
#include "test_util.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

using namespace vnpu_test;

namespace {

constexpr size_t kPage = 4096;  // the documented allocation alignment (bytes)

// ---- child scenarios (see Note [Child scenarios]) -------------------------

// Expects a capacity of VNPU_TEST_EXPECT_TOTAL bytes on every device and an
// allocator that enforces it.
VNPU_CHILD_SCENARIO(CapacityFromEnv) {
  const size_t expected = std::strtoull(std::getenv("VNPU_TEST_EXPECT_TOTAL"), nullptr, 10);
  size_t free_b = 0, total_b = 0;
  CHILD_CHECK_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuSuccess);
  CHILD_CHECK_EQ(total_b, expected);
  CHILD_CHECK_EQ(free_b, expected);
  vnpuDeviceProp p{};
  CHILD_CHECK_EQ(vnpuGetDeviceProperties(&p, 1), vnpuSuccess);
  CHILD_CHECK_EQ(p.totalGlobalMem, expected);
  void* a = nullptr;
  void* b = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&a, expected), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMalloc(&b, 1), vnpuErrorMemoryAllocation);
  CHILD_CHECK_EQ(vnpuFree(a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMalloc(&b, 1), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFree(b), vnpuSuccess);
  return 0;
}

using MemoryTest = RuntimeTest;

size_t FreeBytes() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuSuccess);
  return free_b;
}
size_t TotalBytes() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuSuccess);
  return total_b;
}

// ---- allocation -------------------------------------------------------------

TEST_F(MemoryTest, MallocReturnsAlignedDisjointBlocks) {
  std::vector<void*> ptrs;
  const size_t sizes[] = {1, 100, kPage, kPage + 1, 3 * kPage, 1 << 20};
  for (size_t n : sizes) {
    void* p = nullptr;
    ASSERT_EQ(vnpuMalloc(&p, n), vnpuSuccess) << n << " bytes";
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kPage, 0u) << "not 4096-byte aligned";
    ptrs.push_back(p);
  }
  // No two blocks overlap.
  for (size_t i = 0; i < ptrs.size(); ++i) {
    for (size_t j = 0; j < ptrs.size(); ++j) {
      if (i == j) continue;
      auto a = reinterpret_cast<uintptr_t>(ptrs[i]);
      auto b = reinterpret_cast<uintptr_t>(ptrs[j]);
      EXPECT_TRUE(a + sizes[i] <= b || b + sizes[j] <= a) << "blocks " << i << " and " << j << " overlap";
    }
  }
  for (void* p : ptrs) EXPECT_EQ(vnpuFree(p), vnpuSuccess);
}

TEST_F(MemoryTest, MallocEdgeCases) {
  EXPECT_EQ(vnpuMalloc(nullptr, 64), vnpuErrorInvalidValue);
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(vnpuMalloc(&p, 0), vnpuSuccess);
  EXPECT_EQ(p, nullptr) << "a zero-byte allocation returns a null pointer (like cudaMalloc)";
  EXPECT_EQ(vnpuFree(nullptr), vnpuSuccess);
}

TEST_F(MemoryTest, MemGetInfoAccountsForEveryAllocation) {
  const size_t total = TotalBytes();
  const size_t before = FreeBytes();
  EXPECT_LE(before, total);
  EXPECT_EQ(vnpuMemGetInfo(nullptr, nullptr), vnpuErrorInvalidValue);

  void* a = nullptr;
  ASSERT_EQ(vnpuMalloc(&a, 1 << 20), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), before - (1 << 20));
  void* b = nullptr;
  ASSERT_EQ(vnpuMalloc(&b, 1000), vnpuSuccess);  // charged at least its size, at most one page
  size_t after_b = FreeBytes();
  EXPECT_GE(before - (1 << 20) - after_b, 1000u);
  EXPECT_LE(before - (1 << 20) - after_b, kPage);
  EXPECT_EQ(TotalBytes(), total) << "total capacity must not change";

  ASSERT_EQ(vnpuFree(a), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), after_b + (1 << 20));
  ASSERT_EQ(vnpuFree(b), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), before);
}

TEST_F(MemoryTest, ExceedingCapacityFailsAndRecoversAfterFree) {
  const size_t total = TotalBytes();
  ASSERT_EQ(FreeBytes(), total) << "another test leaked device memory";

  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(vnpuMalloc(&p, total + 1), vnpuErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);

  // The whole capacity can be taken in one block (address space is reserved
  // up front, RAM is only used when touched)...
  void* all = nullptr;
  ASSERT_EQ(vnpuMalloc(&all, total), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), 0u);
  // ...after which even one byte fails, cleanly.
  void* one = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(vnpuMalloc(&one, 1), vnpuErrorMemoryAllocation);
  EXPECT_EQ(one, nullptr);
  // The failure is not sticky and does not poison the device.
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);

  ASSERT_EQ(vnpuFree(all), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), total);
  ASSERT_EQ(vnpuMalloc(&one, 1), vnpuSuccess);
  EXPECT_NE(one, nullptr);
  EXPECT_EQ(vnpuFree(one), vnpuSuccess);
}

TEST_F(MemoryTest, HugeRequestsFailInsteadOfWrappingAround) {
  // Sizes near SIZE_MAX must not overflow while being rounded up to a page.
  const size_t free_before = FreeBytes();
  for (size_t n : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 1,
                   std::numeric_limits<size_t>::max() - kPage + 2}) {
    void* p = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(vnpuMalloc(&p, n), vnpuErrorMemoryAllocation) << n << " bytes";
    EXPECT_EQ(p, nullptr);
    if (p != nullptr && p != reinterpret_cast<void*>(0x1)) vnpuFree(p);
  }
  EXPECT_EQ(FreeBytes(), free_before);
}

TEST_F(MemoryTest, FreedNeighboursCoalesce) {
  const size_t total = TotalBytes();
  ASSERT_EQ(FreeBytes(), total) << "another test leaked device memory";
  ASSERT_EQ(total % (4 * kPage), 0u) << "capacity not divisible into four page-aligned quarters";
  const size_t q = total / 4;
  void* blk[4] = {};
  for (auto& b : blk) ASSERT_EQ(vnpuMalloc(&b, q), vnpuSuccess);
  ASSERT_EQ(FreeBytes(), 0u);

  // Two adjacent quarters freed in either order form one half-size hole.
  ASSERT_EQ(vnpuFree(blk[2]), vnpuSuccess);
  ASSERT_EQ(vnpuFree(blk[1]), vnpuSuccess);
  void* half = nullptr;
  ASSERT_EQ(vnpuMalloc(&half, 2 * q), vnpuSuccess);
  EXPECT_EQ(half, std::min(blk[1], blk[2]));
  ASSERT_EQ(vnpuFree(half), vnpuSuccess);

  // Everything freed: the full capacity is one block again.
  ASSERT_EQ(vnpuFree(blk[0]), vnpuSuccess);
  ASSERT_EQ(vnpuFree(blk[3]), vnpuSuccess);
  void* all = nullptr;
  ASSERT_EQ(vnpuMalloc(&all, total), vnpuSuccess);
  EXPECT_EQ(vnpuFree(all), vnpuSuccess);
}

TEST_F(MemoryTest, FreeRejectsPointersItDidNotAllocate) {
  void* p = nullptr;
  ASSERT_EQ(vnpuMalloc(&p, 2 * kPage), vnpuSuccess);
  int host = 0;
  EXPECT_EQ(vnpuFree(&host), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuFree(static_cast<char*>(p) + kPage), vnpuErrorInvalidValue) << "interior pointer";
  const size_t free_mid = FreeBytes();
  ASSERT_EQ(vnpuFree(p), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), free_mid + 2 * kPage);
  EXPECT_EQ(vnpuFree(p), vnpuErrorInvalidValue) << "double free";
  EXPECT_EQ(FreeBytes(), free_mid + 2 * kPage) << "a rejected free changed the accounting";
}

TEST_F(MemoryTest, FreeWaitsForQueuedWork) {
  std::atomic<bool> kernel_done{false};
  Stream s;
  void* p = nullptr;
  ASSERT_EQ(vnpuMalloc(&p, 64), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "slow_writer",
                             [p, &kernel_done] {
                               std::this_thread::sleep_for(30ms);
                               static_cast<int*>(p)[0] = 1;
                               kernel_done = true;
                             }),
            vnpuSuccess);
  ASSERT_EQ(vnpuFree(p), vnpuSuccess);
  EXPECT_TRUE(kernel_done.load()) << "vnpuFree returned while a kernel could still touch the block";
}

TEST_F(MemoryTest, EachDeviceHasItsOwnRegion) {
  VNPU_REQUIRE_DEVICES(2);
  const size_t free0 = FreeBytes();
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  const size_t free1 = FreeBytes();
  void* p = nullptr;
  ASSERT_EQ(vnpuMalloc(&p, 1 << 20), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), free1 - (1 << 20));
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), free0) << "an allocation on device 1 was charged to device 0";
  vnpuPointerAttributes a{};
  ASSERT_EQ(vnpuPointerGetAttributes(&a, p), vnpuSuccess);
  EXPECT_EQ(a.device, 1);
  // vnpuFree finds the owning device whatever the current one is.
  EXPECT_EQ(vnpuFree(p), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), free1);
  int cur = -1;
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuGetDevice(&cur), vnpuSuccess);
  EXPECT_EQ(cur, 0);
}

TEST_F(MemoryTest, ConcurrentMallocAndFreeAreConsistent) {
  const size_t before = FreeBytes();
  std::atomic<int> failures{0};
  auto worker = [&failures](int seed) {
    std::vector<void*> mine;
    for (int i = 0; i < 300; ++i) {
      void* p = nullptr;
      size_t n = kPage * (1 + (seed * 31 + i) % 7);
      if (vnpuMalloc(&p, n) != vnpuSuccess) {
        ++failures;
        continue;
      }
      // Tag the block; an overlapping block from another thread would clobber it.
      *static_cast<uint64_t*>(p) = (uint64_t(seed) << 32) | uint64_t(i);
      mine.push_back(p);
      if (i % 3 == 2) {
        void* q = mine[mine.size() / 2];
        mine.erase(mine.begin() + static_cast<long>(mine.size() / 2));
        if (vnpuFree(q) != vnpuSuccess) ++failures;
      }
    }
    for (void* p : mine) {
      uint64_t tag = *static_cast<uint64_t*>(p);
      if ((tag >> 32) != uint64_t(seed)) ++failures;
      if (vnpuFree(p) != vnpuSuccess) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(FreeBytes(), before);
}

TEST(MemoryEnvTest, CapacityFromEnvironment) {
  EXPECT_EQ(RunScenario("CapacityFromEnv",
                        {"VNPU_MEMORY_PER_DEVICE=1M", "VNPU_TEST_EXPECT_TOTAL=1048576"}), 0);
  EXPECT_EQ(RunScenario("CapacityFromEnv",
                        {"VNPU_MEMORY_PER_DEVICE=64m", "VNPU_TEST_EXPECT_TOTAL=67108864"}), 0);
  EXPECT_EQ(RunScenario("CapacityFromEnv",
                        {"VNPU_MEMORY_PER_DEVICE=8192", "VNPU_TEST_EXPECT_TOTAL=8192"}), 0);
  EXPECT_EQ(RunScenario("CapacityFromEnv",
                        {"VNPU_MEMORY_PER_DEVICE=1.5G", "VNPU_TEST_EXPECT_TOTAL=1610612736"}), 0);
  EXPECT_EQ(RunScenario("CapacityFromEnv",
                        {"VNPU_MEMORY_PER_DEVICE=", "VNPU_TEST_EXPECT_TOTAL=8589934592"}), 0);  // empty: default
  // Unparseable values are configuration errors (device_test.cpp), not silently the default.
}

// ---- pinned host memory ------------------------------------------------------

TEST_F(MemoryTest, PinnedHostMemory) {
  void* p = nullptr;
  ASSERT_EQ(vnpuMallocHost(&p, 10000), vnpuSuccess);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kPage, 0u);
  std::memset(p, 0x5a, 10000);  // ordinary host memory: the host may touch it
  EXPECT_EQ(vnpuFreeHost(p), vnpuSuccess);
  EXPECT_EQ(vnpuFreeHost(p), vnpuErrorInvalidValue) << "double free";
  EXPECT_EQ(vnpuFreeHost(nullptr), vnpuSuccess);
  EXPECT_EQ(vnpuMallocHost(nullptr, 8), vnpuErrorInvalidValue);
  ASSERT_EQ(vnpuMallocHost(&p, 0), vnpuSuccess);
  EXPECT_EQ(p, nullptr);
}

TEST_F(MemoryTest, FreeHostRejectsOtherMemory) {
  std::vector<char> pageable(64);
  EXPECT_EQ(vnpuFreeHost(pageable.data()), vnpuErrorInvalidValue);
  DeviceBuffer d(64);
  EXPECT_EQ(vnpuFreeHost(d.get()), vnpuErrorInvalidValue);
  void* p = nullptr;
  ASSERT_EQ(vnpuMallocHost(&p, 2 * kPage), vnpuSuccess);
  EXPECT_EQ(vnpuFreeHost(static_cast<char*>(p) + kPage), vnpuErrorInvalidValue) << "interior pointer";
  EXPECT_EQ(vnpuFreeHost(p), vnpuSuccess);
}

TEST_F(MemoryTest, HugePinnedRequestsFail) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(vnpuMallocHost(&p, std::numeric_limits<size_t>::max()), vnpuErrorMemoryAllocation);
  if (p != nullptr && p != reinterpret_cast<void*>(0x1)) vnpuFreeHost(p);
}

// ---- pointer attributes -------------------------------------------------------

TEST_F(MemoryTest, PointerAttributesOfDeviceMemory) {
  DeviceBuffer d(3 * kPage);
  vnpuPointerAttributes a{};
  ASSERT_EQ(vnpuPointerGetAttributes(&a, d.get()), vnpuSuccess);
  EXPECT_EQ(a.type, vnpuMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  EXPECT_EQ(a.base, d.get());
  EXPECT_EQ(a.size, 3 * kPage);
  // An interior pointer reports the allocation containing it.
  ASSERT_EQ(vnpuPointerGetAttributes(&a, d.as<char>() + 2 * kPage + 17), vnpuSuccess);
  EXPECT_EQ(a.type, vnpuMemoryTypeDevice);
  EXPECT_EQ(a.base, d.get());
  EXPECT_EQ(a.size, 3 * kPage);
}

TEST_F(MemoryTest, PointerGetDeviceNamesTheOwningDevice) {
  DeviceBuffer d(3 * kPage);
  int dev = -2;
  ASSERT_EQ(vnpuPointerGetDevice(&dev, d.as<char>() + 2 * kPage + 17), vnpuSuccess);
  EXPECT_EQ(dev, 0);
  int host = 0;
  ASSERT_EQ(vnpuPointerGetDevice(&dev, &host), vnpuSuccess);
  EXPECT_EQ(dev, -1);
  EXPECT_EQ(vnpuPointerGetDevice(nullptr, d.get()), vnpuErrorInvalidValue);
  if (device_count_ < 2) return;
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  DeviceBuffer d1(64);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuPointerGetDevice(&dev, d1.get()), vnpuSuccess);
  EXPECT_EQ(dev, 1);
}

TEST_F(MemoryTest, PointerAttributesOfOtherDevice) {
  VNPU_REQUIRE_DEVICES(2);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  DeviceBuffer d(64);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  vnpuPointerAttributes a{};
  ASSERT_EQ(vnpuPointerGetAttributes(&a, d.get()), vnpuSuccess);
  EXPECT_EQ(a.type, vnpuMemoryTypeDevice);
  EXPECT_EQ(a.device, 1);
  EXPECT_EQ(a.base, d.get());
  EXPECT_GE(a.size, 64u);
}

TEST_F(MemoryTest, PointerAttributesOfPinnedMemory) {
  PinnedBuffer h(1000);
  vnpuPointerAttributes a{};
  ASSERT_EQ(vnpuPointerGetAttributes(&a, h.get()), vnpuSuccess);
  EXPECT_EQ(a.type, vnpuMemoryTypeHost);
  EXPECT_EQ(a.device, -1);
  EXPECT_EQ(a.base, h.get());
  EXPECT_GE(a.size, 1000u);
  ASSERT_EQ(vnpuPointerGetAttributes(&a, h.as<char>() + 999), vnpuSuccess);
  EXPECT_EQ(a.type, vnpuMemoryTypeHost);
  EXPECT_EQ(a.base, h.get());
}

TEST_F(MemoryTest, PointerAttributesOfPageableMemory) {
  std::vector<int> heap(16);
  int stack = 0;
  for (const void* p : {static_cast<const void*>(heap.data()), static_cast<const void*>(&stack),
                        static_cast<const void*>(nullptr)}) {
    vnpuPointerAttributes a{vnpuMemoryTypeDevice, 7, reinterpret_cast<void*>(0x1), 9};
    ASSERT_EQ(vnpuPointerGetAttributes(&a, p), vnpuSuccess);
    EXPECT_EQ(a.type, vnpuMemoryTypeUnregistered);
    EXPECT_EQ(a.device, -1);
    EXPECT_EQ(a.base, nullptr);
    EXPECT_EQ(a.size, 0u);
  }
  EXPECT_EQ(vnpuPointerGetAttributes(nullptr, heap.data()), vnpuErrorInvalidValue);
}

TEST_F(MemoryTest, PointerAttributesAfterFree) {
  void* d = nullptr;
  ASSERT_EQ(vnpuMalloc(&d, 64), vnpuSuccess);
  ASSERT_EQ(vnpuFree(d), vnpuSuccess);
  vnpuPointerAttributes a{};
  ASSERT_EQ(vnpuPointerGetAttributes(&a, d), vnpuSuccess);
  EXPECT_NE(a.type, vnpuMemoryTypeDevice) << "a freed block still reported as an allocation";
  void* h = nullptr;
  ASSERT_EQ(vnpuMallocHost(&h, 64), vnpuSuccess);
  ASSERT_EQ(vnpuFreeHost(h), vnpuSuccess);
  ASSERT_EQ(vnpuPointerGetAttributes(&a, h), vnpuSuccess);
  EXPECT_EQ(a.type, vnpuMemoryTypeUnregistered);
}

}  // namespace

// ---- inter-process memory (vnpuIpc*) --------------------------------------

namespace {

std::string ToHex(const vnpuIpcMemHandle_t& h) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : h.reserved) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

vnpuIpcMemHandle_t FromHex(const char* s) {
  vnpuIpcMemHandle_t h{};
  for (size_t i = 0; i < sizeof(h.reserved) && s[2 * i] && s[2 * i + 1]; ++i) {
    auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    h.reserved[i] = static_cast<char>(v(s[2 * i]) * 16 + v(s[2 * i + 1]));
  }
  return h;
}

// Another process maps the exporter's device memory: reads the pattern the
// parent wrote, checks that a second allocation translates by the same offset,
// and writes an answer the parent then reads.
VNPU_CHILD_SCENARIO(IpcOpenInChild) {
  vnpuIpcMemHandle_t h = FromHex(std::getenv("VNPU_TEST_IPC_HANDLE"));
  const size_t second = std::strtoull(std::getenv("VNPU_TEST_IPC_SECOND"), nullptr, 10);
  void* p = nullptr;
  CHILD_CHECK_EQ(vnpuIpcOpenMemHandle(&p, h, vnpuIpcMemLazyEnablePeerAccess), vnpuSuccess);
  auto* bytes = static_cast<unsigned char*>(p);
  for (int i = 0; i < 4096; ++i) CHILD_CHECK_EQ(bytes[i], static_cast<unsigned char>(i * 7));
  void* q = nullptr;  // a second open shares the mapping
  CHILD_CHECK_EQ(vnpuIpcOpenMemHandle(&q, h, 0), vnpuSuccess);
  CHILD_CHECK(q == p);
  CHILD_CHECK_EQ(bytes[second], 0x5a);  // an allocation the handle did not name
  // Opened memory is device memory of the device current at the open (as CUDA's): copies accept it.
  vnpuPointerAttributes attr{};
  CHILD_CHECK_EQ(vnpuPointerGetAttributes(&attr, bytes + 16), vnpuSuccess);
  CHILD_CHECK_EQ(attr.type, vnpuMemoryTypeDevice);
  CHILD_CHECK_EQ(attr.device, 0);
  unsigned char host[8] = {0};
  CHILD_CHECK_EQ(vnpuMemcpy(host, bytes + 8, sizeof(host), vnpuMemcpyDeviceToHost), vnpuSuccess);
  for (int i = 0; i < 8; ++i) CHILD_CHECK_EQ(host[i], static_cast<unsigned char>((8 + i) * 7));
  for (int i = 0; i < 4096; ++i) bytes[i] = static_cast<unsigned char>(255 - i % 256);
  CHILD_CHECK_EQ(vnpuIpcCloseMemHandle(q), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuIpcCloseMemHandle(p), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuIpcCloseMemHandle(p), vnpuErrorInvalidValue);  // closed already
  CHILD_CHECK_EQ(vnpuPointerGetAttributes(&attr, p), vnpuSuccess);
  CHILD_CHECK_EQ(attr.type, vnpuMemoryTypeUnregistered);  // unmapped: no longer device memory
  return 0;
}

}  // namespace

TEST_F(RuntimeTest, IpcHandleMapsDeviceMemoryInAnotherProcess) {
  DeviceBuffer a(4096), b(4096);
  auto* pa = static_cast<unsigned char*>(a.get());
  for (int i = 0; i < 4096; ++i) pa[i] = static_cast<unsigned char>(i * 7);
  static_cast<unsigned char*>(b.get())[0] = 0x5a;
  vnpuIpcMemHandle_t h{};
  ASSERT_EQ(vnpuIpcGetMemHandle(&h, a.get()), vnpuSuccess);
  // In this process the handle opens to the exported pointer itself.
  void* self = nullptr;
  ASSERT_EQ(vnpuIpcOpenMemHandle(&self, h, 0), vnpuSuccess);
  EXPECT_EQ(self, a.get());
  EXPECT_EQ(vnpuIpcCloseMemHandle(self), vnpuSuccess);
  const auto second = static_cast<char*>(b.get()) - static_cast<char*>(a.get());
  ASSERT_EQ(RunScenario("IpcOpenInChild", {"VNPU_TEST_IPC_HANDLE=" + ToHex(h),
                                           "VNPU_TEST_IPC_SECOND=" + std::to_string(second)}),
            0);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(pa[i], static_cast<unsigned char>(255 - i % 256)) << i;
}

TEST_F(RuntimeTest, IpcRejectsBadArguments) {
  vnpuIpcMemHandle_t h{};
  int host = 0;
  EXPECT_EQ(vnpuIpcGetMemHandle(&h, &host), vnpuErrorInvalidValue);  // not device memory
  EXPECT_EQ(vnpuIpcGetMemHandle(nullptr, nullptr), vnpuErrorInvalidValue);
  void* p = nullptr;
  EXPECT_EQ(vnpuIpcOpenMemHandle(&p, h, 0), vnpuErrorInvalidValue);  // zeros: not a handle
  EXPECT_EQ(vnpuIpcCloseMemHandle(&host), vnpuErrorInvalidValue);
}

namespace {
VNPU_CHILD_SCENARIO(IpcDisabled) {
  void* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&p, 4096), vnpuSuccess);
  vnpuIpcMemHandle_t h{};
  CHILD_CHECK_EQ(vnpuIpcGetMemHandle(&h, p), vnpuErrorNotSupported);
  CHILD_CHECK_EQ(vnpuFree(p), vnpuSuccess);
  return 0;
}
}  // namespace

TEST_F(RuntimeTest, IpcCanBeTurnedOff) { EXPECT_EQ(RunScenario("IpcDisabled", {"VNPU_IPC=0"}), 0); }
