// vnpuDeviceGetUtilization (Note [Busy time], src/utilization.cpp): the share of the last second a device's
// streams ran kernels, copies or memsets, as NVML's utilization.gpu. Kernels that sleep give known busy time
// whatever the machine's load.
#include "test_util.h"

#include <chrono>
#include <thread>

namespace vnpu_test {
namespace {

class UtilizationTest : public RuntimeTest {};

unsigned Utilization(int device) {
  unsigned percent = 1000;
  EXPECT_EQ(vnpuDeviceGetUtilization(device, &percent), vnpuSuccess);
  return percent;
}

void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST_F(UtilizationTest, ShareOfTheLastSecondWithAKernelRunning) {
  Sleep(1050);  // nothing ran in the last second
  EXPECT_EQ(Utilization(0), 0u);
  Stream s;
  ASSERT_EQ(vnpuLaunchKernel(s, "sleep 500 ms", [] { Sleep(500); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  const unsigned after = Utilization(0);
  EXPECT_GE(after, 45u);
  EXPECT_LE(after, 60u);  // 500 ms of the last 1000 (plus the host's scheduling)
  EXPECT_EQ(Utilization(1), 0u) << "another device's work counted";
  Sleep(1050);
  EXPECT_EQ(Utilization(0), 0u) << "busy time older than a second still counted";
}

TEST_F(UtilizationTest, OverlappingStreamsCountOnceAndWaitsNotAtAll) {
  Sleep(1050);
  Stream a, b;
  ASSERT_EQ(vnpuLaunchKernel(a, "sleep 400 ms", [] { Sleep(400); }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(b, "sleep 400 ms", [] { Sleep(400); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  const unsigned both = Utilization(0);
  EXPECT_GE(both, 35u);
  EXPECT_LE(both, 55u);  // the two kernels overlap: about 400 ms, not 800
  Sleep(1050);
  // A stream blocked on an event is not busy (an event wait only orders work): device 0 waits for an event of
  // device 1, whose stream is held by a kernel (that device is busy).
  if (device_count_ < 2) GTEST_SKIP() << "needs two devices";
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  auto c = std::make_unique<Stream>();
  Event e;
  ASSERT_EQ(LaunchGate(*c, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, *c), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  Stream d;
  ASSERT_EQ(vnpuStreamWaitEvent(d, e), vnpuSuccess);
  Sleep(300);
  const unsigned waiting = Utilization(0), holding = Utilization(1);
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(d), vnpuSuccess);
  c.reset();
  EXPECT_EQ(waiting, 0u);
  EXPECT_GE(holding, 25u);  // blocked inside a kernel counts, as on a GPU
}

TEST_F(UtilizationTest, BadArguments) {
  unsigned percent = 0;
  EXPECT_EQ(vnpuDeviceGetUtilization(-1, &percent), vnpuErrorInvalidDevice);
  EXPECT_EQ(vnpuDeviceGetUtilization(1000, &percent), vnpuErrorInvalidDevice);
  EXPECT_EQ(vnpuDeviceGetUtilization(0, nullptr), vnpuErrorInvalidValue);
}

}  // namespace
}  // namespace vnpu_test
