// Copies and memset: every direction, stream ordering, staging of pageable
// sources, synchronous behaviour for pageable destinations, argument checks.
#include "test_util.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>

#include <atomic>
#include <cstdint>
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace vnpu_test;

namespace {

using CopyTest = RuntimeTest;

std::vector<int> Iota(size_t n, int start = 0) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// ---- directions -------------------------------------------------------------------

TEST_F(CopyTest, HostToDeviceToHostRoundTrip) {
  constexpr size_t n = 10000;
  auto src = Iota(n, 7);
  std::vector<int> dst(n, -1);
  DeviceBuffer d(n * sizeof(int));
  ASSERT_EQ(vnpuMemcpy(d.get(), src.data(), n * sizeof(int), vnpuMemcpyHostToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(dst.data(), d.get(), n * sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(dst, src);
}

TEST_F(CopyTest, AsyncRoundTripThroughPinnedMemory) {
  constexpr size_t n = 4096;
  PinnedBuffer in(n * sizeof(int)), out(n * sizeof(int));
  DeviceBuffer d(n * sizeof(int));
  Stream s;  // destroyed first: waits for its copies before the buffers go
  for (size_t i = 0; i < n; ++i) in.as<int>()[i] = static_cast<int>(3 * i);
  ASSERT_EQ(vnpuMemcpyAsync(d.get(), in.get(), n * sizeof(int), vnpuMemcpyHostToDevice, s), vnpuSuccess);
  int* dev = d.as<int>();
  ASSERT_EQ(vnpuLaunchKernel(s, "add1", [dev] { for (size_t i = 0; i < n; ++i) dev[i] += 1; }), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(out.get(), d.get(), n * sizeof(int), vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out.as<int>()[i], static_cast<int>(3 * i + 1)) << i;
}

TEST_F(CopyTest, DeviceToDeviceSameDevice) {
  constexpr size_t n = 1000;
  auto src = Iota(n, 100);
  std::vector<int> back(n, 0);
  DeviceBuffer a(n * sizeof(int)), b(n * sizeof(int));
  ASSERT_EQ(vnpuMemcpy(a.get(), src.data(), n * sizeof(int), vnpuMemcpyHostToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(b.get(), a.get(), n * sizeof(int), vnpuMemcpyDeviceToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(back.data(), b.get(), n * sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, src);
}

TEST_F(CopyTest, DeviceToDeviceAcrossDevices) {
  VNPU_REQUIRE_DEVICES(2);
  constexpr size_t n = 1000;
  auto src = Iota(n, -50);
  std::vector<int> back(n, 0);
  DeviceBuffer on0(n * sizeof(int));
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  DeviceBuffer on1(n * sizeof(int));
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(on0.get(), src.data(), n * sizeof(int), vnpuMemcpyHostToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(on1.get(), on0.get(), n * sizeof(int), vnpuMemcpyDeviceToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(back.data(), on1.get(), n * sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, src);
}

// Note [Errors follow peer copies]: a copy from a device with a pending error (the kernel that produced the
// source failed) fails on the destination device instead of handing over the unfinished values.
TEST_F(CopyTest, APeerCopyFromADeviceWithAPendingErrorFailsOnTheDestination) {
  VNPU_REQUIRE_DEVICES(2);
  DeviceBuffer on0(sizeof(int));
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  DeviceBuffer on1(sizeof(int));
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "producer", [] { throw std::runtime_error("the producer failed"); }),
            vnpuSuccess);
  while (vnpuStreamQuery(nullptr) == vnpuErrorNotReady) std::this_thread::yield();  // ran; error not taken
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  EXPECT_EQ(vnpuMemcpy(on1.get(), on0.get(), sizeof(int), vnpuMemcpyDeviceToDevice), vnpuErrorLaunchFailure);
  const std::string msg = vnpuGetLastErrorString();
  EXPECT_NE(msg.find("vnpu:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the producer failed"), std::string::npos) << msg;
  // Without a pending error on the source's device the copy works again.
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
  EXPECT_EQ(vnpuGetLastError(), vnpuErrorLaunchFailure);
  ASSERT_EQ(vnpuSetDevice(1), vnpuSuccess);
  EXPECT_EQ(vnpuMemcpy(on1.get(), on0.get(), sizeof(int), vnpuMemcpyDeviceToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuSetDevice(0), vnpuSuccess);
}

TEST_F(CopyTest, HostToHost) {
  auto src = Iota(64);
  std::vector<int> dst(64, 0);
  ASSERT_EQ(vnpuMemcpy(dst.data(), src.data(), 64 * sizeof(int), vnpuMemcpyHostToHost), vnpuSuccess);
  EXPECT_EQ(dst, src);
}

TEST_F(CopyTest, PartialCopiesAtOffsets) {
  DeviceBuffer d(64);
  std::vector<uint8_t> zeros(64, 0), ones(16, 1), back(64, 0xff);
  ASSERT_EQ(vnpuMemcpy(d.get(), zeros.data(), 64, vnpuMemcpyHostToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(d.as<uint8_t>() + 8, ones.data(), 16, vnpuMemcpyHostToDevice), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(back.data(), d.get(), 64, vnpuMemcpyDeviceToHost), vnpuSuccess);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(back[i], (i >= 8 && i < 24) ? 1 : 0) << i;
}

// ---- memset ------------------------------------------------------------------------

TEST_F(CopyTest, MemsetWritesTheLowByteOverTheRange) {
  Stream s;
  DeviceBuffer d(256);
  std::vector<uint8_t> back(256, 0);
  ASSERT_EQ(vnpuMemsetAsync(d.get(), 0, 256, s), vnpuSuccess);
  ASSERT_EQ(vnpuMemsetAsync(d.as<uint8_t>() + 16, 0x1ab, 100, s), vnpuSuccess);  // like cudaMemset: (unsigned char)value
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpy(back.data(), d.get(), 256, vnpuMemcpyDeviceToHost), vnpuSuccess);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(back[i], (i >= 16 && i < 116) ? 0xab : 0) << i;
}

TEST_F(CopyTest, MemsetIsStreamOrdered) {
  Stream s;
  DeviceBuffer d(sizeof(int));
  int* dev = d.as<int>();
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuLaunchKernel(s, "write", [dev] { *dev = 0x12345678; }), vnpuSuccess);
  ASSERT_EQ(vnpuMemsetAsync(dev, 0, sizeof(int), s), vnpuSuccess);
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  int back = -1;
  ASSERT_EQ(vnpuMemcpy(&back, dev, sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, 0);
}

TEST_F(CopyTest, MemsetRejectsHostMemory) {
  std::vector<uint8_t> host(16, 7);
  EXPECT_EQ(vnpuMemsetAsync(host.data(), 0, 16, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemsetAsync(nullptr, 0, 16, nullptr), vnpuErrorInvalidValue);
  ASSERT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_EQ(host, std::vector<uint8_t>(16, 7));
  EXPECT_EQ(vnpuMemsetAsync(nullptr, 0, 0, nullptr), vnpuSuccess) << "zero bytes is a no-op";
}

// ---- pageable vs pinned host memory -------------------------------------------------

TEST_F(CopyTest, PageableSourceIsStagedAtCallTime) {
  // The stream is blocked, the source is overwritten right after the call
  // returns, and the device must still receive the old contents.
  Stream s;
  DeviceBuffer d(1024 * sizeof(int));
  std::vector<int> src(1024, 1);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(d.get(), src.data(), src.size() * sizeof(int), vnpuMemcpyHostToDevice, s),
            vnpuSuccess);
  ASSERT_EQ(vnpuStreamQuery(s), vnpuErrorNotReady) << "the copy must still be queued for this test";
  std::fill(src.begin(), src.end(), 2);
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  std::vector<int> back(1024, 0);
  ASSERT_EQ(vnpuMemcpy(back.data(), d.get(), back.size() * sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, std::vector<int>(1024, 1));
}

TEST_F(CopyTest, PageableSourceMayBeFreedAtOnce) {
  Stream s;
  DeviceBuffer d(4096);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  {
    auto src = std::make_unique<std::vector<int>>(1024, 42);
    ASSERT_EQ(vnpuMemcpyAsync(d.get(), src->data(), 4096, vnpuMemcpyHostToDevice, s), vnpuSuccess);
  }  // freed while the copy is queued
  std::vector<int> junk(1024, -1);  // likely reuses the freed block
  (void)junk;
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  std::vector<int> back(1024, 0);
  ASSERT_EQ(vnpuMemcpy(back.data(), d.get(), 4096, vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, std::vector<int>(1024, 42));
}

TEST_F(CopyTest, PinnedSourceIsReadWhenTheCopyRuns) {
  // Pinned memory is not staged (truly asynchronous, like CUDA): the copy
  // sees what the buffer holds when it executes.
  DeviceBuffer d(sizeof(int));
  PinnedBuffer h(sizeof(int));
  Stream s;
  *h.as<int>() = 1;
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  ASSERT_EQ(vnpuMemcpyAsync(d.get(), h.get(), sizeof(int), vnpuMemcpyHostToDevice, s), vnpuSuccess);
  *h.as<int>() = 2;
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  int back = 0;
  ASSERT_EQ(vnpuMemcpy(&back, d.get(), sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(back, 2);
}

TEST_F(CopyTest, PageableDestinationMakesTheCopySynchronous) {
  Stream s;
  DeviceBuffer d(sizeof(int));
  int* dev = d.as<int>();
  ASSERT_EQ(vnpuLaunchKernel(s, "slow_write", [dev] {
              std::this_thread::sleep_for(30ms);
              *dev = 77;
            }),
            vnpuSuccess);
  int host = 0;
  ASSERT_EQ(vnpuMemcpyAsync(&host, dev, sizeof(int), vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  EXPECT_EQ(host, 77) << "vnpuMemcpyAsync to pageable memory returned before the data arrived";
}

TEST_F(CopyTest, PinnedDestinationCopyIsAsynchronous) {
  DeviceBuffer d(sizeof(int));
  PinnedBuffer h(sizeof(int));
  Stream s;
  *h.as<int>() = -1;
  ASSERT_EQ(vnpuMemsetAsync(d.get(), 0, sizeof(int), s), vnpuSuccess);
  auto gate = std::make_shared<Gate>();
  OpenOnExit guard(gate);
  ASSERT_EQ(LaunchGate(s, gate), vnpuSuccess);
  auto t0 = Clock::now();
  ASSERT_EQ(vnpuMemcpyAsync(h.get(), d.get(), sizeof(int), vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  EXPECT_LT(Clock::now() - t0, kTimeout / 2) << "the async copy waited for the blocked stream";
  EXPECT_EQ(vnpuStreamQuery(s), vnpuErrorNotReady);
  EXPECT_EQ(*h.as<int>(), -1);
  gate->open();
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(*h.as<int>(), 0);
}

TEST_F(CopyTest, SynchronousMemcpyWaitsForEarlierWorkOnTheDefaultStream) {
  DeviceBuffer d(sizeof(int));
  int* dev = d.as<int>();
  ASSERT_EQ(vnpuLaunchKernel(nullptr, "slow_write", [dev] {
              std::this_thread::sleep_for(20ms);
              *dev = 5;
            }),
            vnpuSuccess);
  PinnedBuffer h(sizeof(int));  // pinned: only vnpuMemcpy's own synchronisation can help
  *h.as<int>() = 0;
  ASSERT_EQ(vnpuMemcpy(h.get(), dev, sizeof(int), vnpuMemcpyDeviceToHost), vnpuSuccess);
  EXPECT_EQ(*h.as<int>(), 5);
}

// ---- argument checks -------------------------------------------------------------------

TEST_F(CopyTest, KindMustMatchThePointers) {
  DeviceBuffer d(64), d2(64);
  std::vector<uint8_t> h(64, 0), h2(64, 0);
  PinnedBuffer p(64);
  struct Case {
    void* dst;
    const void* src;
    vnpuMemcpyKind kind;
    const char* what;
  } cases[] = {
      {d.get(), d2.get(), vnpuMemcpyHostToDevice, "HtoD with a device source"},
      {h.data(), h2.data(), vnpuMemcpyHostToDevice, "HtoD with a host destination"},
      {p.get(), d.get(), vnpuMemcpyHostToDevice, "HtoD backwards"},
      {d.get(), h.data(), vnpuMemcpyDeviceToHost, "DtoH backwards"},
      {h.data(), h2.data(), vnpuMemcpyDeviceToHost, "DtoH with a host source"},
      {d.get(), h.data(), vnpuMemcpyDeviceToDevice, "DtoD with a host source"},
      {h.data(), d.get(), vnpuMemcpyDeviceToDevice, "DtoD with a host destination"},
      {h.data(), d.get(), vnpuMemcpyHostToHost, "HtoH with a device source"},
      {d.get(), h.data(), vnpuMemcpyHostToHost, "HtoH with a device destination"},
      {d.get(), h.data(), static_cast<vnpuMemcpyKind>(4), "kind 4"},
      {d.get(), h.data(), static_cast<vnpuMemcpyKind>(-1), "kind -1"},
      {d.get(), d2.get(), static_cast<vnpuMemcpyKind>(42), "kind 42"},
      {nullptr, h.data(), vnpuMemcpyHostToDevice, "null destination"},
      {d.get(), nullptr, vnpuMemcpyHostToDevice, "null source"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(vnpuMemcpyAsync(c.dst, c.src, 64, c.kind, nullptr), vnpuErrorInvalidValue) << c.what;
    EXPECT_EQ(vnpuMemcpy(c.dst, c.src, 64, c.kind), vnpuErrorInvalidValue) << c.what;
  }
  // Nothing was enqueued, and the failures are not sticky device errors.
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
}

TEST_F(CopyTest, ZeroByteCopyIsANoOp) {
  DeviceBuffer d(64);
  int h = 0;
  EXPECT_EQ(vnpuMemcpyAsync(d.get(), &h, 0, vnpuMemcpyHostToDevice, nullptr), vnpuSuccess);
  EXPECT_EQ(vnpuMemcpy(&h, d.get(), 0, vnpuMemcpyDeviceToHost), vnpuSuccess);
}

// ---- file reads into device memory (cuFileReadAsync's role) ------------------------

// A temporary file holding `bytes`; removed at the end of the test.
struct TempFile {
  std::string path;
  int fd = -1;
  explicit TempFile(const std::vector<int>& values) {
    char name[] = "/tmp/vnpu_file_read_XXXXXX";
    fd = ::mkstemp(name);
    path = name;
    const char* p = reinterpret_cast<const char*>(values.data());
    size_t left = values.size() * sizeof(int);
    while (left > 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w <= 0) break;
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  ~TempFile() {
    ::close(fd);
    ::unlink(path.c_str());
  }
};

TEST_F(CopyTest, FileReadLandsInDeviceMemoryInStreamOrder) {
  constexpr size_t n = 1 << 16;
  const auto values = Iota(n, 3);
  TempFile file(values);
  DeviceBuffer d(n * sizeof(int));
  vnpuStream_t s = nullptr;
  ASSERT_EQ(vnpuStreamCreate(&s), vnpuSuccess);
  // A kernel queued first delays the read; a copy queued after it sees the file's bytes from element 100 on.
  ASSERT_EQ(vnpuLaunchKernel(s, "slow", [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }),
            vnpuSuccess);
  auto got = std::make_shared<int64_t>(0);
  const size_t bytes = (n - 100) * sizeof(int);
  ASSERT_EQ(vnpuMemcpyFromFileAsync(d.get(), file.fd, 100 * sizeof(int), bytes, got, s), vnpuSuccess);
  ::close(::dup(file.fd));  // the runtime reads from its own descriptor
  std::vector<int> out(n - 100);
  ASSERT_EQ(vnpuMemcpyAsync(out.data(), d.get(), bytes, vnpuMemcpyDeviceToHost, s), vnpuSuccess);
  EXPECT_EQ(*got, static_cast<int64_t>(bytes));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), values.begin() + 100));
  EXPECT_EQ(vnpuStreamDestroy(s), vnpuSuccess);
}

TEST_F(CopyTest, AShortFileReadReportsTheBytesReadAndLeavesTheStreamHealthy) {
  const auto values = Iota(1000);
  TempFile file(values);
  DeviceBuffer d(4096 * sizeof(int));
  auto got = std::make_shared<int64_t>(0);
  ASSERT_EQ(vnpuMemcpyFromFileAsync(d.get(), file.fd, 0, 4096 * sizeof(int), got, nullptr), vnpuSuccess);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);  // not a stream error
  EXPECT_EQ(*got, static_cast<int64_t>(1000 * sizeof(int)));
  // A descriptor not open for reading: -errno, still no stream error.
  const int wronly = ::open(file.path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(wronly, 0);
  ASSERT_EQ(vnpuMemcpyFromFileAsync(d.get(), wronly, 0, 64, got, nullptr), vnpuSuccess);
  ::close(wronly);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_EQ(*got, -static_cast<int64_t>(EBADF));
  // Bad arguments are refused at the call.
  std::vector<int> host(16);
  EXPECT_EQ(vnpuMemcpyFromFileAsync(host.data(), file.fd, 0, 64, got, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemcpyFromFileAsync(d.get(), -1, 0, 64, got, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemcpyFromFileAsync(d.get(), file.fd, 0, 64, nullptr, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
}

TEST_F(CopyTest, AFileCopyWithNoDescriptorLeftReportsEMFILEAndQueuesNothing) {
  const auto values = Iota(1000);
  TempFile file(values);  // mkstemp: open for reading and writing
  DeviceBuffer d(1000 * sizeof(int));
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 512);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> held;  // every descriptor up to the limit
  for (int f; (f = ::dup(file.fd)) >= 0;) held.push_back(f);
  const int exhausted = errno;
  auto got = std::make_shared<int64_t>(0);
  auto wrote = std::make_shared<int64_t>(0);
  const vnpuError_t read = vnpuMemcpyFromFileAsync(d.get(), file.fd, 0, 64, got, nullptr);
  const vnpuError_t write = vnpuMemcpyToFileAsync(file.fd, 0, d.get(), 64, wrote, nullptr);
  for (int f : held) ::close(f);
  ::setrlimit(RLIMIT_NOFILE, &old);
  ASSERT_EQ(exhausted, EMFILE);
  EXPECT_EQ(read, vnpuSuccess);
  EXPECT_EQ(write, vnpuSuccess);
  EXPECT_EQ(*got, -static_cast<int64_t>(EMFILE));
  EXPECT_EQ(*wrote, -static_cast<int64_t>(EMFILE));
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
}

// ---- file writes from device memory (cuFileWriteAsync's role) ------------------------

std::vector<int> ReadBack(int fd, size_t n, size_t offset = 0) {
  std::vector<int> out(n, -1);
  const ssize_t r = ::pread(fd, out.data(), n * sizeof(int), static_cast<off_t>(offset));
  EXPECT_EQ(r, static_cast<ssize_t>(n * sizeof(int)));
  return out;
}

TEST_F(CopyTest, FileWriteTakesTheBytesAsOfItsPlaceInTheStream) {
  constexpr size_t n = 1 << 16;
  TempFile file(std::vector<int>(8, 0));  // the write lands after these 32 bytes
  DeviceBuffer d(n * sizeof(int));
  int* dev = static_cast<int*>(d.get());
  vnpuStream_t s = nullptr;
  ASSERT_EQ(vnpuStreamCreate(&s), vnpuSuccess);
  // A slow kernel queued before the write fills the memory; one queued after it overwrites it. The file holds
  // the first kernel's values, whatever the host does meanwhile.
  ASSERT_EQ(vnpuLaunchKernel(s, "fill", [dev] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (size_t i = 0; i < n; ++i) dev[i] = static_cast<int>(i) + 5;
  }), vnpuSuccess);
  auto wrote = std::make_shared<int64_t>(0);
  ASSERT_EQ(vnpuMemcpyToFileAsync(file.fd, 8 * sizeof(int), dev, n * sizeof(int), wrote, s), vnpuSuccess);
  EXPECT_EQ(*wrote, -1);  // not run yet
  ASSERT_EQ(vnpuLaunchKernel(s, "clobber", [dev] { std::fill(dev, dev + n, -7); }), vnpuSuccess);
  ::close(::dup(file.fd));  // the runtime writes through its own descriptor
  ASSERT_EQ(vnpuStreamSynchronize(s), vnpuSuccess);
  EXPECT_EQ(*wrote, static_cast<int64_t>(n * sizeof(int)));
  EXPECT_EQ(ReadBack(file.fd, n, 8 * sizeof(int)), Iota(n, 5));
  EXPECT_EQ(ReadBack(file.fd, 8), std::vector<int>(8, 0));
  EXPECT_EQ(vnpuStreamDestroy(s), vnpuSuccess);
}

TEST_F(CopyTest, AFailedFileWriteReportsErrnoAndLeavesTheStreamHealthy) {
  DeviceBuffer d(4096);
  ASSERT_EQ(vnpuMemsetAsync(d.get(), 1, 4096, nullptr), vnpuSuccess);
  auto wrote = std::make_shared<int64_t>(0);
  // A full device: ENOSPC.
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0);
  ASSERT_EQ(vnpuMemcpyToFileAsync(full, 0, d.get(), 4096, wrote, nullptr), vnpuSuccess);
  ::close(full);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);  // not a stream error
  EXPECT_EQ(*wrote, -static_cast<int64_t>(ENOSPC));
  // A descriptor not open for writing: EBADF.
  TempFile file(Iota(16));
  const int rdonly = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(rdonly, 0);
  ASSERT_EQ(vnpuMemcpyToFileAsync(rdonly, 0, d.get(), 64, wrote, nullptr), vnpuSuccess);
  ::close(rdonly);
  EXPECT_EQ(vnpuStreamSynchronize(nullptr), vnpuSuccess);
  EXPECT_EQ(*wrote, -static_cast<int64_t>(EBADF));
  EXPECT_EQ(ReadBack(file.fd, 16), Iota(16));
  // Bad arguments are refused at the call: host memory, no descriptor, no counter.
  std::vector<int> host(16);
  EXPECT_EQ(vnpuMemcpyToFileAsync(file.fd, 0, host.data(), 64, wrote, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemcpyToFileAsync(-1, 0, d.get(), 64, wrote, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuMemcpyToFileAsync(file.fd, 0, d.get(), 64, nullptr, nullptr), vnpuErrorInvalidValue);
  EXPECT_EQ(vnpuGetLastError(), vnpuSuccess);
}

}  // namespace
