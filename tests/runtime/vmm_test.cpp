// Virtual memory management: reserved address ranges, physical handles taken
// from anywhere in a device's memory, mappings (the cuMem* driver API).
#include "test_util.h"

#include <cstdint>
#include <cstring>
#include <vector>

using namespace vnpu_test;

namespace {

constexpr size_t MiB = size_t(1) << 20;

size_t Granularity(int device = 0) {
  vnpuMemAllocationProp prop{device};
  size_t g = 0;
  EXPECT_EQ(vnpuMemGetAllocationGranularity(&g, &prop, vnpuMemAllocationGranularityMinimum), vnpuSuccess);
  return g;
}

size_t FreeBytes() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuSuccess);
  return free_b;
}

// Writes `value` into [p, p + n) with a device kernel and reads it back with a copy.
bool RoundTrip(void* p, size_t n, unsigned char value) {
  if (vnpuMemsetAsync(p, value, n, nullptr) != vnpuSuccess) return false;
  std::vector<unsigned char> host(n, static_cast<unsigned char>(~value));
  if (vnpuMemcpy(host.data(), p, n, vnpuMemcpyDeviceToHost) != vnpuSuccess) return false;
  for (unsigned char c : host) {
    if (c != value) return false;
  }
  return true;
}

// ---- child scenarios (see Note [Child scenarios]) -------------------------

// The case: an 80 MiB device, 78 MiB free in 2 MiB pieces. One
// contiguous 50 MiB block does not exist; a 50 MiB handle mapped into one
// range does, and it reads and writes like any device memory.
VNPU_CHILD_SCENARIO(FragmentedMemoryMapsIntoOneRange) {
  const size_t g = Granularity();
  CHILD_CHECK_EQ(g, 2 * MiB);
  std::vector<void*> blocks(40);
  for (auto& b : blocks) CHILD_CHECK_EQ(vnpuMalloc(&b, 2 * MiB), vnpuSuccess);  // the whole 80 MiB
  for (size_t i = 0; i < blocks.size(); i += 2) CHILD_CHECK_EQ(vnpuFree(blocks[i]), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFree(blocks[1]), vnpuSuccess);  // 3 x 2 MiB contiguous at the start
  CHILD_CHECK_EQ(FreeBytes(), 42 * MiB);
  void* contiguous = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&contiguous, 8 * MiB), vnpuErrorMemoryAllocation);  // no hole of 8 MiB

  void* va = nullptr;
  CHILD_CHECK_EQ(vnpuMemAddressReserve(&va, 64 * MiB, 0, nullptr, 0), vnpuSuccess);
  vnpuMemAllocationProp prop{0};
  vnpuMemGenericAllocationHandle_t h = nullptr;
  CHILD_CHECK_EQ(vnpuMemCreate(&h, 42 * MiB, &prop, 0), vnpuSuccess);  // all free memory, in 19 pieces
  CHILD_CHECK_EQ(FreeBytes(), 0u);
  vnpuMemGenericAllocationHandle_t more = nullptr;
  CHILD_CHECK_EQ(vnpuMemCreate(&more, g, &prop, 0), vnpuErrorMemoryAllocation);
  CHILD_CHECK_EQ(vnpuMemMap(va, 42 * MiB, 0, h, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemRelease(h), vnpuSuccess);
  // Distinct pages: a pattern written over the whole range reads back intact.
  std::vector<uint32_t> pattern(42 * MiB / 4);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(i * 2654435761u);
  CHILD_CHECK_EQ(vnpuMemcpy(va, pattern.data(), 42 * MiB, vnpuMemcpyHostToDevice), vnpuSuccess);
  std::vector<uint32_t> back(pattern.size());
  CHILD_CHECK_EQ(vnpuMemcpy(back.data(), va, 42 * MiB, vnpuMemcpyDeviceToHost), vnpuSuccess);
  CHILD_CHECK(std::memcmp(back.data(), pattern.data(), 42 * MiB) == 0);
  // The vnpuMalloc blocks in between were not touched.
  for (size_t i = 3; i < blocks.size(); i += 2) CHILD_CHECK(RoundTrip(blocks[i], 4096, 0x5a));
  CHILD_CHECK_EQ(vnpuMemUnmap(va, 42 * MiB), vnpuSuccess);
  CHILD_CHECK_EQ(FreeBytes(), 42 * MiB);  // released and unmapped: the pages are free again
  CHILD_CHECK_EQ(vnpuMemAddressFree(va, 64 * MiB), vnpuSuccess);
  for (size_t i = 3; i < blocks.size(); i += 2) CHILD_CHECK_EQ(vnpuFree(blocks[i]), vnpuSuccess);
  CHILD_CHECK_EQ(FreeBytes(), 80 * MiB);
  return 0;
}

TEST(VmmEnvTest, FragmentedMemoryMapsIntoOneRange) {
  EXPECT_EQ(RunScenario("FragmentedMemoryMapsIntoOneRange", {"VNPU_MEMORY_PER_DEVICE=80M"}), 0);
}

using VmmTest = RuntimeTest;

TEST_F(VmmTest, GranularityIsTwoMiBAndValidatesItsArguments) {
  EXPECT_EQ(Granularity(0), 2 * MiB);
  size_t g = 0;
  vnpuMemAllocationProp prop{0};
  EXPECT_EQ(vnpuMemGetAllocationGranularity(nullptr, &prop, vnpuMemAllocationGranularityMinimum),
            vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemGetAllocationGranularity(&g, nullptr, vnpuMemAllocationGranularityMinimum),
            vnpuErrorInvalidValue);
  vnpuMemAllocationProp bad{99};
  EXPECT_EQ(vnpuMemGetAllocationGranularity(&g, &bad, vnpuMemAllocationGranularityRecommended),
            vnpuErrorInvalidDevice);
}

TEST_F(VmmTest, ReservationIsAlignedAddressSpaceOnly) {
  const size_t g = Granularity();
  const size_t before = FreeBytes();
  void* va = nullptr;
  ASSERT_EQ(vnpuMemAddressReserve(&va, 1024 * g, 8 * g, nullptr, 0), vnpuSuccess);  // 2 GiB of addresses
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va) % (8 * g), 0u);
  EXPECT_EQ(FreeBytes(), before) << "a reservation takes no device memory";
  vnpuPointerAttributes attr{};
  ASSERT_EQ(vnpuPointerGetAttributes(&attr, va), vnpuSuccess);
  EXPECT_EQ(attr.type, vnpuMemoryTypeUnregistered) << "nothing is mapped yet";
  int dev = -2;
  ASSERT_EQ(vnpuPointerGetDevice(&dev, va), vnpuSuccess);
  EXPECT_EQ(dev, -1) << "a reservation without a mapping is no device memory";
  EXPECT_EQ(vnpuMemAddressFree(va, g), vnpuErrorInvalidValue) << "only whole reservations";
  EXPECT_EQ(vnpuMemAddressFree(va, 1024 * g), vnpuSuccess);
  EXPECT_EQ(vnpuMemAddressFree(va, 1024 * g), vnpuErrorInvalidValue) << "already freed";
}

TEST_F(VmmTest, InvalidArgumentsAreRejected) {
  const size_t g = Granularity();
  void* va = nullptr;
  EXPECT_EQ(vnpuMemAddressReserve(nullptr, g, 0, nullptr, 0), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemAddressReserve(&va, g + 4096, 0, nullptr, 0), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemAddressReserve(&va, g, 3 * g, nullptr, 0), vnpuErrorInvalidValue) << "alignment not a power of 2";
  ASSERT_EQ(vnpuMemAddressReserve(&va, 4 * g, 0, nullptr, 0), vnpuSuccess);
  auto* base = static_cast<char*>(va);
  vnpuMemAllocationProp prop{0};
  vnpuMemAllocationProp bad_dev{42};
  vnpuMemGenericAllocationHandle_t h = nullptr;
  EXPECT_EQ(vnpuMemCreate(&h, g / 2, &prop, 0), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemCreate(&h, g, &bad_dev, 0), vnpuErrorInvalidDevice);
  EXPECT_EQ(vnpuMemCreate(&h, g, &prop, 1), vnpuErrorInvalidValue);
  ASSERT_EQ(vnpuMemCreate(&h, 2 * g, &prop, 0), vnpuSuccess);
  EXPECT_EQ(vnpuMemMap(base + 4096, g, 0, h, 0), vnpuErrorInvalidValue) << "unaligned address";
  EXPECT_EQ(vnpuMemMap(base, g, g / 2, h, 0), vnpuErrorInvalidValue) << "unaligned offset";
  EXPECT_EQ(vnpuMemMap(base, 4 * g, 0, h, 0), vnpuErrorInvalidValue) << "more than the handle holds";
  EXPECT_EQ(vnpuMemMap(base + 3 * g, 2 * g, 0, h, 0), vnpuErrorInvalidValue) << "past the reservation";
  int not_reserved = 0;
  EXPECT_EQ(vnpuMemMap(&not_reserved, g, 0, h, 0), vnpuErrorInvalidValue);
  ASSERT_EQ(vnpuMemMap(base + g, 2 * g, 0, h, 0), vnpuSuccess);
  EXPECT_EQ(vnpuMemMap(base, 2 * g, 0, h, 0), vnpuErrorInvalidValue) << "overlaps the mapping";
  EXPECT_EQ(vnpuMemUnmap(base + g, g), vnpuErrorInvalidValue) << "part of a mapping";
  EXPECT_EQ(vnpuMemAddressFree(va, 4 * g), vnpuErrorInvalidValue) << "still mapped";
  EXPECT_EQ(vnpuFree(base + g), vnpuErrorInvalidValue) << "mapped memory is unmapped, not freed";
  EXPECT_EQ(vnpuMemUnmap(base + g, 2 * g), vnpuSuccess);
  EXPECT_EQ(vnpuMemRelease(h), vnpuSuccess);
  EXPECT_EQ(vnpuMemRelease(nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemAddressFree(va, 4 * g), vnpuSuccess);
}

TEST_F(VmmTest, HandlesCountAgainstTheCapacityUntilReleasedAndUnmapped) {
  const size_t g = Granularity();
  const size_t before = FreeBytes();
  vnpuMemAllocationProp prop{0};
  vnpuMemGenericAllocationHandle_t h = nullptr;
  ASSERT_EQ(vnpuMemCreate(&h, 3 * g, &prop, 0), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), before - 3 * g);
  void* va = nullptr;
  ASSERT_EQ(vnpuMemAddressReserve(&va, 8 * g, 0, nullptr, 0), vnpuSuccess);
  ASSERT_EQ(vnpuMemMap(va, 3 * g, 0, h, 0), vnpuSuccess);
  ASSERT_EQ(vnpuMemRelease(h), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), before - 3 * g) << "released but still mapped: the pages live on";
  EXPECT_TRUE(RoundTrip(va, 3 * g, 0x3c));
  ASSERT_EQ(vnpuMemUnmap(va, 3 * g), vnpuSuccess);
  EXPECT_EQ(FreeBytes(), before);
  EXPECT_EQ(vnpuMemAddressFree(va, 8 * g), vnpuSuccess);
  // A handle larger than the device's free memory fails cleanly.
  EXPECT_EQ(vnpuMemCreate(&h, (before / g + 1) * g, &prop, 0), vnpuErrorMemoryAllocation);
  EXPECT_EQ(FreeBytes(), before);
}

TEST_F(VmmTest, OneHandleMappedTwiceSharesItsPages) {
  const size_t g = Granularity();
  vnpuMemAllocationProp prop{0};
  vnpuMemGenericAllocationHandle_t h = nullptr;
  ASSERT_EQ(vnpuMemCreate(&h, 2 * g, &prop, 0), vnpuSuccess);
  void* va = nullptr;
  ASSERT_EQ(vnpuMemAddressReserve(&va, 8 * g, 0, nullptr, 0), vnpuSuccess);
  auto* a = static_cast<char*>(va);
  char* b = a + 4 * g;
  ASSERT_EQ(vnpuMemMap(a, 2 * g, 0, h, 0), vnpuSuccess);
  ASSERT_EQ(vnpuMemMap(b, g, g, h, 0), vnpuSuccess);  // the handle's second page only
  ASSERT_EQ(vnpuMemsetAsync(a + g, 0x77, 16, nullptr), vnpuSuccess);
  unsigned char out[16] = {0};
  ASSERT_EQ(vnpuMemcpy(out, b, sizeof(out), vnpuMemcpyDeviceToHost), vnpuSuccess);
  for (unsigned char c : out) EXPECT_EQ(c, 0x77);
  ASSERT_EQ(vnpuMemRelease(h), vnpuSuccess);
  EXPECT_EQ(vnpuMemUnmap(a, 2 * g), vnpuSuccess);
  EXPECT_EQ(vnpuMemUnmap(b, g), vnpuSuccess);
  EXPECT_EQ(vnpuMemAddressFree(va, 8 * g), vnpuSuccess);
}

TEST_F(VmmTest, MappedMemoryIsDeviceMemoryForCopiesAndAttributes) {
  VNPU_REQUIRE_DEVICES(2);
  const size_t g = Granularity(1);
  vnpuMemAllocationProp prop{1};
  vnpuMemGenericAllocationHandle_t h = nullptr;
  ASSERT_EQ(vnpuMemCreate(&h, 2 * g, &prop, 0), vnpuSuccess);
  void* va = nullptr;
  ASSERT_EQ(vnpuMemAddressReserve(&va, 2 * g, 0, nullptr, 0), vnpuSuccess);
  ASSERT_EQ(vnpuMemMap(va, 2 * g, 0, h, 0), vnpuSuccess);
  vnpuPointerAttributes attr{};
  ASSERT_EQ(vnpuPointerGetAttributes(&attr, static_cast<char*>(va) + g + 5), vnpuSuccess);
  EXPECT_EQ(attr.type, vnpuMemoryTypeDevice);
  EXPECT_EQ(attr.device, 1);
  EXPECT_EQ(attr.base, va);
  EXPECT_EQ(attr.size, 2 * g);
  int dev = -2;
  ASSERT_EQ(vnpuPointerGetDevice(&dev, static_cast<char*>(va) + g + 5), vnpuSuccess);
  EXPECT_EQ(dev, 1) << "a mapping's device is its handle's";
  // Device-to-device copy from a vnpuMalloc block of device 0 into the mapping.
  DeviceBuffer src(4096);
  ASSERT_TRUE(RoundTrip(src.get(), 4096, 0x11));
  ASSERT_EQ(vnpuMemcpy(va, src.get(), 4096, vnpuMemcpyDeviceToDevice), vnpuSuccess);
  unsigned char out[4096];
  ASSERT_EQ(vnpuMemcpy(out, va, sizeof(out), vnpuMemcpyDeviceToHost), vnpuSuccess);
  for (unsigned char c : out) ASSERT_EQ(c, 0x11);
  EXPECT_EQ(vnpuMemcpy(va, out, sizeof(out), vnpuMemcpyHostToHost), vnpuErrorInvalidValue)
      << "mapped memory is device memory";
  ASSERT_EQ(vnpuMemUnmap(va, 2 * g), vnpuSuccess);
  ASSERT_EQ(vnpuMemRelease(h), vnpuSuccess);
  ASSERT_EQ(vnpuMemAddressFree(va, 2 * g), vnpuSuccess);
}

TEST_F(VmmTest, UnmapWaitsForQueuedWorkOnTheMapping) {
  const size_t g = Granularity();
  vnpuMemAllocationProp prop{0};
  vnpuMemGenericAllocationHandle_t h = nullptr;
  ASSERT_EQ(vnpuMemCreate(&h, g, &prop, 0), vnpuSuccess);
  void* va = nullptr;
  ASSERT_EQ(vnpuMemAddressReserve(&va, g, 0, nullptr, 0), vnpuSuccess);
  ASSERT_EQ(vnpuMemMap(va, g, 0, h, 0), vnpuSuccess);
  ASSERT_EQ(vnpuMemRelease(h), vnpuSuccess);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  std::atomic<bool> wrote{false};
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  auto* p = static_cast<volatile char*>(va);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "write", [p, g, &wrote] {
              p[g - 1] = 1;  // would fault if the mapping were gone
              wrote = true;
            }),
            vnpuSuccess);
  std::thread opener([gate] {
    std::this_thread::sleep_for(50ms);
    gate->open();
  });
  EXPECT_EQ(vnpuMemUnmap(va, g), vnpuSuccess);
  EXPECT_TRUE(wrote.load()) << "the unmap returned before the queued kernel ran";
  opener.join();
  EXPECT_EQ(vnpuMemAddressFree(va, g), vnpuSuccess);
}

}  // namespace
