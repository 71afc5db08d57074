// Events: record / query / synchronize, cross-stream waits, elapsed time,
// lifetime. CUDA semantics: a never-recorded event is complete, and a wait or
// synchronize refers to the most recent record at the time of the call.
#include "test_util.h"

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace vnpu_test;

namespace {

using EventTest = RuntimeTest;

// Thread-safe log of what ran, in order.
class Log {
 public:
  void add(std::string s) {
    std::lock_guard<std::mutex> g(mu_);
    v_.push_back(std::move(s));
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> g(mu_);
    return v_;
  }

 private:
  std::mutex mu_;  // guards v_
  std::vector<std::string> v_;
};

// ---- basics ---------------------------------------------------------------------

TEST_F(EventTest, NeverRecordedEventIsComplete) {
  std::atomic<bool> ran{false};
  Event e;
  EXPECT_EQ(vnpuEventQuery(e), vnpuSuccess);
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  Stream s;
  EXPECT_EQ(vnpuStreamWaitEvent(s, e), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "k", [&ran] { ran = true; }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(ran.load()) << "waiting on a never-recorded event blocked the stream";
}

TEST_F(EventTest, RecordQuerySynchronize) {
  std::atomic<bool> before_done{false};
  Stream s;
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "before", [&before_done] { before_done = true; }), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  EXPECT_EQ(vnpuEventQuery(e), vnpuErrorNotReady);
  gate->open();
  ASSERT_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  EXPECT_TRUE(before_done.load()) << "event completed before the work recorded ahead of it";
  EXPECT_EQ(vnpuEventQuery(e), vnpuSuccess);
}

TEST_F(EventTest, EventDoesNotWaitForLaterWork) {
  Stream s;
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);  // submitted after the record
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  EXPECT_EQ(vnpuEventQuery(e), vnpuSuccess);
  EXPECT_EQ(vnpuStreamQuery(s), vnpuErrorNotReady);
}

TEST_F(EventTest, RecordOnNullStreamUsesCurrentDefaultStream) {
  VNPU_REQUIRE_DEVICES(2);
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, nullptr), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  EXPECT_EQ(vnpuEventQuery(e), vnpuErrorNotReady) << "recorded on device 0's stream instead of device 1's";
  gate->open();
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  EXPECT_EQ(vnpuEventQuery(e), vnpuSuccess);
}

TEST_F(EventTest, InvalidArguments) {
  EXPECT_EQ(vnpuEventCreate(nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuEventCreateWithFlags(nullptr, vnpuEventDisableTiming), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuEventRecord(nullptr, nullptr), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventQuery(nullptr), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventSynchronize(nullptr), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventDestroy(nullptr), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuStreamWaitEvent(nullptr, nullptr), vnpuErrorInvalidResourceHandle);
}

// ---- cross-stream dependencies ------------------------------------------------------

TEST_F(EventTest, StreamWaitsForEventRecordedOnAnotherStream) {
  Log log;  // outlives the streams, whose destruction waits for their kernels
  Stream a, b;
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(a, gate), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(a, "A", [&log] {
              std::this_thread::sleep_for(10ms);
              log.add("A");
            }),
            vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(b, e), vnpuSuccess);  // returns at once: the wait is on the device
  ASSERT_EQ(vnpuLaunchKernel(b, "B", [&log] { log.add("B"); }), vnpuSuccess);

  std::this_thread::sleep_for(50ms);  // time for a broken wait to let B run early
  EXPECT_EQ(vnpuStreamQuery(b), vnpuErrorNotReady);
  EXPECT_TRUE(log.get().empty()) << "B ran before the event it waits for";
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  EXPECT_EQ(log.get(), (std::vector<std::string>{"A", "B"}));
  // The wait did not stall A either.
  EXPECT_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
}

TEST_F(EventTest, StreamWaitAcrossDevices) {
  VNPU_REQUIRE_DEVICES(2);
  Log log;
  Event e;
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  Stream a1;
  ASSERT_EQ(vnpuLaunchKernel(a1, "A", [&log] {
              std::this_thread::sleep_for(30ms);
              log.add("A");
            }),
            vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, a1), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(nullptr, e), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "B", [&log] { log.add("B"); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_EQ(log.get(), (std::vector<std::string>{"A", "B"}));
}

TEST_F(EventTest, WaitRefersToTheRecordCurrentAtCallTime) {
  // CUDA: re-recording an event does not change what an earlier
  // vnpuStreamWaitEvent waits for.
  Log log;
  Stream a, b, c;
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(a, gate), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(a, "A", [&log] { log.add("A"); }), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  ASSERT_EQ(vnpuStreamWaitEvent(b, e), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(b, "B", [&log] { log.add("B"); }), vnpuSuccess);
  // Re-record on an idle stream: that record completes at once.
  ASSERT_EQ(vnpuEventRecord(e, c), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(c), vnpuSuccess);
  EXPECT_EQ(vnpuEventQuery(e), vnpuSuccess) << "query reflects the latest record";

  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(vnpuStreamQuery(b), vnpuErrorNotReady)
      << "B's wait was released by a later record on another stream";
  EXPECT_TRUE(log.get().empty());
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  EXPECT_EQ(log.get(), (std::vector<std::string>{"A", "B"}));
}

TEST_F(EventTest, SynchronizeRefersToTheRecordCurrentAtCallTime) {
  Stream a, c;
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(a, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  std::atomic<bool> calling{false}, returned{false};
  std::thread waiter([&] {
    calling = true;
    vnpuEventSynchronize(e);
    returned = true;
  });
  // Let the waiter enter vnpuEventSynchronize (and pick the first record as
  // its target) before the event is re-recorded.
  EXPECT_TRUE(WaitUntil([&] { return calling.load(); }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(vnpuEventRecord(e, c), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(c), vnpuSuccess);
  std::this_thread::sleep_for(50ms);
  bool early = returned.load();
  gate->open();
  waiter.join();
  EXPECT_FALSE(early) << "vnpuEventSynchronize returned before the record it was waiting for completed";
  EXPECT_TRUE(returned.load());
}

TEST_F(EventTest, ManyThreadsSynchronizeOneEvent) {
  Stream s;
  Event e;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      if (vnpuEventSynchronize(e) == vnpuSuccess && vnpuEventQuery(e) == vnpuSuccess) ++ok;
    });
  }
  std::this_thread::sleep_for(10ms);
  gate->open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
}

// ---- elapsed time --------------------------------------------------------------------

TEST_F(EventTest, ElapsedTimeMeasuresTheWorkBetweenRecords) {
  Stream s;
  Event start, end;
  ASSERT_EQ(vnpuEventRecord(start, s), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "sleep20ms", [] { std::this_thread::sleep_for(20ms); }), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(end, s), vnpuSuccess);
  ASSERT_EQ(vnpuEventSynchronize(end), vnpuSuccess);
  float ms = -1.0f;
  ASSERT_EQ(vnpuEventElapsedTime(&ms, start, end), vnpuSuccess);
  EXPECT_GE(ms, 15.0f);
  float zero = -1.0f;
  ASSERT_EQ(vnpuEventElapsedTime(&zero, start, start), vnpuSuccess);
  EXPECT_EQ(zero, 0.0f);
}

TEST_F(EventTest, ElapsedTimeIsDeviceTimeNotHostTime) {
  // The host waits 300 ms between the two records, but the stream reaches
  // both only after the gate opens, back to back: the interval is what the
  // stream did between them (about 0), not when the host issued them.
  Stream s;
  Event start, end;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(start, s), vnpuSuccess);
  std::this_thread::sleep_for(300ms);
  ASSERT_EQ(vnpuEventRecord(end, s), vnpuSuccess);
  gate->open();
  ASSERT_EQ(vnpuEventSynchronize(end), vnpuSuccess);
  float ms = -1.0f;
  ASSERT_EQ(vnpuEventElapsedTime(&ms, start, end), vnpuSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 150.0f) << "timestamps were taken when the host recorded, not when the stream ran";
}

TEST_F(EventTest, ElapsedTimeRejectsDisabledTiming) {
  Stream s;
  Event timed, untimed(vnpuEventDisableTiming);
  ASSERT_EQ(vnpuEventRecord(timed, s), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(untimed, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  float ms = 123.0f;
  EXPECT_EQ(vnpuEventElapsedTime(&ms, timed, untimed), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, untimed, timed), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(ms, 123.0f) << "output written on failure";
  // A timing-disabled event is otherwise a normal event.
  EXPECT_EQ(vnpuEventQuery(untimed), vnpuSuccess);
  EXPECT_EQ(vnpuEventSynchronize(untimed), vnpuSuccess);
}

TEST_F(EventTest, ElapsedTimeRejectsUnrecordedAndPendingEvents) {
  Stream s;
  Event a, b, never;
  float ms = 0;
  EXPECT_EQ(vnpuEventElapsedTime(nullptr, a, b), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, nullptr, b), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, a, nullptr), vnpuErrorInvalidResourceHandle);

  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuEventRecord(a, s), vnpuSuccess);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(b, s), vnpuSuccess);
  ASSERT_EQ(vnpuEventSynchronize(a), vnpuSuccess);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, a, never), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, never, a), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, a, b), vnpuErrorNotReady);
  gate->open();
  ASSERT_EQ(vnpuEventSynchronize(b), vnpuSuccess);
  EXPECT_EQ(vnpuEventElapsedTime(&ms, a, b), vnpuSuccess);
}

// ---- lifetime -----------------------------------------------------------------------

TEST_F(EventTest, DestroyWhileRecordPendingIsSafe) {
  std::atomic<bool> ran{false};
  Stream s;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  vnpuEvent_t e = nullptr;
  ASSERT_EQ(vnpuEventCreate(&e), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  std::thread opener([gate] {
    std::this_thread::sleep_for(20ms);
    gate->open();
  });
  EXPECT_EQ(vnpuEventDestroy(e), vnpuSuccess);
  opener.join();
  ASSERT_EQ(vnpuLaunchKernel(s, "after", [&ran] { ran = true; }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(ran.load());
}

TEST_F(EventTest, DestroyRightAfterRecordAndWaitIsSafe) {
  // The common pattern "record on A, make B wait, drop the event": the
  // runtime must keep the event alive for the work that still refers to it.
  // (A use-after-free here shows as a crash, a hang or a sanitizer report.)
  std::atomic<int> a_done{0}, b_checks_failed{0};
  Stream a, b;
  for (int i = 0; i < 300; ++i) {
    vnpuEvent_t e = nullptr;
    ASSERT_EQ(vnpuEventCreate(&e), vnpuSuccess);
    ASSERT_EQ(vnpuLaunchKernel(a, "A", [&a_done] { ++a_done; }), vnpuSuccess);
    ASSERT_EQ(vnpuEventRecord(e, a), vnpuSuccess);
    ASSERT_EQ(vnpuStreamWaitEvent(b, e), vnpuSuccess);
    ASSERT_EQ(vnpuLaunchKernel(b, "B", [&a_done, &b_checks_failed, i] {
                if (a_done.load() < i + 1) ++b_checks_failed;
              }),
              vnpuSuccess);
    ASSERT_EQ(vnpuEventDestroy(e), vnpuSuccess);
  }
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  EXPECT_EQ(a_done.load(), 300);
  EXPECT_EQ(b_checks_failed.load(), 0) << "B ran before the A it waited for";
}

}  // namespace
