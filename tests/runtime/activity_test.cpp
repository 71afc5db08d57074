// Activity records: off by default, one record per task while on, in stream
// order, with kind, bytes, direction, times and the launching thread's
// correlation id; dropped when recording is turned on again.
#include "test_util.h"

#include <cstdint>
#include <memory>
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

TEST_F(ActivityTest, SynchronizeWaitsForEveryDevicesRecordedTasksOnly) {
  VNPU_REQUIRE_DEVICES(2);
  auto gate = std::make_shared<Gate>();
  OpenOnExit open_gate(gate);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  Stream on1;
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(on1, "on_1", [] { std::this_thread::sleep_for(30ms); }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(on1, "on_1_gated", [gate] { gate->wait(); }), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(0), vnpuSuccess);
  // Still running (the gate is closed): a bounded wait times out, and nothing recorded is lost.
  EXPECT_EQ(vnpuActivitySynchronize(50), vnpuErrorNotReady);
  gate->open();
  ASSERT_EQ(vnpuActivitySynchronize(-1), vnpuSuccess);
  auto r = Flush();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].name, "on_1");
  EXPECT_EQ(r[1].name, "on_1_gated");
  EXPECT_EQ(r[0].device, 1);
  EXPECT_EQ(r[0].stream, on1.get());
  // A task submitted after recording was turned off is not waited for.
  auto gate2 = std::make_shared<Gate>();
  OpenOnExit open_gate2(gate2);
  ASSERT_EQ(vnpuLaunchKernel(on1, "unrecorded", [gate2] { gate2->wait(); }), vnpuSuccess);
  EXPECT_EQ(vnpuActivitySynchronize(1000), vnpuSuccess);
  gate2->open();
  ASSERT_EQ(vnpuStreamSynchronize(on1), vnpuSuccess);
  EXPECT_TRUE(Flush().empty());
}

TEST_F(ActivityTest, CopiesRecordTheirSourceAndDestinationDevices) {
  VNPU_REQUIRE_DEVICES(2);
  constexpr size_t n = 4096;
  std::vector<char> host(n, 1);
  DeviceBuffer on0(n);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  DeviceBuffer on1(n);
  Stream s1;
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(1), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(on0.get(), host.data(), n, vnpuMemcpyHostToDevice, nullptr), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(on1.get(), on0.get(), n, vnpuMemcpyDeviceToDevice, s1), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s1), vnpuSuccess);
  // A caller-owned staging buffer: no second staging, the task keeps it alive.
  std::shared_ptr<const void> staged(new char[n](), [](const void* p) { delete[] static_cast<const char*>(p); });
  std::weak_ptr<const void> watch = staged;
  ASSERT_EQ(vnpuMemcpyAsyncFromHostBuffer(on1.get(), std::move(staged), n, s1), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s1), vnpuSuccess);
  ASSERT_EQ(vnpuActivityEnable(0), vnpuSuccess);
  EXPECT_TRUE(WaitUntil([&] { return watch.expired(); }));  // released once the copy ran
  std::vector<char> back(n, 7);
  ASSERT_EQ(vnpuMemcpy(back.data(), on1.get(), n, vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, std::vector<char>(n, 0));
  auto r = Flush();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].src_device, -1);
  EXPECT_EQ(r[0].dst_device, 0);
  EXPECT_EQ(r[1].copy_kind, vnpuMemcpyDeviceToDevice);
  EXPECT_EQ(r[1].src_device, 0);
  EXPECT_EQ(r[1].dst_device, 1);
  EXPECT_EQ(r[1].device, 1);
  EXPECT_EQ(r[2].kind, vnpuActivityKindMemcpy);
  EXPECT_EQ(r[2].copy_kind, vnpuMemcpyHostToDevice);
  EXPECT_EQ(r[2].bytes, n);
  EXPECT_EQ(r[2].host_pinned, 0);
  EXPECT_EQ(r[2].dst_device, 1);
  std::shared_ptr<const void> one(new char[1](), std::default_delete<char[]>());
  EXPECT_EQ(vnpuMemcpyAsyncFromHostBuffer(host.data(), one, 1, nullptr), vnpuErrorInvalidValue);  // the destination must be device memory
}

TEST_F(ActivityTest, BadArguments) {
  EXPECT_EQ(vnpuActivityPopExternalCorrelationId(nullptr), vnpuErrorInvalidValue);  // empty stack
  EXPECT_EQ(vnpuActivityFlushAll(nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuActivityGetTimestamp(nullptr), vnpuErrorInvalidValue);
}

}  // namespace
