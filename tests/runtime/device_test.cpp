// Devices: count and visibility from the environment, current device (per
// thread), properties, device-wide synchronisation.
#include "test_util.h"

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

using namespace vnpu_test;

namespace {

// ---- child scenarios (see Note [Child scenarios]) -------------------------

// Expects VNPU_TEST_EXPECT_COUNT devices, each selectable, and no more.
VNPU_CHILD_SCENARIO(DeviceCountMatchesEnv) {
  const int expected = std::atoi(std::getenv("VNPU_TEST_EXPECT_COUNT"));
  int n = -1;
  CHILD_CHECK_EQ(vnpuGetDeviceCount(&n), vnpuSuccess);
  CHILD_CHECK_EQ(n, expected);
  for (int d = 0; d < n; ++d) CHILD_CHECK_EQ(vnpuSetDevice(d), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSetDevice(n), vnpuErrorInvalidDevice);
  return 0;
}

// A bad VNPU_* variable: no devices, vnpuErrorInvalidConfiguration, and a
// message containing VNPU_TEST_EXPECT_TEXT.
VNPU_CHILD_SCENARIO(InvalidConfiguration) {
  int n = -1;
  CHILD_CHECK_EQ(vnpuGetDeviceCount(&n), vnpuErrorInvalidConfiguration);
  CHILD_CHECK_EQ(n, 0);
  CHILD_CHECK_EQ(vnpuSetDevice(0), vnpuErrorInvalidDevice);
  CHILD_CHECK(std::strstr(vnpuGetConfigurationErrorString(), std::getenv("VNPU_TEST_EXPECT_TEXT")) != nullptr);
  return 0;
}

// VNPU_DEVICE_COUNT=4 VNPU_VISIBLE_DEVICES=3,1: visible device 0 is physical 3.
VNPU_CHILD_SCENARIO(VisibleDevicesReorder) {
  int n = -1;
  CHILD_CHECK_EQ(vnpuGetDeviceCount(&n), vnpuSuccess);
  CHILD_CHECK_EQ(n, 2);
  vnpuDeviceProp p0{}, p1{};
  CHILD_CHECK_EQ(vnpuGetDeviceProperties(&p0, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGetDeviceProperties(&p1, 1), vnpuSuccess);
  CHILD_CHECK(std::strstr(p0.name, "physical id 3") != nullptr);
  CHILD_CHECK(std::strstr(p1.name, "physical id 1") != nullptr);
  // Both visible devices are fully usable.
  for (int d = 0; d < 2; ++d) {
    CHILD_CHECK_EQ(vnpuSetDevice(d), vnpuSuccess);
    void* p = nullptr;
    CHILD_CHECK_EQ(vnpuMalloc(&p, 64), vnpuSuccess);
    vnpuPointerAttributes a{};
    CHILD_CHECK_EQ(vnpuPointerGetAttributes(&a, p), vnpuSuccess);
    CHILD_CHECK_EQ(a.device, d);
    CHILD_CHECK_EQ(vnpuFree(p), vnpuSuccess);
  }
  return 0;
}

// No devices at all (VNPU_DEVICE_COUNT=0 or VNPU_VISIBLE_DEVICES=""): every
// call reports a clean error code, nothing crashes.
VNPU_CHILD_SCENARIO(ZeroDevices) {
  int n = -1;
  CHILD_CHECK_EQ(vnpuGetDeviceCount(&n), vnpuSuccess);
  CHILD_CHECK_EQ(n, 0);
  CHILD_CHECK_EQ(vnpuSetDevice(0), vnpuErrorInvalidDevice);
  int cur = -1;
  CHILD_CHECK_EQ(vnpuGetDevice(&cur), vnpuSuccess);
  vnpuDeviceProp prop{};
  CHILD_CHECK_EQ(vnpuGetDeviceProperties(&prop, 0), vnpuErrorInvalidDevice);
  void* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&p, 64), vnpuErrorInvalidDevice);
  size_t free_b = 0, total_b = 0;
  CHILD_CHECK_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuErrorInvalidDevice);
  vnpuStream_t s = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&s), vnpuErrorInvalidDevice);
  CHILD_CHECK_EQ(vnpuGetDefaultStream(0, &s), vnpuErrorInvalidDevice);
  CHILD_CHECK_EQ(vnpuLaunchKernel(nullptr, "k", [] {}), vnpuErrorInvalidResourceHandle);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorInvalidResourceHandle);
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuErrorInvalidDevice);
  // No device can have a pending asynchronous error.
  CHILD_CHECK_EQ(vnpuPeekAtLastError(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGetLastError(), vnpuSuccess);
  // A never-recorded event is complete; synchronising it must not touch a device.
  vnpuEvent_t e = nullptr;
  CHILD_CHECK_EQ(vnpuEventCreate(&e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventDestroy(e), vnpuSuccess);
  // Pinned host memory does not need a device.
  CHILD_CHECK_EQ(vnpuMallocHost(&p, 64), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFreeHost(p), vnpuSuccess);
  return 0;
}

using DeviceTest = RuntimeTest;

// ---- count and visibility -------------------------------------------------

TEST(DeviceEnvTest, CountDefaultsToTwo) {
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv", {"VNPU_TEST_EXPECT_COUNT=2"}), 0);
}

TEST(DeviceEnvTest, CountFromEnvironment) {
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv",
                        {"VNPU_DEVICE_COUNT=3", "VNPU_TEST_EXPECT_COUNT=3"}), 0);
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv",
                        {"VNPU_DEVICE_COUNT=1", "VNPU_TEST_EXPECT_COUNT=1"}), 0);
}

TEST(DeviceEnvTest, CountUpToTheMaximum) {
  // Small capacity keeps 64 address-space reservations cheap.
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv", {"VNPU_DEVICE_COUNT=64", "VNPU_MEMORY_PER_DEVICE=1M",
                                                  "VNPU_TEST_EXPECT_COUNT=64"}), 0);
}

TEST(DeviceEnvTest, InvalidConfigurationMeansNoDevicesAndSaysWhy) {
  EXPECT_EQ(RunScenario("InvalidConfiguration", {"VNPU_DEVICE_COUNT=1000", "VNPU_TEST_EXPECT_TEXT=VNPU_DEVICE_COUNT=1000"}), 0);
  EXPECT_EQ(RunScenario("InvalidConfiguration", {"VNPU_DEVICE_COUNT=-4", "VNPU_TEST_EXPECT_TEXT=VNPU_DEVICE_COUNT=-4"}), 0);
  EXPECT_EQ(RunScenario("InvalidConfiguration", {"VNPU_DEVICE_COUNT=2x", "VNPU_TEST_EXPECT_TEXT=VNPU_DEVICE_COUNT=2x"}), 0);
  EXPECT_EQ(RunScenario("InvalidConfiguration",
                        {"VNPU_MEMORY_PER_DEVICE=8Q", "VNPU_TEST_EXPECT_TEXT=VNPU_MEMORY_PER_DEVICE=8Q"}), 0);
  for (const char* bad : {"VNPU_MEMORY_PER_DEVICE=99999999999G", "VNPU_MEMORY_PER_DEVICE=infG",
                          "VNPU_MEMORY_PER_DEVICE=0x10", "VNPU_MEMORY_PER_DEVICE=0.5"}) {
    EXPECT_EQ(RunScenario("InvalidConfiguration", {bad, "VNPU_TEST_EXPECT_TEXT=VNPU_MEMORY_PER_DEVICE="}), 0) << bad;
  }
  EXPECT_EQ(RunScenario("InvalidConfiguration", {"VNPU_MEMORY_PER_DEVICE=100T", "VNPU_DEVICE_COUNT=64",
                                                 "VNPU_TEST_EXPECT_TEXT=cannot reserve"}), 0);
}

TEST(DeviceEnvTest, VisibleDevicesSelectAndReorder) {
  EXPECT_EQ(RunScenario("VisibleDevicesReorder",
                        {"VNPU_DEVICE_COUNT=4", "VNPU_VISIBLE_DEVICES=3,1"}), 0);
}

TEST(DeviceEnvTest, VisibleDevicesStopAtFirstInvalidOrRepeatedEntry) {
  // Like CUDA_VISIBLE_DEVICES: "1,9,0" exposes only physical 1 when 9 does not exist.
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv", {"VNPU_DEVICE_COUNT=4",
                                                  "VNPU_VISIBLE_DEVICES=1,9,0",
                                                  "VNPU_TEST_EXPECT_COUNT=1"}), 0);
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv", {"VNPU_DEVICE_COUNT=4",
                                                  "VNPU_VISIBLE_DEVICES=2,0,2,1",
                                                  "VNPU_TEST_EXPECT_COUNT=2"}), 0);
  EXPECT_EQ(RunScenario("DeviceCountMatchesEnv", {"VNPU_DEVICE_COUNT=4",
                                                  "VNPU_VISIBLE_DEVICES=x",
                                                  "VNPU_TEST_EXPECT_COUNT=0"}), 0);
}

TEST(DeviceEnvTest, ZeroDevicesFailCleanly) {
  EXPECT_EQ(RunScenario("ZeroDevices", {"VNPU_DEVICE_COUNT=0"}), 0);
  EXPECT_EQ(RunScenario("ZeroDevices", {"VNPU_VISIBLE_DEVICES="}), 0);
}

TEST_F(DeviceTest, GetDeviceCountRejectsNull) {
  EXPECT_EQ(vnpuGetDeviceCount(nullptr), vnpuErrorInvalidValue);
}

// ---- current device ---------------------------------------------------------

TEST_F(DeviceTest, SetAndGetDevice) {
  VNPU_REQUIRE_DEVICES(2);
  int d = -1;
  ASSERT_EQ(vnpuGetDevice(&d), vnpuSuccess);
  EXPECT_EQ(d, 0);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(vnpuGetDevice(&d), vnpuSuccess);
  EXPECT_EQ(d, 1);
  EXPECT_EQ(vnpuGetDevice(nullptr), vnpuErrorInvalidValue);
}

TEST_F(DeviceTest, InvalidOrdinalIsRejectedAndKeepsCurrentDevice) {
  VNPU_REQUIRE_DEVICES(2);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  for (int bad : {-1, device_count_, device_count_ + 7, 1 << 30}) {
    EXPECT_EQ(vnpuSetDevice(bad), vnpuErrorInvalidDevice) << "ordinal " << bad;
    int d = -1;
    ASSERT_EQ(vnpuGetDevice(&d), vnpuSuccess);
    EXPECT_EQ(d, 1) << "a rejected vnpuSetDevice(" << bad << ") changed the current device";
  }
}

TEST_F(DeviceTest, CurrentDeviceIsPerThread) {
  VNPU_REQUIRE_DEVICES(2);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  int seen_initial = -1, seen_after = -1;
  std::thread t([&] {
    vnpuGetDevice(&seen_initial);  // a new thread starts on device 0
    vnpuSetDevice(0);
    vnpuGetDevice(&seen_after);
  });
  t.join();
  EXPECT_EQ(seen_initial, 0);
  EXPECT_EQ(seen_after, 0);
  int d = -1;
  ASSERT_EQ(vnpuGetDevice(&d), vnpuSuccess);
  EXPECT_EQ(d, 1) << "another thread's vnpuSetDevice leaked into this thread";
}

// ---- properties ---------------------------------------------------------------

TEST_F(DeviceTest, PropertiesDescribeEachDevice) {
  for (int d = 0; d < device_count_; ++d) {
    vnpuDeviceProp p{};
    ASSERT_EQ(vnpuGetDeviceProperties(&p, d), vnpuSuccess);
    EXPECT_NE(std::strstr(p.name, "vNPU"), nullptr) << p.name;
    EXPECT_LT(std::strlen(p.name), sizeof(p.name));
    EXPECT_GT(p.totalGlobalMem, 0u);
    EXPECT_GE(p.multiProcessorCount, 1);
    EXPECT_EQ(p.major, 1);
    EXPECT_EQ(p.minor, 0);
    // The capacity reported here is the one the allocator enforces.
    ASSERT_EQ(vnpuSetDevice(d), vnpuSuccess);
    size_t free_b = 0, total_b = 0;
    ASSERT_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuSuccess);
    EXPECT_EQ(total_b, p.totalGlobalMem);
  }
}

TEST_F(DeviceTest, PropertiesRejectInvalidArguments) {
  vnpuDeviceProp p{};
  EXPECT_EQ(vnpuGetDeviceProperties(nullptr, 0), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuGetDeviceProperties(&p, -1), vnpuErrorInvalidDevice);
  EXPECT_EQ(vnpuGetDeviceProperties(&p, device_count_), vnpuErrorInvalidDevice);
}

TEST_F(DeviceTest, DefaultCapacityIsEightGiB) {
  if (std::getenv("VNPU_MEMORY_PER_DEVICE") != nullptr) GTEST_SKIP() << "VNPU_MEMORY_PER_DEVICE is set";
  vnpuDeviceProp p{};
  ASSERT_EQ(vnpuGetDeviceProperties(&p, 0), vnpuSuccess);
  EXPECT_EQ(p.totalGlobalMem, size_t(8) << 30);
}

// ---- device synchronisation ---------------------------------------------------

TEST_F(DeviceTest, DeviceSynchronizeWaitsForEveryStreamOfTheDevice) {
  std::atomic<int> done{0};
  DrainOnExit drain;  // one kernel goes to the default stream
  Stream a, b;
  auto slow = [&done] {
    std::this_thread::sleep_for(30ms);
    done.fetch_add(1);
  };
  ASSERT_EQ(vnpuLaunchKernel(a, "slow", slow), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(b, "slow", slow), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "slow", slow), vnpuSuccess);
  ASSERT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  EXPECT_EQ(done.load(), 3);
}

TEST_F(DeviceTest, DeviceSynchronizeDoesNotWaitForOtherDevices) {
  VNPU_REQUIRE_DEVICES(2);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);  // device 1 is busy until the gate opens
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  auto t0 = Clock::now();
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  EXPECT_LT(Clock::now() - t0, kTimeout / 2) << "device 0 waited for device 1's work";
  vnpuStream_t s1 = nullptr;
  ASSERT_EQ(vnpuGetDefaultStream(1, &s1), vnpuSuccess);
  EXPECT_EQ(vnpuStreamQuery(s1), vnpuErrorNotReady);
  gate->open();
  EXPECT_EQ(vnpuStreamSynchronize(s1), vnpuSuccess);
}

}  // namespace
