// Errors: codes and messages, the per-device asynchronous error raised by a
// failing kernel (reported once, device stays usable), invalid device
// ordinals, launch blocking, and use after fork().
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

using namespace vnpu_test;

namespace {

using ErrorTest = RuntimeTest;

vnpuKernel_t Throwing(const char* message) {
  return [message] { throw std::runtime_error(message); };
}

// The device still runs kernels and copies correctly.
void ExpectDeviceWorks() {
  DeviceBuffer d(sizeof(int));
  int* dev = d.as<int>();
  ASSERT_EQ(vnpuMemsetAsync(dev, 0, sizeof(int), nullptr), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "inc", [dev] { *dev += 41; }), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "inc", [dev] { *dev += 1; }), vnpuSuccess);
  int back = 0;
  ASSERT_EQ(vnpuMemcpy(&back, dev, sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, 42);
}

// ---- codes and messages ---------------------------------------------------------

TEST(ErrorStringTest, EveryCodeHasADistinctMessage) {
  std::set<std::string> seen;
  for (int code : {vnpuSuccess, vnpuErrorInvalidValue, vnpuErrorMemoryAllocation, vnpuErrorInvalidDevice,
                   vnpuErrorNotReady, vnpuErrorInvalidResourceHandle, vnpuErrorLaunchFailure,
                   vnpuErrorForkedAfterInit, vnpuErrorInvalidConfiguration, vnpuErrorNotSupported,
                   vnpuErrorInterrupted}) {
    const char* s = vnpuGetErrorString(static_cast<vnpuError_t>(code));
    ASSERT_NE(s, nullptr);
    EXPECT_STRNE(s, "") << "code " << code;
    EXPECT_STRNE(s, "unknown error") << "code " << code;
    EXPECT_TRUE(seen.insert(s).second) << "duplicate message for code " << code << ": " << s;
  }
  EXPECT_STREQ(vnpuGetErrorString(vnpuSuccess), "no error");
  EXPECT_STREQ(vnpuGetErrorString(static_cast<vnpuError_t>(999)), "unknown error");
}

// ---- asynchronous kernel failures ----------------------------------------------------

TEST_F(ErrorTest, FailingKernelIsReportedAtTheNextSynchronize) {
  Stream s;
  // Launch succeeds: the failure is asynchronous.
  ASSERT_EQ(vnpuLaunchKernel(s, "aten::index_select", Throwing("index 7 is out of bounds for size 3")),
            vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  std::string msg = vnpuGetLastErrorString();
  EXPECT_TRUE(Contains(msg, "aten::index_select"));
  EXPECT_TRUE(Contains(msg, "index 7 is out of bounds for size 3"));
  EXPECT_TRUE(Contains(msg, "vnpu:0"));
  // Reported once; the device keeps working.
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
  ExpectDeviceWorks();
}

TEST_F(ErrorTest, WorkAfterAFailingKernelStillRuns) {
  std::atomic<bool> ran{false};
  Stream s;
  ASSERT_EQ(vnpuLaunchKernel(s, "bad", Throwing("boom")), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "good", [&ran] { ran = true; }), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  EXPECT_TRUE(ran.load());
}

TEST_F(ErrorTest, NonStandardExceptionIsReported) {
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "weird_kernel", [] { throw 42; }), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "weird_kernel"));
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "unknown exception"));
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
}

TEST_F(ErrorTest, FirstFailureWinsUntilReported) {
  Stream s;
  ASSERT_EQ(vnpuLaunchKernel(s, "first_kernel", Throwing("first")), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "second_kernel", Throwing("second")), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  std::string msg = vnpuGetLastErrorString();
  EXPECT_TRUE(Contains(msg, "first_kernel"));
  EXPECT_EQ(msg.find("second_kernel"), std::string::npos);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  // A new failure after the report is reported again.
  ASSERT_EQ(vnpuLaunchKernel(s, "third_kernel", Throwing("third")), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "third_kernel"));
}

TEST_F(ErrorTest, ErrorIsPerDeviceNotPerStream) {
  // A failure on one stream is reported by a synchronize of another stream
  // of the same device (the error belongs to the device, as in CUDA).
  Stream a, b;
  ASSERT_EQ(vnpuLaunchKernel(a, "on_a", Throwing("a failed")), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(a), vnpuErrorLaunchFailure);
  ASSERT_EQ(vnpuLaunchKernel(a, "on_a", Throwing("a failed")), vnpuSuccess);
  // Wait for the kernel without consuming its error.
  ASSERT_TRUE(WaitUntil([&] { return vnpuStreamQuery(a) == vnpuSuccess; }));
  EXPECT_EQ(vnpuStreamSynchronize(b), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "on_a"));
}

TEST_F(ErrorTest, ErrorsOfOtherDevicesAreNotReportedHere) {
  VNPU_REQUIRE_DEVICES(2);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "dev1_kernel", Throwing("device one")), vnpuSuccess);
  ASSERT_TRUE(WaitUntil([] { return vnpuStreamQuery(nullptr) == vnpuSuccess; }));
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "vnpu:1"));
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "dev1_kernel"));
  ExpectDeviceWorks();
}

TEST_F(ErrorTest, EverySynchronizingCallReportsTheError) {
  Stream s;
  Event e;
  // vnpuDeviceSynchronize
  ASSERT_EQ(vnpuLaunchKernel(s, "k1", Throwing("x")), vnpuSuccess);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuErrorLaunchFailure);
  EXPECT_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  // vnpuEventSynchronize
  ASSERT_EQ(vnpuLaunchKernel(s, "k2", Throwing("x")), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "k2"));
  EXPECT_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  // vnpuMemcpy (synchronous copy on the default stream)
  DeviceBuffer d(4);
  int h = 0;
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "k3", Throwing("x")), vnpuSuccess);
  EXPECT_EQ(vnpuMemcpy(&h, d.get(), 4, vnpuMemcpyDeviceToHost), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "k3"));
  EXPECT_EQ(vnpuMemcpy(&h, d.get(), 4, vnpuMemcpyDeviceToHost), vnpuSuccess);
}

TEST_F(ErrorTest, GetLastErrorClearsAndPeekDoesNot) {
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "peeked", Throwing("x")), vnpuSuccess);
  ASSERT_TRUE(WaitUntil([] { return vnpuStreamQuery(nullptr) == vnpuSuccess; }));
  EXPECT_EQ(vnpuPeekAtLastError(), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "peeked"));
  EXPECT_EQ(vnpuPeekAtLastError(), vnpuErrorLaunchFailure);
  EXPECT_EQ(vnpuGetLastError(), vnpuErrorLaunchFailure);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
  EXPECT_EQ(vnpuPeekAtLastError(), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess) << "already reported by vnpuGetLastError";
}

TEST_F(ErrorTest, ResourceCleanupDoesNotSwallowPendingErrors) {
  // Destroying an event or a stream is not a synchronizing call that reports
  // errors: a failure before it must still reach the next real synchronize.
  Stream s;
  ASSERT_EQ(vnpuLaunchKernel(s, "lost_kernel", Throwing("must not be lost")), vnpuSuccess);
  vnpuEvent_t e = nullptr;
  ASSERT_EQ(vnpuEventCreate(&e), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(e, s), vnpuSuccess);
  ASSERT_TRUE(WaitUntil([&] { return vnpuEventQuery(e) == vnpuSuccess; }));
  EXPECT_EQ(vnpuEventDestroy(e), vnpuSuccess);
  vnpuStream_t tmp = nullptr;
  ASSERT_EQ(vnpuStreamCreate(&tmp), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(tmp, "fine", [] {}), vnpuSuccess);
  EXPECT_EQ(vnpuStreamDestroy(tmp), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(s), vnpuErrorLaunchFailure);
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "lost_kernel"));
}

TEST_F(ErrorTest, ErrorMessageIsPerThread) {
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "mine", Throwing("x")), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorLaunchFailure);
  std::string other;
  std::thread t([&other] { other = vnpuGetLastErrorString(); });
  t.join();
  EXPECT_EQ(other, "") << "another thread saw this thread's error message";
  EXPECT_TRUE(Contains(std::string(vnpuGetLastErrorString()), "mine"));
}

// ---- invalid device ordinals ---------------------------------------------------------

TEST_F(ErrorTest, InvalidDeviceOrdinals) {
  vnpuDeviceProp prop{};
  vnpuStream_t s = nullptr;
  for (int bad : {-1, -100, device_count_, 64, 1 << 30}) {
    EXPECT_EQ(vnpuSetDevice(bad), vnpuErrorInvalidDevice) << bad;
    EXPECT_EQ(vnpuGetDeviceProperties(&prop, bad), vnpuErrorInvalidDevice) << bad;
    EXPECT_EQ(vnpuGetDefaultStream(bad, &s), vnpuErrorInvalidDevice) << bad;
  }
  int d = -1;
  ASSERT_EQ(vnpuGetDevice(&d), vnpuSuccess);
  EXPECT_EQ(d, 0);
  // Invalid ordinals are argument errors, not device failures.
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
  ExpectDeviceWorks();
}

// ---- launch blocking ---------------------------------------------------------------

VNPU_CHILD_SCENARIO(LaunchBlocking) {
  // The kernel's error comes back from the launch itself.
  CHILD_CHECK_EQ(vnpuLaunchKernel(nullptr, "blocking_kernel", Throwing("sync failure")),
                 vnpuErrorLaunchFailure);
  CHILD_CHECK(std::string(vnpuGetLastErrorString()).find("blocking_kernel") != std::string::npos);
  CHILD_CHECK(std::string(vnpuGetLastErrorString()).find("sync failure") != std::string::npos);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);  // reported once
  // Work is complete when the call returns, on any stream, with any copy.
  vnpuStream_t s = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&s), vnpuSuccess);
  std::atomic<bool> done{false};
  CHILD_CHECK_EQ(vnpuLaunchKernel(s, "slow", [&done] {
                   std::this_thread::sleep_for(std::chrono::milliseconds(30));
                   done = true;
                 }),
                 vnpuSuccess);
  CHILD_CHECK(done.load());
  void* d = nullptr;
  void* h = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&d, sizeof(int)), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMallocHost(&h, sizeof(int)), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemsetAsync(d, 0x11, sizeof(int), s), vnpuSuccess);
  *static_cast<int*>(h) = 0;
  CHILD_CHECK_EQ(vnpuMemcpyAsync(h, d, sizeof(int), vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  CHILD_CHECK_EQ(*static_cast<int*>(h), 0x11111111);
  CHILD_CHECK_EQ(vnpuStreamQuery(s), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFree(d), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFreeHost(h), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamDestroy(s), vnpuSuccess);
  return 0;
}

// Without VNPU_LAUNCH_BLOCKING (or with another value) launches stay asynchronous.
VNPU_CHILD_SCENARIO(LaunchNotBlocking) {
  CHILD_CHECK_EQ(vnpuLaunchKernel(nullptr, "async_kernel", Throwing("later")), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorLaunchFailure);
  return 0;
}

TEST(ErrorEnvTest, LaunchBlockingReturnsKernelErrorsFromTheLaunch) {
  EXPECT_EQ(RunScenario("LaunchBlocking", {"VNPU_LAUNCH_BLOCKING=1"}), 0);
}

// A value the boolean rule does not understand: asynchronous (the default),
// and the variable and its value are named in the configuration warnings.
VNPU_CHILD_SCENARIO(LaunchBlockingNotUnderstood) {
  CHILD_CHECK_EQ(vnpuLaunchKernel(nullptr, "async_kernel", Throwing("later")), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(nullptr), vnpuErrorLaunchFailure);
  const std::string w = vnpuGetConfigurationWarningString();
  const std::string expected = std::string("VNPU_LAUNCH_BLOCKING: '") + std::getenv("VNPU_LAUNCH_BLOCKING") + "'";
  CHILD_CHECK(w.find(expected) != std::string::npos);
  CHILD_CHECK(w.find("valid values are 0 or 1") != std::string::npos);
  return 0;
}

VNPU_CHILD_SCENARIO(NoConfigurationWarnings) {
  CHILD_CHECK(std::string(vnpuGetConfigurationWarningString()).empty());
  return 0;
}

TEST(ErrorEnvTest, LaunchBlockingOnlyForTheValueOne) {
  EXPECT_EQ(RunScenario("LaunchNotBlocking"), 0);
  EXPECT_EQ(RunScenario("LaunchNotBlocking", {"VNPU_LAUNCH_BLOCKING=0"}), 0);
  EXPECT_EQ(RunScenario("NoConfigurationWarnings", {"VNPU_LAUNCH_BLOCKING=0"}), 0);
  EXPECT_EQ(RunScenario("NoConfigurationWarnings", {"VNPU_LAUNCH_BLOCKING=1"}), 0);
  // PyTorch's rule (c10::utils::check_env): only "1" and "0"; anything else is reported, not guessed.
  for (const char* v : {"true", "TRUE", "yes", "2", " 1", "1 ", "on", ""}) {
    EXPECT_EQ(RunScenario("LaunchBlockingNotUnderstood", {std::string("VNPU_LAUNCH_BLOCKING=") + v}), 0)
        << "VNPU_LAUNCH_BLOCKING='" << v << "'";
  }
}

TEST(ErrorEnvTest, GetEnvFlagFollowsOneRule) {
  const char* name = "VNPU_TEST_FLAG_RULE";
  int v = -1;
  unsetenv(name);
  EXPECT_EQ(vnpuGetEnvFlag(name, 1, &v), vnpuSuccess);
  EXPECT_EQ(v, 1) << "unset: the default";
  EXPECT_EQ(vnpuGetEnvFlag(name, 0, &v), vnpuSuccess);
  EXPECT_EQ(v, 0);
  setenv(name, "1", 1);
  EXPECT_EQ(vnpuGetEnvFlag(name, 0, &v), vnpuSuccess);
  EXPECT_EQ(v, 1);
  setenv(name, "0", 1);
  EXPECT_EQ(vnpuGetEnvFlag(name, 1, &v), vnpuSuccess);
  EXPECT_EQ(v, 0);
  for (const char* bad : {"true", "False", "yes", "2", " 1", ""}) {
    setenv(name, bad, 1);
    v = -1;
    EXPECT_EQ(vnpuGetEnvFlag(name, 1, &v), vnpuErrorInvalidValue) << "'" << bad << "'";
    EXPECT_EQ(v, 1) << "a value not understood keeps the default";
  }
  unsetenv(name);
  EXPECT_EQ(vnpuGetEnvFlag(nullptr, 0, &v), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuGetEnvFlag(name, 0, nullptr), vnpuErrorInvalidValue);
}

// ---- fork ---------------------------------------------------------------------------------

// Exit codes of the forked child: which check failed.
enum ForkChildCode : int {
  kForkOk = 0,
  kNotBadFork = 10,
  kSetDeviceAllowed,
  kMallocAllowed,
  kStreamCreateAllowed,
  kLaunchAllowed,
  kSynchronizeAllowed,
  kCopyAllowed,
  kMemsetAllowed,
  kEventRecordAllowed,
  kStreamWaitEventAllowed,
  kEventSynchronizeAllowed,
  kStreamDestroyAllowed,
};

const char* ForkChildCodeName(int code) {
  static const char* const kNames[] = {
      "vnpuIsInBadFork() != 1", "vnpuSetDevice", "vnpuMalloc", "vnpuStreamCreate", "vnpuLaunchKernel",
      "vnpu{Stream,Device}Synchronize", "vnpuMemcpyAsync", "vnpuMemsetAsync", "vnpuEventRecord",
      "vnpuStreamWaitEvent", "vnpuEventSynchronize", "vnpuStreamDestroy"};
  if (code >= kNotBadFork && code <= kStreamDestroyAllowed) return kNames[code - kNotBadFork];
  return code == kForkOk ? "none" : "unknown";
}

// Runs in the child. The parent's worker threads do not exist here, so any
// call that would enqueue work (which never runs) or wait for it (forever)
// must refuse with vnpuErrorForkedAfterInit.
int ForkedChildChecks(vnpuStream_t busy_stream, vnpuEvent_t pending_event, void* dev) {
  alarm(20);  // a call that hangs kills the child (SIGALRM) instead of the test
  if (vnpuIsInBadFork() != 1) return kNotBadFork;
  if (vnpuSetDevice(0) != vnpuErrorForkedAfterInit) return kSetDeviceAllowed;
  void* p = nullptr;
  if (vnpuMalloc(&p, 64) != vnpuErrorForkedAfterInit) return kMallocAllowed;
  vnpuStream_t s = nullptr;
  if (vnpuStreamCreate(&s) != vnpuErrorForkedAfterInit) return kStreamCreateAllowed;
  if (vnpuLaunchKernel(nullptr, "k", [] {}) != vnpuErrorForkedAfterInit) return kLaunchAllowed;
  if (vnpuStreamSynchronize(nullptr) != vnpuErrorForkedAfterInit) return kSynchronizeAllowed;
  if (vnpuStreamSynchronize(busy_stream) != vnpuErrorForkedAfterInit) return kSynchronizeAllowed;
  if (vnpuDeviceSynchronize() != vnpuErrorForkedAfterInit) return kSynchronizeAllowed;
  int h = 0;
  if (vnpuMemcpyAsync(&h, &h, sizeof(h), vnpuMemcpyHostToHost, nullptr) != vnpuErrorForkedAfterInit)
    return kCopyAllowed;
  if (vnpuMemsetAsync(dev, 0, 64, nullptr) != vnpuErrorForkedAfterInit) return kMemsetAllowed;
  if (vnpuEventRecord(pending_event, nullptr) != vnpuErrorForkedAfterInit) return kEventRecordAllowed;
  if (vnpuStreamWaitEvent(nullptr, pending_event) != vnpuErrorForkedAfterInit) return kStreamWaitEventAllowed;
  if (vnpuEventSynchronize(pending_event) != vnpuErrorForkedAfterInit) return kEventSynchronizeAllowed;
  if (vnpuStreamDestroy(busy_stream) != vnpuErrorForkedAfterInit) return kStreamDestroyAllowed;
  return kForkOk;
}

TEST_F(ErrorTest, ForkAfterInitIsDetectedInTheChild) {
  ExpectDeviceWorks();  // the runtime is initialized and its workers are running
  EXPECT_EQ(vnpuIsInBadFork(), 0);
  // At fork time a stream is busy and an event is pending on it.
  DeviceBuffer dev(64);
  Stream busy;
  Event pending;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(busy, gate), vnpuSuccess);
  ASSERT_EQ(vnpuEventRecord(pending, busy), vnpuSuccess);

  std::fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed";
  if (pid == 0) _exit(ForkedChildChecks(busy, pending, dev.get()));  // child: no gtest, no exit handlers
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  gate->open();
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (SIGALRM = a runtime call hung in the child)";
  EXPECT_EQ(WEXITSTATUS(status), kForkOk) << "failed check: " << ForkChildCodeName(WEXITSTATUS(status));
  // The parent is unaffected.
  EXPECT_EQ(vnpuIsInBadFork(), 0);
  EXPECT_EQ(vnpuEventSynchronize(pending), vnpuSuccess);
  ExpectDeviceWorks();
}

VNPU_CHILD_SCENARIO(ForkBeforeInit) {
  // No runtime call has been made in this process yet: a fork now is fine,
  // and the child can initialize and use its own runtime.
  pid_t pid = fork();
  CHILD_CHECK(pid >= 0);
  if (pid == 0) {
    if (vnpuIsInBadFork() != 0) _exit(2);
    if (vnpuSetDevice(0) != vnpuSuccess) _exit(3);
    void* d = nullptr;
    if (vnpuMalloc(&d, sizeof(int)) != vnpuSuccess) _exit(4);
    int in = 1234, out = 0;
    if (vnpuMemcpy(d, &in, sizeof(int), vnpuMemcpyHostToDevice) != vnpuSuccess) _exit(5);
    if (vnpuMemcpy(&out, d, sizeof(int), vnpuMemcpyDeviceToHost) != vnpuSuccess) _exit(6);
    _exit(out == 1234 ? 0 : 7);
  }
  int status = 0;
  CHILD_CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHILD_CHECK(WIFEXITED(status));
  CHILD_CHECK_EQ(WEXITSTATUS(status), 0);
  // The parent initializes afterwards without being marked.
  CHILD_CHECK_EQ(vnpuSetDevice(0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuIsInBadFork(), 0);
  return 0;
}

TEST(ErrorEnvTest, ForkBeforeInitIsAllowed) { EXPECT_EQ(RunScenario("ForkBeforeInit"), 0); }

// Forks and runs `body` in the child; the child's exit code (0 = ok), 128 + signal if it died.
template <class F>
int InForkedChild(F body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    alarm(20);  // a hung child dies instead of hanging the test
    _exit(body());
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int ChildUsesTheDevice() {
  if (vnpuIsInBadFork() != 0) return 2;
  void* d = nullptr;
  if (vnpuMalloc(&d, sizeof(int)) != vnpuSuccess) return 3;
  int in = 77, out = 0;
  if (vnpuMemcpy(d, &in, sizeof(int), vnpuMemcpyHostToDevice) != vnpuSuccess) return 4;
  if (vnpuLaunchKernel(nullptr, "inc", [d] { *static_cast<int*>(d) += 1; }) != vnpuSuccess) return 5;
  if (vnpuMemcpy(&out, d, sizeof(int), vnpuMemcpyDeviceToHost) != vnpuSuccess) return 6;
  if (vnpuFree(d) != vnpuSuccess) return 7;
  return out == 78 ? 0 : 8;
}

// Discovery (count, properties, current device) does not initialize: a child
// forked after it uses its own runtime, and its device memory is its own (the
// parent's later allocations and writes do not show through). vnpuInit then
// initializes: the next child is a bad fork.
VNPU_CHILD_SCENARIO(DiscoveryIsNotInitialization) {
  int n = 0;
  CHILD_CHECK_EQ(vnpuGetDeviceCount(&n), vnpuSuccess);
  vnpuDeviceProp p{};
  CHILD_CHECK_EQ(vnpuGetDeviceProperties(&p, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSetDevice(0), vnpuSuccess);
  size_t free_b = 0, total_b = 0;
  CHILD_CHECK_EQ(vnpuMemGetInfo(&free_b, &total_b), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuIsInitialized(), 0);
  CHILD_CHECK_EQ(InForkedChild(ChildUsesTheDevice), 0);
  CHILD_CHECK_EQ(vnpuIsInitialized(), 0);
  CHILD_CHECK_EQ(vnpuInit(1), vnpuErrorInvalidValue);
  CHILD_CHECK_EQ(vnpuInit(0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuIsInitialized(), 1);
  CHILD_CHECK_EQ(InForkedChild([] {
                   if (vnpuIsInBadFork() != 1 || vnpuIsInitialized() != 0) return 2;
                   void* d = nullptr;
                   return vnpuMalloc(&d, 64) == vnpuErrorForkedAfterInit && vnpuInit(0) == vnpuErrorForkedAfterInit
                              ? 0 : 3;
                 }),
                 0);
  CHILD_CHECK_EQ(ChildUsesTheDevice(), 0);  // the parent itself is fine
  return 0;
}

// An allocation initializes the runtime by itself (no vnpuInit).
VNPU_CHILD_SCENARIO(AllocationInitializes) {
  CHILD_CHECK_EQ(vnpuIsInitialized(), 0);
  void* d = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&d, 64), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuIsInitialized(), 1);
  CHILD_CHECK_EQ(InForkedChild([] { return vnpuIsInBadFork() == 1 ? 0 : 2; }), 0);
  CHILD_CHECK_EQ(vnpuFree(d), vnpuSuccess);
  return 0;
}

TEST(ErrorEnvTest, DiscoveryDoesNotInitializeButUseDoes) {
  EXPECT_EQ(RunScenario("DiscoveryIsNotInitialization"), 0);
  EXPECT_EQ(RunScenario("AllocationInitializes"), 0);
}

}  // namespace
