// Graphs: stream capture records instead of running, one launch replays the
// whole sequence in order on any stream, refusals invalidate the capture and
// leave the stream usable.
#include "test_util.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

using namespace vnpu_test;

namespace {

using GraphTest = RuntimeTest;

std::string LastMessage() { return vnpuGetLastErrorString(); }

// Captures `n` kernels appending 0..n-1 to *order on `s`; returns the instantiated graph.
vnpuGraphExec_t CaptureAppends(vnpuStream_t s, std::vector<int>* order, int n) {
  EXPECT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  for (int i = 0; i < n; ++i) EXPECT_EQ(vnpuLaunchKernel(s, "append", [order, i] { order->push_back(i); }), vnpuSuccess);
  vnpuGraph_t g = nullptr;
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  size_t count = 0;
  EXPECT_EQ(vnpuGraphGetNodeCount(g, &count), vnpuSuccess);
  EXPECT_EQ(count, size_t(n));
  vnpuGraphExec_t x = nullptr;
  EXPECT_EQ(vnpuGraphInstantiate(&x, g, 0), vnpuSuccess);
  EXPECT_EQ(vnpuGraphDestroy(g), vnpuSuccess);  // the exec does not need the graph
  return x;
}

TEST_F(GraphTest, CaptureRecordsAndReplayRunsInOrderAsOneTask) {
  std::vector<int> order;
  Stream s;
  vnpuGraphExec_t x = CaptureAppends(s, &order, 5);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(order.empty()) << "captured kernels must not run at capture time";
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);
  ASSERT_EQ(vnpuGraphLaunch(x, s), vnpuSuccess);
  ASSERT_EQ(vnpuGraphLaunch(x, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  std::vector<vnpuActivityRecord> records;
  ASSERT_EQ(vnpuActivityFlushAll(&records), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(0), vnpuSuccess);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  int launches = 0;
  for (const auto& r : records) launches += r.stream == s.get() && r.name == "vnpuGraphLaunch";
  EXPECT_EQ(launches, 2) << "each replay is one task";
  EXPECT_EQ(vnpuGraphExecDestroy(x), vnpuSuccess);
}

TEST_F(GraphTest, ReplayIsStreamOrderedOnAnotherStream) {
  std::vector<int> order;
  Stream capture, other;
  vnpuGraphExec_t x = CaptureAppends(capture, &order, 2);
  ASSERT_EQ(vnpuLaunchKernel(other, "before", [&order] { order.push_back(100); }), vnpuSuccess);
  ASSERT_EQ(vnpuGraphLaunch(x, other), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(other, "after", [&order] { order.push_back(200); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(other), vnpuSuccess);
  EXPECT_EQ(order, (std::vector<int>{100, 0, 1, 200}));
  vnpuGraphExecDestroy(x);
}

TEST_F(GraphTest, ReplayReadsCurrentContentsOfCapturedAddresses) {
  DeviceBuffer in(sizeof(int)), out(sizeof(int));
  Stream s;
  int* pi = in.as<int>();
  int* po = out.as<int>();
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "double", [pi, po] { *po = 2 * *pi; }), vnpuSuccess);
  vnpuGraph_t g;
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  vnpuGraphExec_t x;
  ASSERT_EQ(vnpuGraphInstantiate(&x, g, 0), vnpuSuccess);
  for (int v : {3, 7}) {
    ASSERT_EQ(vnpuMemcpyAsync(pi, &v, sizeof(int), vnpuMemcpyHostToDevice, s), vnpuSuccess);
    ASSERT_EQ(vnpuGraphLaunch(x, s), vnpuSuccess);
    int r = 0;
    ASSERT_EQ(vnpuMemcpyAsync(&r, po, sizeof(int), vnpuMemcpyDeviceToHost, s), vnpuSuccess);  // waits
    EXPECT_EQ(r, 2 * v);
  }
  vnpuGraphExecDestroy(x);
  vnpuGraphDestroy(g);
}

TEST_F(GraphTest, SynchronizeDuringCaptureIsRefusedAndInvalidates) {
  std::atomic<int> ran{0};
  Stream s;
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  vnpuStreamCaptureStatus st;
  ASSERT_EQ(vnpuStreamIsCapturing(s, &st), vnpuSuccess);
  EXPECT_EQ(st, vnpuStreamCaptureStatusActive);
  ASSERT_EQ(vnpuLaunchKernel(s, "k", [&ran] { ++ran; }), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorStreamCaptureUnsupported);
  EXPECT_TRUE(Contains(vnpuGetErrorString(vnpuErrorStreamCaptureUnsupported), "operation not permitted when stream is capturing"));
  EXPECT_TRUE(Contains(LastMessage(), "vnpuStreamSynchronize of the capturing stream"));
  ASSERT_EQ(vnpuStreamIsCapturing(s, &st), vnpuSuccess);
  EXPECT_EQ(st, vnpuStreamCaptureStatusInvalidated);
  EXPECT_EQ(vnpuLaunchKernel(s, "k", [&ran] { ++ran; }), vnpuErrorStreamCaptureInvalidated);
  EXPECT_EQ(vnpuStreamQuery(s), vnpuErrorStreamCaptureUnsupported);
  vnpuGraph_t g = reinterpret_cast<vnpuGraph_t>(1);
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  EXPECT_TRUE(Contains(LastMessage(), "vnpuStreamSynchronize"));
  // The stream works normally again; nothing captured ever ran.
  ASSERT_EQ(vnpuLaunchKernel(s, "k", [&ran] { ran += 10; }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(ran.load(), 10);
}

TEST_F(GraphTest, HostReadsAndDeviceSyncAreRefused) {
  DeviceBuffer d(64);
  Stream s;
  char host[64];
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  EXPECT_EQ(vnpuMemcpyAsync(host, d.get(), 64, vnpuMemcpyDeviceToHost, s), vnpuErrorStreamCaptureUnsupported);
  vnpuGraph_t g;
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);

  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  EXPECT_EQ(vnpuMemcpyAsync(d.get(), host, 64, vnpuMemcpyHostToDevice, s), vnpuErrorStreamCaptureUnsupported);
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);

  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuErrorStreamCaptureUnsupported);
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
}

TEST_F(GraphTest, UnsafeCallsFollowTheCaptureMode) {
  Stream s;
  void* p = nullptr;
  vnpuGraph_t g;
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  std::thread([&] { EXPECT_EQ(vnpuMalloc(&p, 4096), vnpuErrorStreamCaptureUnsupported); }).join();
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);

  // A Relaxed thread may allocate during a Global capture.
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  vnpuStreamCaptureMode mode = vnpuStreamCaptureModeRelaxed;
  ASSERT_EQ(vnpuThreadExchangeStreamCaptureMode(&mode), vnpuSuccess);
  EXPECT_EQ(mode, vnpuStreamCaptureModeGlobal);
  EXPECT_EQ(vnpuMalloc(&p, 4096), vnpuSuccess);
  ASSERT_EQ(vnpuThreadExchangeStreamCaptureMode(&mode), vnpuSuccess);
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  vnpuGraphDestroy(g);
  EXPECT_EQ(vnpuFree(p), vnpuSuccess);

  // ThreadLocal: other threads may allocate, the capturing thread may not.
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeThreadLocal), vnpuSuccess);
  std::thread([&] {
    EXPECT_EQ(vnpuMalloc(&p, 4096), vnpuSuccess);
    EXPECT_EQ(vnpuFree(p), vnpuSuccess);
  }).join();
  EXPECT_EQ(vnpuMalloc(&p, 4096), vnpuErrorStreamCaptureUnsupported);
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);
}

TEST_F(GraphTest, CrossStreamCaptureForksAndJoins) {
  // Note [Cross-stream capture]: another stream that waits on an event recorded in the capture joins it.
  Stream s, other;
  Event e(vnpuEventDisableTiming), back(vnpuEventDisableTiming);
  std::vector<int> order;
  vnpuGraph_t g;
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "a", [&order] { order.push_back(1); }), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(other, e, 0), vnpuSuccess);  // the fork
  vnpuStreamCaptureStatus status;
  ASSERT_EQ(vnpuStreamIsCapturing(other, &status), vnpuSuccess);
  EXPECT_EQ(status, vnpuStreamCaptureStatusActive);
  ASSERT_EQ(vnpuLaunchKernel(other, "b", [&order] { order.push_back(2); }), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(back, other), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(s, back, 0), vnpuSuccess);  // the join
  ASSERT_EQ(vnpuLaunchKernel(s, "c", [&order] { order.push_back(3); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  EXPECT_TRUE(order.empty());  // recorded, not run
  ASSERT_EQ(vnpuStreamIsCapturing(other, &status), vnpuSuccess);
  EXPECT_EQ(status, vnpuStreamCaptureStatusNone);
  size_t n = 0;
  ASSERT_EQ(vnpuGraphGetNodeCount(g, &n), vnpuSuccess);
  EXPECT_EQ(n, 3u);
  vnpuGraphExec_t x;
  ASSERT_EQ(vnpuGraphInstantiate(&x, g, 0), vnpuSuccess);
  ASSERT_EQ(vnpuGraphLaunch(x, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  vnpuGraphExecDestroy(x);
  vnpuGraphDestroy(g);

  // Unjoined: the forked stream's last work is not waited for: no graph, and both streams are usable.
  order.clear();
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(other, e, 0), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(other, "b", [&order] { order.push_back(2); }), vnpuSuccess);
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureUnjoined);
  EXPECT_NE(std::string(vnpuGetLastErrorString()).find("never waited for"), std::string::npos);
  ASSERT_EQ(vnpuStreamIsCapturing(other, &status), vnpuSuccess);
  EXPECT_EQ(status, vnpuStreamCaptureStatusNone);
  ASSERT_EQ(vnpuLaunchKernel(other, "d", [&order] { order.push_back(4); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(other), vnpuSuccess);
  EXPECT_EQ(order, (std::vector<int>{4}));

  // Join from outside: the capturing stream waits on an event recorded elsewhere.
  ASSERT_EQ(vnpuEventRecord(e, other), vnpuSuccess);
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  EXPECT_EQ(vnpuStreamWaitEvent(s, e, 0), vnpuErrorStreamCaptureIsolation);
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorStreamCaptureInvalidated);
  // Record and wait within the same capture: fine.
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  EXPECT_EQ(vnpuStreamWaitEvent(s, e, 0), vnpuSuccess);
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  vnpuGraphDestroy(g);
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuSuccess);  // the capture ended: the last real record counts
}

TEST_F(GraphTest, FailingNodeEndsTheLaunchAndIsNamed) {
  std::vector<int> order;
  Stream s;
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "first", [&order] { order.push_back(1); }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "bad", [] { throw std::runtime_error("boom"); }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "never", [&order] { order.push_back(3); }), vnpuSuccess);
  vnpuGraph_t g;
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  vnpuGraphExec_t x;
  ASSERT_EQ(vnpuGraphInstantiate(&x, g, 0), vnpuSuccess);
  ASSERT_EQ(vnpuGraphLaunch(x, s), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(LastMessage(), "graph node 1 'bad': boom"));
  EXPECT_EQ(order, std::vector<int>{1});
  vnpuGraphExecDestroy(x);
  vnpuGraphDestroy(g);
}

TEST_F(GraphTest, StateErrors) {
  Stream s;
  vnpuGraph_t g;
  EXPECT_EQ(vnpuStreamEndCapture(s, &g), vnpuErrorIllegalState);
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  EXPECT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuErrorIllegalState);
  EXPECT_EQ(vnpuStreamBeginCapture(s, static_cast<vnpuStreamCaptureMode>(7)), vnpuErrorInvalidValue);
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  vnpuGraphExec_t x;
  EXPECT_EQ(vnpuGraphInstantiate(&x, g, 1), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuGraphDestroy(g), vnpuSuccess);
  EXPECT_EQ(vnpuGraphLaunch(nullptr, s), vnpuErrorInvalidValue);
}

TEST_F(GraphTest, DebugDotPrintWritesOneNodePerTask) {
  std::vector<int> order;
  Stream s;
  ASSERT_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "aten::add", [] {}), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "aten::mul", [] {}), vnpuSuccess);
  vnpuGraph_t g;
  ASSERT_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  char path[] = "/tmp/vnpu_graph_test_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(vnpuGraphDebugDotPrint(g, path), vnpuSuccess);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  EXPECT_TRUE(Contains(text.str(), "0: aten::add"));
  EXPECT_TRUE(Contains(text.str(), "n0 -> n1"));
  vnpuGraphDestroy(g);
}

VNPU_CHILD_SCENARIO(graph_capture_under_launch_blocking) {
  // Capture still records under VNPU_LAUNCH_BLOCKING=1; the launch runs the whole graph before returning.
  int value = 0;
  vnpuStream_t s;
  CHILD_CHECK_EQ(vnpuStreamCreate(&s), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuLaunchKernel(s, "inc", [&value] { ++value; }), vnpuSuccess);
  CHILD_CHECK_EQ(value, 0);
  vnpuGraph_t g;
  CHILD_CHECK_EQ(vnpuStreamEndCapture(s, &g), vnpuSuccess);
  vnpuGraphExec_t x;
  CHILD_CHECK_EQ(vnpuGraphInstantiate(&x, g, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphLaunch(x, s), vnpuSuccess);
  CHILD_CHECK_EQ(value, 1);
  return 0;
}

TEST_F(GraphTest, CaptureUnderLaunchBlockingRecords) {
  EXPECT_EQ(RunScenario("graph_capture_under_launch_blocking", {"VNPU_LAUNCH_BLOCKING=1"}), 0);
}

}  // namespace
