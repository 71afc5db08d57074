// Sanitizer check 4 (VNPU_SANITIZE=1): host code that touches device memory is
// recorded by the runtime's fault handler and reported at the next call; stream
// workers and threads inside vnpuSanitizerDeviceAccessBegin/End may touch it.
// Each scenario runs in a fresh process (Note [Child scenarios]).
#include "test_util.h"

#include <sys/mman.h>
#include <sys/syscall.h>

using namespace vnpu_test;

namespace {

constexpr int kNoPkeys = 77;  // a scenario's exit code when the machine has no protection keys

uint64_t Tid() { return static_cast<uint64_t>(syscall(SYS_gettid)); }

#define REQUIRE_CHECK_4()                                                       \
  do {                                                                          \
    const char* why_ = nullptr;                                                 \
    if (vnpuSanitizerHostAccessCheckEnabled(&why_) == 0) {                      \
      std::fprintf(stderr, "check 4 is off: %s\n", why_ == nullptr ? "" : why_); \
      return kNoPkeys;                                                          \
    }                                                                           \
  } while (0)

VNPU_CHILD_SCENARIO(HostAccessReported) {
  CHILD_CHECK_EQ(vnpuSanitizerIsEnabled(), 1);
  REQUIRE_CHECK_4();
  float* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4 * 4096), vnpuSuccess);
  // The stream's worker (and its kernels) may touch device memory.
  CHILD_CHECK_EQ(vnpuLaunchKernel(nullptr, "fill", [p] { for (int i = 0; i < 4096; ++i) p[i] = float(i); }),
                 vnpuSuccess);
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuSuccess);

  // A host read faults, is recorded, completes with the right value, and the
  // next launch is refused (nothing queued) with the report.
  volatile float* v = p;
  const float got = v[1500];
  CHILD_CHECK(got == 1500.0f);
  std::atomic<bool> ran{false};
  CHILD_CHECK_EQ(vnpuLaunchKernel(nullptr, "next", [&ran] { ran = true; }), vnpuErrorHostAccess);
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.error == vnpuErrorHostAccess && r.ptr == p + 1500 && r.write == 0);
  CHILD_CHECK(r.host_thread == Tid() && r.host_pages == 1 && r.name == "next");
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);  // reported once
  CHILD_CHECK(!ran.load());

  // The report gave the page its key back: a write faults again; a synchronize reports it.
  v[3000] = -1.0f;
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuErrorHostAccess);
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.ptr == p + 3000 && r.write == 1 && r.host_pages == 1);
  // Touching two pages counts both; the first access is the one named.
  const float a = v[10], b = v[2048];
  CHILD_CHECK(a == 10.0f && b == 2048.0f);
  CHILD_CHECK_EQ(vnpuMemsetAsync(p, 0, 4, nullptr), vnpuErrorHostAccess);
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.ptr == p + 10 && r.host_pages == 2 && r.name == "memset");
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFree(p), vnpuSuccess);
  return 0;
}

VNPU_CHILD_SCENARIO(HostAccessPerThread) {
  REQUIRE_CHECK_4();
  // The other thread touches memory 4 MiB away from the window's: without protection keys a
  // window opens the chunk it touches to every thread (Note [Host access without protection keys]).
  constexpr size_t kBytes = 8 << 20, kFar = (kBytes / 2) / sizeof(int);
  int* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), kBytes), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemsetAsync(p, 0, kBytes, nullptr), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  volatile int* v = p;

  // A thread that started before the window has no access, even during it (rights are per thread).
  Gate go, done;
  std::atomic<uint64_t> other_tid{0};
  std::thread before([&] {
    other_tid = Tid();
    if (go.wait()) v[kFar] = 7;
    done.open();
  });
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessBegin(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessBegin(), vnpuSuccess);  // nests
  v[0] = 1;
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessEnd(), vnpuSuccess);
  v[2] = v[0] + 1;  // still inside the outer window
  int seen = 0;
  std::thread inside([&] { seen = v[2]; });  // created in the window: inherits the access
  inside.join();
  CHILD_CHECK(seen == 2);
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuSuccess);
  go.open();
  CHILD_CHECK(done.wait());
  before.join();
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessEnd(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessEnd(), vnpuErrorInvalidValue);  // no matching Begin
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuErrorHostAccess);
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.ptr == p + kFar && r.write == 1 && r.host_thread == other_tid.load());

  // After the window this thread is denied again.
  const int x = v[0];
  CHILD_CHECK(x == 1);
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuErrorHostAccess);
  return 0;
}

// Faults that are not device-memory accesses reach the handler installed before the runtime's.
void ExitOnSegv(int) { std::_Exit(42); }

VNPU_CHILD_SCENARIO(HostAccessChainsOtherFaults) {
  signal(SIGSEGV, &ExitOnSegv);
  REQUIRE_CHECK_4();
  void* d = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&d, 4096), vnpuSuccess);  // initializes: the runtime's handler goes in
  void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHILD_CHECK(page != MAP_FAILED);
  *static_cast<volatile int*>(page) = 1;  // not ours: ExitOnSegv ends the process with 42
  return 1;
}

VNPU_CHILD_SCENARIO(HostAccessOff) {
  // Without the sanitizer, or with VNPU_SANITIZE_HOST_ACCESS=0, host code may touch device memory.
  const char* why = "unset";
  CHILD_CHECK_EQ(vnpuSanitizerHostAccessCheckEnabled(&why), 0);
  CHILD_CHECK(std::string(why).empty());
  int* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  p[0] = 5;
  CHILD_CHECK(p[0] == 5);
  CHILD_CHECK_EQ(vnpuMemsetAsync(p, 0, 4096, nullptr), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuSuccess);
  return 0;
}

VNPU_CHILD_SCENARIO(HostAccessNoKeysLeft) {
  // Every protection key taken (or none on this machine): check 4 runs on page protection instead
  // (Note [Host access without protection keys]), with no reason given, and the other checks stay on.
  while (pkey_alloc(0, 0) >= 0) {
  }
  CHILD_CHECK_EQ(vnpuSanitizerEnable(), vnpuSuccess);
  const char* why = nullptr;
  CHILD_CHECK_EQ(vnpuSanitizerHostAccessCheckEnabled(&why), 2);
  CHILD_CHECK(why != nullptr && std::string(why).empty());
  int* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  volatile int* v = p;
  v[0] = 1;
  CHILD_CHECK_EQ(vnpuSanitizerCheckHostAccess(), vnpuErrorHostAccess);
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.ptr == p && r.write == 1 && r.host_thread == Tid() && r.host_pages == 1);
  vnpuStream_t a = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  const vnpuMemAccess w{p, 64, 1};
  CHILD_CHECK_EQ(vnpuLaunchKernelWithAccesses(a, "writer", [] {}, &w, 1), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuLaunchKernelWithAccesses(nullptr, "writer", [] {}, &w, 1), vnpuErrorStreamRace);
  return 0;
}

TEST(HostAccessTest, HostReadsAndWritesAreReportedAtTheNextCall) {
  const int rc = RunScenario("HostAccessReported", {"VNPU_SANITIZE=1"});
  if (rc == kNoPkeys) GTEST_SKIP() << "no memory protection keys on this machine";
  EXPECT_EQ(rc, 0);
}

// The page-protection fallback where the machine has keys (VNPU_SANITIZE_HOST_ACCESS=mprotect).
TEST(HostAccessTest, PageProtectionFallbackReportsTheSame) {
  EXPECT_EQ(RunScenario("HostAccessReported", {"VNPU_SANITIZE=1", "VNPU_SANITIZE_HOST_ACCESS=mprotect"}), 0);
  EXPECT_EQ(RunScenario("HostAccessPerThread", {"VNPU_SANITIZE=1", "VNPU_SANITIZE_HOST_ACCESS=mprotect"}), 0);
  EXPECT_EQ(RunScenario("HostAccessChainsOtherFaults", {"VNPU_SANITIZE=1", "VNPU_SANITIZE_HOST_ACCESS=mprotect"}),
            42);
}

TEST(HostAccessTest, AccessIsPerThreadAndInheritedByNewThreads) {
  const int rc = RunScenario("HostAccessPerThread", {"VNPU_SANITIZE=1"});
  if (rc == kNoPkeys) GTEST_SKIP() << "no memory protection keys on this machine";
  EXPECT_EQ(rc, 0);
}

TEST(HostAccessTest, OtherFaultsGoToThePreviousHandler) {
  const int rc = RunScenario("HostAccessChainsOtherFaults", {"VNPU_SANITIZE=1"});
  if (rc == kNoPkeys) GTEST_SKIP() << "no memory protection keys on this machine";
  EXPECT_EQ(rc, 42);
}

TEST(HostAccessTest, OffWithoutTheSanitizerOrWhenDisabled) {
  EXPECT_EQ(RunScenario("HostAccessOff", {}), 0);
  EXPECT_EQ(RunScenario("HostAccessOff", {"VNPU_SANITIZE=1", "VNPU_SANITIZE_HOST_ACCESS=0"}), 0);
}

TEST(HostAccessTest, WithoutProtectionKeysPageProtectionIsUsed) {
  EXPECT_EQ(RunScenario("HostAccessNoKeysLeft", {}), 0);
}

}  // namespace
