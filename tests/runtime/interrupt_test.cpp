// Interrupting host waits (vnpuSetWaitInterruptHook): a blocked synchronizing
// call returns vnpuErrorInterrupted when the hook asks, the queued work keeps
// running, a pending copy into pageable memory is abandoned, pending kernel
// errors stay pending, and vnpuFree always waits to the end.
#include "test_util.h"

#include <stdexcept>

using namespace vnpu_test;

namespace {

std::atomic<int> g_hook_calls{0};
std::atomic<int> g_stop_after{0};  // the hook answers "stop" from this call on (0: never)

int CountingHook() {
  const int n = ++g_hook_calls;
  return g_stop_after.load() != 0 && n >= g_stop_after.load() ? 1 : 0;
}

class InterruptTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    g_hook_calls = 0;
    g_stop_after = 3;
    ASSERT_EQ(vnpuSetWaitInterruptHook(&CountingHook, 1000), vnpuSuccess);  // 1 ms slices
  }
  void TearDown() override {
    vnpuSetWaitInterruptHook(nullptr, 0);
    RuntimeTest::TearDown();
  }
};

TEST_F(InterruptTest, HookArgumentsAreValidated) {
  EXPECT_EQ(vnpuSetWaitInterruptHook(&CountingHook, 0), vnpuErrorInvalidValue) << "a hook needs a slice";
  EXPECT_EQ(vnpuSetWaitInterruptHook(nullptr, 0), vnpuSuccess);
}

TEST_F(InterruptTest, StreamSynchronizeIsInterruptedAndTheWorkStillRuns) {
  Stream s;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  std::atomic<bool> ran{false};
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "after", [&ran] { ran = true; }), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorInterrupted);
  EXPECT_GE(g_hook_calls.load(), 3);
  EXPECT_EQ(vnpuStreamQuery(s), vnpuErrorNotReady) << "the work is still queued";
  g_stop_after = 0;  // a later wait runs to the end
  gate->open();
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(ran.load());
}

TEST_F(InterruptTest, EventAndDeviceSynchronizeAreInterrupted) {
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  Event e;
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, nullptr), vnpuSuccess);
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuErrorInterrupted);
  g_hook_calls = 0;
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuErrorInterrupted);
  EXPECT_EQ(vnpuEventQuery(e), vnpuErrorNotReady);
  gate->open();
  g_stop_after = 0;
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
}

TEST_F(InterruptTest, AbandonedCopyIntoPageableMemoryNeverWritesIt) {
  DeviceBuffer d(4096);
  ASSERT_EQ(vnpuMemsetAsync(d.get(), 0x42, 4096, nullptr), vnpuSuccess);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  std::vector<unsigned char> host(4096, 0);
  EXPECT_EQ(vnpuMemcpyAsync(host.data(), d.get(), 4096, vnpuMemcpyDeviceToHost, nullptr), vnpuErrorInterrupted);
  g_stop_after = 0;
  gate->open();
  ASSERT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);  // the abandoned copy has run (or been skipped) now
  for (unsigned char c : host) ASSERT_EQ(c, 0) << "an abandoned copy wrote into memory its caller owns again";
  // The same copy, not interrupted, delivers.
  ASSERT_EQ(vnpuMemcpy(host.data(), d.get(), 4096, vnpuMemcpyDeviceToHost), vnpuSuccess);
  for (unsigned char c : host) ASSERT_EQ(c, 0x42);
}

TEST_F(InterruptTest, PendingKernelErrorStaysPendingAfterAnInterruptedWait) {
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "boom", [] { throw std::runtime_error("boom"); }), vnpuSuccess);
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorInterrupted);
  g_stop_after = 0;
  gate->open();
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(vnpuGetLastErrorString(), "boom"));
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
}

TEST_F(InterruptTest, FreeAlwaysWaitsToTheEnd) {
  void* p = nullptr;
  ASSERT_EQ(vnpuMalloc(&p, 4096), vnpuSuccess);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  std::atomic<bool> wrote{false};
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  auto* c = static_cast<volatile char*>(p);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "write", [c, &wrote] {
              c[0] = 1;
              wrote = true;
            }),
            vnpuSuccess);
  std::thread opener([gate] {
    std::this_thread::sleep_for(30ms);
    gate->open();
  });
  EXPECT_EQ(vnpuFree(p), vnpuSuccess);
  EXPECT_TRUE(wrote.load()) << "vnpuFree returned before the work using the block ran";
  EXPECT_EQ(g_hook_calls.load(), 0) << "vnpuFree's wait must not consult the hook";
  opener.join();
}

TEST_F(InterruptTest, HookThatNeverStopsLetsTheWaitFinish) {
  g_stop_after = 0;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  std::thread opener([gate] {
    std::this_thread::sleep_for(30ms);
    gate->open();
  });
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_GT(g_hook_calls.load(), 0) << "the wait was not sliced";
  opener.join();
}

}  // namespace
