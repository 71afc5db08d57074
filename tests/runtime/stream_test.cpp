// Streams: in-order queues with one worker thread each, concurrency between
// streams, query/synchronize, default streams, priorities, kernel launches.
#include "test_util.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using namespace vnpu_test;

namespace {

using StreamTest = RuntimeTest;

// ---- ordering and threads -------------------------------------------------

TEST_F(StreamTest, TasksRunInSubmissionOrder) {
  std::mutex mu;  // guards order (the runtime should make it unnecessary; the test must not race if it does not)
  std::vector<int> order;
  Stream s;  // declared after what its kernels touch: destroying it waits for them
  constexpr int kTasks = 500;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(vnpuLaunchKernel(s, "append",
                               [i, &mu, &order] {
                                 // Early tasks are slower: a reordering runtime would show it.
                                 if (i < 5) std::this_thread::sleep_for(2ms);
                                 std::lock_guard<std::mutex> g(mu);
                                 order.push_back(i);
                               }),
              vnpuSuccess);
  }
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  ASSERT_EQ(order.size(), size_t(kTasks));
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(order[i], i) << "task " << i << " out of order";
}

TEST_F(StreamTest, KernelsCopiesAndMemsetsShareOneOrder) {
  DeviceBuffer d(4 * sizeof(int));
  PinnedBuffer h(4 * sizeof(int));
  Stream s;
  int* dev = d.as<int>();
  ASSERT_EQ(vnpuMemsetAsync(dev, 0, 4 * sizeof(int), s), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "inc", [dev] { for (int i = 0; i < 4; ++i) dev[i] += i + 1; }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "double", [dev] { for (int i = 0; i < 4; ++i) dev[i] *= 2; }), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(h.get(), dev, 4 * sizeof(int), vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.as<int>()[i], 2 * (i + 1));
}

TEST_F(StreamTest, EachStreamHasOneWorkerThread) {
  std::mutex mu;  // guards ids_*
  std::set<std::thread::id> ids_a, ids_b;
  Stream a, b;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(vnpuLaunchKernel(a, "id", [&] { std::lock_guard<std::mutex> g(mu); ids_a.insert(std::this_thread::get_id()); }), vnpuSuccess);
    ASSERT_EQ(vnpuLaunchKernel(b, "id", [&] { std::lock_guard<std::mutex> g(mu); ids_b.insert(std::this_thread::get_id()); }), vnpuSuccess);
  }
  ASSERT_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  ASSERT_EQ(ids_a.size(), 1u);
  ASSERT_EQ(ids_b.size(), 1u);
  EXPECT_NE(*ids_a.begin(), *ids_b.begin()) << "two streams share a worker";
  EXPECT_EQ(ids_a.count(std::this_thread::get_id()), 0u) << "kernel ran on the submitting thread";
}

TEST_F(StreamTest, LaunchReturnsBeforeTheKernelRuns) {
  std::atomic<bool> ran{false};
  Stream s;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "flag", [&ran] { ran = true; }), vnpuSuccess);
  // Both launches returned while the first kernel is still blocked.
  EXPECT_FALSE(ran.load());
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(ran.load());
}

TEST_F(StreamTest, DifferentStreamsRunConcurrently) {
  // A kernel on A blocks until a kernel on B has run: only possible if B
  // makes progress while A is busy.
  Stream a, b;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  auto a_timed_out = std::make_shared<std::atomic<bool>>(false);
  ASSERT_EQ(LaunchGate(a, gate, a_timed_out), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(b, "open_gate", [gate] { gate->open(); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  EXPECT_FALSE(a_timed_out->load()) << "stream B did not run while stream A was busy";
}

TEST_F(StreamTest, DefaultStreamsOfTwoDevicesRunConcurrently) {
  VNPU_REQUIRE_DEVICES(2);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  auto timed_out = std::make_shared<std::atomic<bool>>(false);
  ASSERT_EQ(LaunchGate(nullptr, gate, timed_out), vnpuSuccess);  // device 0
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "open_gate", [gate] { gate->open(); }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_FALSE(timed_out->load());
}

// ---- query and synchronize ---------------------------------------------------

TEST_F(StreamTest, QueryReportsNotReadyThenSuccess) {
  Stream s;
  EXPECT_EQ(vnpuStreamQuery(s), vnpuSuccess) << "a fresh stream is idle";
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  EXPECT_EQ(vnpuStreamQuery(s), vnpuErrorNotReady);
  EXPECT_EQ(vnpuStreamQuery(s), vnpuErrorNotReady) << "query must not consume anything";
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(vnpuStreamQuery(s), vnpuSuccess);
  // NotReady is not an error: nothing is pending on the device.
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
}

TEST_F(StreamTest, QueryBecomesSuccessWithoutSynchronize) {
  Stream s;
  ASSERT_EQ(vnpuLaunchKernel(s, "sleep", [] { std::this_thread::sleep_for(10ms); }), vnpuSuccess);
  EXPECT_TRUE(WaitUntil([&] { return vnpuStreamQuery(s) == vnpuSuccess; }));
}

TEST_F(StreamTest, SynchronizeWaitsForAllPriorWork) {
  std::atomic<int> done{0};
  Stream s;
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(vnpuLaunchKernel(s, "sleep", [&done] {
                std::this_thread::sleep_for(5ms);
                ++done;
              }),
              vnpuSuccess);
  }
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(done.load(), 5);
}

TEST_F(StreamTest, SynchronizersWithDifferentTargetsEachWakeAtTheirOwn) {
  // Note [Completion wake-ups]: the worker wakes waiters only once the lowest
  // awaited count is reached; a waiter for a later point must still wake at it,
  // and the earlier one must wake at its own point (the later tasks wait for it).
  constexpr int kFirst = 10, kTotal = 30;
  std::atomic<int> done{0};
  std::atomic<bool> release{false}, a_returned{false};
  Stream s;
  auto first = [&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
    ++done;
  };
  const auto deadline = std::chrono::steady_clock::now() + 5s;  // a lost wake-up fails, never hangs
  auto second = [&] {
    while (!a_returned.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    ++done;
  };
  for (int i = 0; i < kFirst; ++i) ASSERT_EQ(vnpuLaunchKernel(s, "first", first), vnpuSuccess);
  std::atomic<int> seen_first{-1}, seen_all{-1};
  std::atomic<bool> a_started{false};
  std::thread a([&] {
    a_started = true;
    EXPECT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
    seen_first = done.load();
    a_returned = true;
  });
  while (!a_started.load()) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);  // `a` waits for task 10
  for (int i = kFirst; i < kTotal; ++i) ASSERT_EQ(vnpuLaunchKernel(s, "second", second), vnpuSuccess);
  std::thread b([&] {
    EXPECT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
    seen_all = done.load();
  });
  std::this_thread::sleep_for(20ms);  // `b` waits for task 30
  release = true;
  a.join();
  b.join();
  EXPECT_EQ(seen_first.load(), kFirst);  // woke at its own point, not at the end
  EXPECT_EQ(seen_all.load(), kTotal);
}

// ---- default stream and devices -------------------------------------------------

TEST_F(StreamTest, NullStreamIsTheCurrentDevicesDefaultStream) {
  VNPU_REQUIRE_DEVICES(2);
  vnpuStream_t d0 = nullptr, d1 = nullptr;
  ASSERT_EQ(vnpuGetDefaultStream(0, &d0), vnpuSuccess);
  ASSERT_EQ(vnpuGetDefaultStream(1, &d1), vnpuSuccess);
  ASSERT_NE(d0, nullptr);
  EXPECT_NE(d0, d1);
  vnpuStream_t again = nullptr;
  ASSERT_EQ(vnpuGetDefaultStream(0, &again), vnpuSuccess);
  EXPECT_EQ(again, d0) << "the default stream is a fixed handle";

  // Work on the null stream while device 1 is current lands on d1.
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(LaunchGate(nullptr, gate), vnpuSuccess);
  EXPECT_EQ(vnpuStreamQuery(d1), vnpuErrorNotReady);
  EXPECT_EQ(vnpuStreamQuery(d0), vnpuSuccess);
  int dev = -1;
  ASSERT_EQ(vnpuStreamGetDevice(nullptr, &dev), vnpuSuccess);
  EXPECT_EQ(dev, 1);
  ASSERT_EQ(vnpuStreamGetDevice(d0, &dev), vnpuSuccess);
  EXPECT_EQ(dev, 0);
  gate->open();
  EXPECT_EQ(vnpuStreamSynchronize(d1), vnpuSuccess);
}

TEST_F(StreamTest, DefaultStreamRejectsInvalidDevice) {
  vnpuStream_t s = nullptr;
  EXPECT_EQ(vnpuGetDefaultStream(-1, &s), vnpuErrorInvalidDevice);
  EXPECT_EQ(vnpuGetDefaultStream(device_count_, &s), vnpuErrorInvalidDevice);
  EXPECT_EQ(vnpuGetDefaultStream(0, nullptr), vnpuErrorInvalidValue);
}

TEST_F(StreamTest, StreamBelongsToTheDeviceCurrentAtCreation) {
  VNPU_REQUIRE_DEVICES(2);
  int seen = -1;
  void* p = nullptr;
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  Stream s;
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  int dev = -1;
  ASSERT_EQ(vnpuStreamGetDevice(s, &dev), vnpuSuccess);
  EXPECT_EQ(dev, 1);
  // Kernels run with their stream's device current, whatever the caller's is.
  ASSERT_EQ(vnpuLaunchKernel(s, "probe",
                             [&seen, &p] {
                               vnpuGetDevice(&seen);
                               vnpuMalloc(&p, 64);
                             }),
            vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(seen, 1);
  vnpuPointerAttributes a{};
  ASSERT_EQ(vnpuPointerGetAttributes(&a, p), vnpuSuccess);
  EXPECT_EQ(a.device, 1) << "a kernel's allocation landed on the wrong device";
  EXPECT_EQ(vnpuFree(p), vnpuSuccess);
}

// ---- priorities ---------------------------------------------------------------

TEST_F(StreamTest, PriorityRangeAndClamping) {
  int least = 99, greatest = 99;
  ASSERT_EQ(vnpuDeviceGetStreamPriorityRange(&least, &greatest), vnpuSuccess);
  EXPECT_EQ(least, 0);
  EXPECT_EQ(greatest, -1);
  EXPECT_EQ(vnpuDeviceGetStreamPriorityRange(nullptr, &greatest), vnpuErrorInvalidValue);

  int p = 99;
  ASSERT_EQ(vnpuStreamGetPriority(nullptr, &p), vnpuSuccess);
  EXPECT_EQ(p, 0) << "default stream priority";
  {
    Stream s;
    ASSERT_EQ(vnpuStreamGetPriority(s, &p), vnpuSuccess);
    EXPECT_EQ(p, 0);
  }
  for (auto [asked, expected] : {std::pair{-1, -1}, {0, 0}, {-7, -1}, {5, 0}}) {
    Stream s(asked);
    ASSERT_EQ(vnpuStreamGetPriority(s, &p), vnpuSuccess);
    EXPECT_EQ(p, expected) << "asked for " << asked;
  }
  EXPECT_EQ(vnpuStreamGetPriority(nullptr, nullptr), vnpuErrorInvalidValue);
}

TEST_F(StreamTest, HighPriorityStreamRunsWork) {
  std::atomic<bool> ran{false};
  Stream s(-1);
  ASSERT_EQ(vnpuLaunchKernel(s, "k", [&ran] { ran = true; }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_TRUE(ran.load());
}

// ---- creation and destruction ------------------------------------------------

TEST_F(StreamTest, CreateRejectsNullOutParameter) {
  EXPECT_EQ(vnpuStreamCreate(nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuStreamCreateWithPriority(nullptr, 0, 0), vnpuErrorInvalidValue);
}

TEST_F(StreamTest, DestroyRejectsDefaultAndNullStreams) {
  vnpuStream_t d0 = nullptr;
  ASSERT_EQ(vnpuGetDefaultStream(0, &d0), vnpuSuccess);
  EXPECT_EQ(vnpuStreamDestroy(d0), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuStreamDestroy(nullptr), vnpuErrorInvalidResourceHandle);
  // The default stream still works.
  std::atomic<bool> ran{false};
  ASSERT_EQ(vnpuLaunchKernel(d0, "k", [&ran] { ran = true; }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(d0), vnpuSuccess);
  EXPECT_TRUE(ran.load());
}

TEST_F(StreamTest, DestroyLetsPendingWorkFinish) {
  std::atomic<int> done{0};
  DrainOnExit drain;  // a failed ASSERT below leaves s undestroyed: its kernels touch `done`
  vnpuStream_t s = nullptr;
  ASSERT_EQ(vnpuStreamCreate(&s), vnpuSuccess);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(vnpuLaunchKernel(s, "slow", [&done] {
                std::this_thread::sleep_for(10ms);
                ++done;
              }),
              vnpuSuccess);
  }
  ASSERT_EQ(vnpuStreamDestroy(s), vnpuSuccess);
  EXPECT_EQ(done.load(), 3);
}

TEST_F(StreamTest, ManyStreamsCanBeCreatedAndDestroyed) {
  std::atomic<int> ran{0};
  DrainOnExit drain;  // kernels touch `ran`
  for (int round = 0; round < 3; ++round) {
    std::vector<vnpuStream_t> streams(32);
    for (auto& s : streams) ASSERT_EQ(vnpuStreamCreate(&s), vnpuSuccess);
    for (auto s : streams) ASSERT_EQ(vnpuLaunchKernel(s, "k", [&ran] { ++ran; }), vnpuSuccess);
    // Half are destroyed without ever being synchronized; one never ran work.
    for (auto s : streams) ASSERT_EQ(vnpuStreamDestroy(s), vnpuSuccess);
    vnpuStream_t idle = nullptr;
    ASSERT_EQ(vnpuStreamCreate(&idle), vnpuSuccess);
    ASSERT_EQ(vnpuStreamDestroy(idle), vnpuSuccess);
  }
  EXPECT_EQ(ran.load(), 3 * 32);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
}

// ---- launches -----------------------------------------------------------------

TEST_F(StreamTest, LaunchRejectsEmptyKernel) {
  EXPECT_EQ(vnpuLaunchKernel(nullptr, "empty", vnpuKernel_t{}), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuLaunchHostFunc(nullptr, nullptr, nullptr), vnpuErrorInvalidValue);
}

TEST_F(StreamTest, LaunchAcceptsNullName) {
  std::atomic<bool> ran{false};
  ASSERT_EQ(vnpuLaunchKernel(nullptr, nullptr, [&ran] { ran = true; }), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_TRUE(ran.load());
}

void AppendUserData(void* data) {
  auto* v = static_cast<std::vector<int>*>(data);
  v->push_back(static_cast<int>(v->size()));
}

TEST_F(StreamTest, HostFuncRunsInStreamOrderWithUserData) {
  std::vector<int> v;
  std::atomic<bool> kernel_saw_two{false};
  Stream s;
  ASSERT_EQ(vnpuLaunchHostFunc(s, AppendUserData, &v), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchHostFunc(s, AppendUserData, &v), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "check", [&] { kernel_saw_two = v.size() == 2; }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchHostFunc(s, AppendUserData, &v), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(v, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(kernel_saw_two.load());
}

TEST_F(StreamTest, ConcurrentSubmittersToOneStream) {
  // Many host threads submitting to one stream: every task runs exactly once,
  // and each thread's own tasks keep their relative order.
  constexpr int kThreads = 4, kPerThread = 200;
  std::mutex mu;  // guards last
  std::vector<int> last(kThreads, -1);
  std::atomic<int> out_of_order{0}, ran{0};
  Stream s;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        vnpuLaunchKernel(s, "k", [&, t, i] {
          std::lock_guard<std::mutex> g(mu);
          if (last[t] != i - 1) ++out_of_order;
          last[t] = i;
          ++ran;
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(ran.load(), kThreads * kPerThread);
  EXPECT_EQ(out_of_order.load(), 0);
}

}  // namespace

// ---- worker idle hook ------------------------------------------------------

namespace idle_hook {
std::atomic<int> calls{0};
std::atomic<std::thread::id> thread{};
void hook() {
  calls.fetch_add(1);
  thread.store(std::this_thread::get_id());
}
}  // namespace idle_hook

TEST_F(StreamTest, IdleHookWaitsForTheLinger) {
  idle_hook::calls = 0;
  ASSERT_EQ(vnpuSetWorkerIdleHook(&idle_hook::hook, 60u * 1000 * 1000), vnpuSuccess);  // 60 s
  {
    Stream s;
    ASSERT_EQ(vnpuLaunchKernel(s, "work", [] {}), vnpuSuccess);
    ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(idle_hook::calls.load(), 0);
  }  // destroying the stream wakes its worker: no call
  EXPECT_EQ(idle_hook::calls.load(), 0);
  ASSERT_EQ(vnpuSetWorkerIdleHook(nullptr, 0), vnpuSuccess);
}

TEST_F(StreamTest, IdleHookRunsOnTheWorkerAfterTheLingerOnlyOncePerBurst) {
  idle_hook::calls = 0;
  ASSERT_EQ(vnpuSetWorkerIdleHook(&idle_hook::hook, 20000), vnpuSuccess);  // 20 ms
  Stream s;
  std::atomic<std::thread::id> worker{};
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(vnpuLaunchKernel(s, "note", [&] { worker.store(std::this_thread::get_id()); }), vnpuSuccess);
  }
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(idle_hook::calls.load(), 1);  // once, not once per task or per linger period
  EXPECT_EQ(idle_hook::thread.load(), worker.load());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(idle_hook::calls.load(), 1);  // idle without new work: no more calls
  ASSERT_EQ(vnpuLaunchKernel(s, "again", [] {}), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(idle_hook::calls.load(), 2);
  ASSERT_EQ(vnpuSetWorkerIdleHook(nullptr, 0), vnpuSuccess);
}

TEST_F(StreamTest, CheckHandleKnowsLiveStreamsOnly) {
  int device = -1;
  Stream s;
  ASSERT_EQ(vnpuStreamCheckHandle(s, &device), vnpuSuccess);
  EXPECT_EQ(device, 0);
  vnpuStream_t def = nullptr;
  ASSERT_EQ(vnpuGetDefaultStream(0, &def), vnpuSuccess);
  EXPECT_EQ(vnpuStreamCheckHandle(def, &device), vnpuSuccess);
  EXPECT_EQ(vnpuStreamCheckHandle(nullptr, &device), vnpuErrorInvalidResourceHandle);
  int not_a_stream = 0;
  EXPECT_EQ(vnpuStreamCheckHandle(reinterpret_cast<vnpuStream_t>(&not_a_stream), &device),
            vnpuErrorInvalidResourceHandle);
  vnpuStream_t gone = nullptr;
  ASSERT_EQ(vnpuStreamCreate(&gone), vnpuSuccess);
  ASSERT_EQ(vnpuStreamDestroy(gone), vnpuSuccess);
  EXPECT_EQ(vnpuStreamCheckHandle(gone, &device), vnpuErrorInvalidResourceHandle);
  EXPECT_EQ(vnpuStreamCheckHandle(s, nullptr), vnpuErrorInvalidValue);
}
