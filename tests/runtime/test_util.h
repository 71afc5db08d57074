// Shared helpers for the vNPU runtime tests. Not a test file itself: the CMake
// glob only compiles tests/runtime/*_test.cpp, which include this header.
//
//  * RuntimeTest    fixture: drains every device, clears pending errors and
//                   restores current device 0 before and after each test.
//  * Gate           a one-shot latch kernels block on, so a test decides when
//                   a stream may make progress. Every wait is bounded
//                   (kTimeout): a broken runtime fails a test, never hangs it.
//  * Stream/Event/DeviceBuffer/PinnedBuffer   RAII owners, so an ASSERT that
//                   returns early leaks nothing into the next test.
//  * VNPU_CHILD_SCENARIO / RunScenario   behaviour that depends on VNPU_*
//                   environment variables. See Note [Child scenarios].
#pragma once

#include <gtest/gtest.h>
#include <vnpu/runtime.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace vnpu_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Upper bound for anything a test waits on. Only reached when the runtime is broken.
constexpr auto kTimeout = std::chrono::milliseconds(10000);

// ---------------------------------------------------------------------------
// Synchronisation helpers

class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> g(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // True if the gate opened within `timeout`.
  bool wait(std::chrono::milliseconds timeout = kTimeout) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return open_; });
  }
  bool is_open() {
    std::lock_guard<std::mutex> g(mu_);
    return open_;
  }

 private:
  std::mutex mu_;  // guards open_
  std::condition_variable cv_;
  bool open_ = false;
};
using GatePtr = std::shared_ptr<Gate>;

// Opens a gate when the test's scope ends, so an early ASSERT return never
// leaves a worker blocked until kTimeout. Kernels capture the GatePtr by value.
class OpenOnExit {
 public:
  explicit OpenOnExit(GatePtr g) : g_(std::move(g)) {}
  ~OpenOnExit() { g_->open(); }
  OpenOnExit(const OpenOnExit&) = delete;
  OpenOnExit& operator=(const OpenOnExit&) = delete;

 private:
  GatePtr g_;
};

// Polls `pred` until it holds or `timeout` passes.
template <class Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout = kTimeout) {
  auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Launches a kernel that blocks `stream` until `gate` opens (or kTimeout).
// `*timed_out` (optional) is set if the gate never opened.
inline vnpuError_t LaunchGate(vnpuStream_t stream, GatePtr gate,
                              std::shared_ptr<std::atomic<bool>> timed_out = nullptr) {
  return vnpuLaunchKernel(stream, "test::gate", [gate, timed_out] {
    bool ok = gate->wait();
    if (!ok && timed_out) timed_out->store(true);
  });
}

// EXPECT_TRUE(Contains(message, "kernel name")) prints the whole message on failure.
inline ::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

// ---------------------------------------------------------------------------
// RAII owners
//
// Declare what kernels capture by reference *before* the Stream that runs
// them: destroying a Stream waits for its kernels, so on an early ASSERT
// return they never touch a dead local. For work on default streams, put a
// DrainOnExit after the captured locals.

// Waits for all work on every device when the scope ends; keeps the current device.
class DrainOnExit {
 public:
  DrainOnExit() = default;
  ~DrainOnExit() {
    int cur = 0, n = 0;
    vnpuGetDevice(&cur);
    vnpuGetDeviceCount(&n);
    for (int d = 0; d < n; ++d) {
      vnpuSetDevice(d);
      vnpuDeviceSynchronize();
    }
    vnpuSetDevice(cur);
  }
  DrainOnExit(const DrainOnExit&) = delete;
  DrainOnExit& operator=(const DrainOnExit&) = delete;
};

class Stream {
 public:
  Stream() { EXPECT_EQ(vnpuStreamCreate(&s_), vnpuSuccess); }
  explicit Stream(int priority) {
    EXPECT_EQ(vnpuStreamCreateWithPriority(&s_, 0, priority), vnpuSuccess);
  }
  ~Stream() {
    if (s_ != nullptr) vnpuStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  vnpuStream_t get() const { return s_; }
  operator vnpuStream_t() const { return s_; }  // NOLINT: handle-like on purpose

 private:
  vnpuStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(unsigned flags = vnpuEventDefault) {
    EXPECT_EQ(vnpuEventCreateWithFlags(&e_, flags), vnpuSuccess);
  }
  ~Event() {
    if (e_ != nullptr) vnpuEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  operator vnpuEvent_t() const { return e_; }  // NOLINT

 private:
  vnpuEvent_t e_ = nullptr;
};

// Device memory on the device current at construction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(vnpuMalloc(&p_, bytes), vnpuSuccess); }
  ~DeviceBuffer() {
    if (p_ != nullptr) vnpuFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) { EXPECT_EQ(vnpuMallocHost(&p_, bytes), vnpuSuccess); }
  ~PinnedBuffer() {
    if (p_ != nullptr) vnpuFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

// ---------------------------------------------------------------------------
// Fixture

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(vnpuGetDeviceCount(&device_count_), vnpuSuccess);
    ASSERT_GE(device_count_, 1) << "the runtime tests need at least one vNPU device";
    ResetDevices();
  }
  void TearDown() override { ResetDevices(); }

  // Waits for all work on every device, drops errors a test left pending, and
  // makes device 0 current again.
  void ResetDevices() {
    for (int d = 0; d < device_count_; ++d) {
      ASSERT_EQ(vnpuSetDevice(d), vnpuSuccess);
      vnpuDeviceSynchronize();
      vnpuGetLastError();
    }
    ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  }

  int device_count_ = 0;
};

#define VNPU_REQUIRE_DEVICES(n)                                                          \
  do {                                                                                  \
    if (device_count_ < (n))                                                            \
      GTEST_SKIP() << "needs " << (n) << " vNPU devices, have " << device_count_         \
                   << " (unset VNPU_DEVICE_COUNT / VNPU_VISIBLE_DEVICES)";                \
  } while (0)

// ---------------------------------------------------------------------------
// Note [Child scenarios]
// The runtime reads VNPU_* once per process, at its first call. To test
// environment-dependent behaviour a test re-executes this very binary
// (/proc/self/exe, via posix_spawn) with VNPU_TEST_SCENARIO=<name> and the
// chosen VNPU_* variables (all inherited VNPU_* variables are removed first).
// In the child, the static registrar of that scenario runs it before gtest's
// main() and before any other runtime call, then _Exit()s with its result:
// 0 = every check passed. Scenario bodies use CHILD_CHECK*, which print the
// failed check to stderr (shown in the parent's test log) and return 1.
// RunScenario refuses unknown names, so a typo cannot spawn the whole suite,
// and kills a child that has not finished after kScenarioTimeout.

using ScenarioFn = int (*)();

inline std::set<std::string>& ScenarioNames() {
  static std::set<std::string> names;
  return names;
}

struct ScenarioRegistrar {
  ScenarioRegistrar(const char* name, ScenarioFn fn) {
    ScenarioNames().insert(name);
    const char* want = std::getenv("VNPU_TEST_SCENARIO");
    if (want != nullptr && std::strcmp(want, name) == 0) {
      int rc = fn();
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(rc);
    }
  }
};

#define VNPU_CHILD_SCENARIO(name)                                                  \
  static int VnpuScenario_##name();                                                \
  static const ::vnpu_test::ScenarioRegistrar vnpu_scenario_registrar_##name(#name, \
                                                                             &VnpuScenario_##name); \
  static int VnpuScenario_##name()

#define CHILD_CHECK(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: child check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

#define CHILD_CHECK_EQ(a, b)                                                                  \
  do {                                                                                        \
    auto va_ = (a);                                                                           \
    auto vb_ = (b);                                                                           \
    if (!(va_ == vb_)) {                                                                      \
      std::fprintf(stderr, "%s:%d: child check failed: %s == %s (%lld vs %lld)\n", __FILE__, \
                   __LINE__, #a, #b, static_cast<long long>(va_), static_cast<long long>(vb_)); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

constexpr auto kScenarioTimeout = std::chrono::milliseconds(60000);

// Runs scenario `name` in a fresh process with `env` ("NAME=value" entries)
// added to the caller's environment minus its VNPU_* variables. Returns the
// child's exit code, 128 + signal if it died, or -1 if it could not run.
inline int RunScenario(const std::string& name, const std::vector<std::string>& env = {}) {
  if (ScenarioNames().count(name) == 0) {
    ADD_FAILURE() << "unknown child scenario '" << name << "'";
    return -1;
  }
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "VNPU_", 5) != 0) vars.emplace_back(*e);
  }
  vars.push_back("VNPU_TEST_SCENARIO=" + name);
  vars.insert(vars.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, nullptr};

  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn failed: " << std::strerror(rc);
    return -1;
  }
  int status = 0;
  auto deadline = Clock::now() + kScenarioTimeout;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      ADD_FAILURE() << "waitpid failed: " << std::strerror(errno);
      return -1;
    }
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "child scenario '" << name << "' timed out and was killed";
      return -1;
    }
    std::this_thread::sleep_for(2ms);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace vnpu_test
