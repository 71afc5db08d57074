// Activity records: off by default, one record per task while on, in stream
// order, with kind, bytes, direction, times and the launching thread's
// correlation id; dropped when recording is turned on again.
#include "test_util.h"

#include <cstdint>
#include <vector>

using namespace vnpu_test;

namespace {

class ActivityTest : public RuntimeTest {
 protected:
  void TearDown() override {
    vnpuActivityEnable(0);
    uint64_t id;
    while (vnpuActivityPopExternalCorrelationId(&id) == vnpuSuccess) {
    }
    std::vector<vnpuActivityRecord> drop;
    vnpuActivityFlushAll(&drop);
    RuntimeTest::TearDown();
  }
  static std::vector<vnpuActivityRecord> Flush() {
    std::vector<vnpuActivityRecord> r;
    EXPECT_EQ(vnpuActivityFlushAll(&r), vnpuSuccess);
    return r;
  }
};

TEST_F(ActivityTest, NothingIsRecordedWhenOff) {
  ASSERT_EQ(vnpuActivityIsEnabled(), 0);
  Stream s;
  ASSERT_EQ(vnpuLaunchKernel(s, "k", [] {}), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(Flush().empty());
}

TEST_F(ActivityTest, RecordsKernelsCopiesAndMemsetInStreamOrder) {
  constexpr size_t n = 1 << 16;
  std::vector<char> host(n, 3), back(n, 0);
  DeviceBuffer d(n);
  PinnedBuffer pinned(n);
  Stream s;
  int64_t t0 = 0, t1 = 0;
  ASSERT_EQ(vnpuActivityGetTimestamp(&t0), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);
  ASSERT_EQ(vnpuActivityIsEnabled(), 1);
  ASSERT_EQ(vnpuActivityPushExternalCorrelationId(7), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(d.get(), host.data(), n, vnpuMemcpyHostToDevice, s), vnpuSuccess);
  ASSERT_EQ(vnpuActivityPushExternalCorrelationId(8), vnpuSuccess);  // nested: the innermost wins
  ASSERT_EQ(vnpuLaunchKernel(s, "my_kernel", [] { std::this_thread::sleep_for(2ms); }), vnpuSuccess);
  uint64_t popped = 0;
  ASSERT_EQ(vnpuActivityPopExternalCorrelationId(&popped), vnpuSuccess);
  EXPECT_EQ(popped, 8u);
  ASSERT_EQ(vnpuMemsetAsync(d.get(), 0, 100, s), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(pinned.get(), d.get(), n, vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  ASSERT_EQ(vnpuActivityPopExternalCorrelationId(&popped), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(back.data(), d.get(), n, vnpuMemcpyDeviceToHost, s), vnpuSuccess);  // pageable: waits
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(0), vnpuSuccess);
  ASSERT_EQ(vnpuActivityGetTimestamp(&t1), vnpuSuccess);

  auto r = Flush();
  ASSERT_EQ(r.size(), 5u);
  const vnpuActivityKind kinds[] = {vnpuActivityKindMemcpy, vnpuActivityKindKernel, vnpuActivityKindMemset,
                                    vnpuActivityKindMemcpy, vnpuActivityKindMemcpy};
  const uint64_t corr[] = {7, 8, 7, 7, 0};
  for (size_t i = 0; i < r.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r[i].kind, kinds[i]);
    EXPECT_EQ(r[i].correlation_id, corr[i]);
    EXPECT_EQ(r[i].stream, s.get());
    EXPECT_EQ(r[i].device, 0);
    EXPECT_EQ(r[i].failed, 0);
    EXPECT_LE(t0, r[i].queued_ns);
    EXPECT_LE(r[i].queued_ns, r[i].start_ns);
    EXPECT_LE(r[i].start_ns, r[i].end_ns);
    EXPECT_LE(r[i].end_ns, t1);
    if (i > 0) EXPECT_LE(r[i - 1].end_ns, r[i].start_ns);  // one stream: in order, no overlap
  }
  EXPECT_EQ(r[1].name, "my_kernel");
  EXPECT_GE(r[1].end_ns - r[1].start_ns, 2'000'000);
  EXPECT_EQ(r[0].bytes, n);
  EXPECT_EQ(r[0].copy_kind, vnpuMemcpyHostToDevice);
  EXPECT_EQ(r[0].host_pinned, 0);
  EXPECT_EQ(r[2].bytes, 100u);
  EXPECT_EQ(r[3].copy_kind, vnpuMemcpyDeviceToHost);
  EXPECT_EQ(r[3].host_pinned, 1);
  EXPECT_EQ(r[4].copy_kind, vnpuMemcpyDeviceToHost);
  EXPECT_EQ(r[4].host_pinned, 0);
  EXPECT_TRUE(Flush().empty());  // flushed once
}

TEST_F(ActivityTest, StreamsAreTellApartAndSyncTasksMarked) {
  Stream a, b;
  Event e;
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);
  Gate gate;
  ASSERT_EQ(vnpuLaunchKernel(a, "on_a", [&] { gate.wait(); }), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(b, e), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(b, "on_b", [] {}), vnpuSuccess);
  gate.open();
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  auto r = Flush();
  std::vector<std::string> on_a, on_b;
  int64_t a_end = 0, b_start = 0;
  for (const auto& x : r) {
    (x.stream == a.get() ? on_a : on_b).push_back(x.name);
    if (x.name == "on_a") a_end = x.end_ns;
    if (x.name == "on_b") b_start = x.start_ns;
    EXPECT_EQ(x.kind, x.name.rfind("event", 0) == 0 ? vnpuActivityKindSync : vnpuActivityKindKernel) << x.name;
  }
  EXPECT_EQ(on_a, (std::vector<std::string>{"on_a", "event record"}));
  EXPECT_EQ(on_b, (std::vector<std::string>{"event wait", "on_b"}));
  EXPECT_LE(a_end, b_start);  // the wait ordered b after a
}

TEST_F(ActivityTest, FailedKernelIsRecordedAndEnablingDropsOldRecords) {
  Stream s;
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "bad", [] { throw std::runtime_error("boom"); }), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  auto r = Flush();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].name, "bad");
  EXPECT_EQ(r[0].failed, 1);
  ASSERT_EQ(vnpuLaunchKernel(s, "stale", [] {}), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);  // a new session starts empty
  EXPECT_TRUE(Flush().empty());
}

TEST_F(ActivityTest, BadArguments) {
  EXPECT_EQ(vnpuActivityPopExternalCorrelationId(nullptr), vnpuErrorInvalidValue);  // empty stack
  EXPECT_EQ(vnpuActivityFlushAll(nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuActivityGetTimestamp(nullptr), vnpuErrorInvalidValue);
}

}  // namespace
