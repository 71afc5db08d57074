// Sanitizer (VNPU_SANITIZE=1): happens-before checks of declared accesses.
// Ordering, not timing: every race here is reported although the streams
// are idle when the second access is launched. Each scenario runs in a fresh
// process (the sanitizer must be on before initialization).
#include "test_util.h"

#include <cstring>

using namespace vnpu_test;

namespace {

vnpuError_t Launch(vnpuStream_t s, void* p, size_t n, int write) {
  const vnpuMemAccess a{p, n, write};
  return vnpuLaunchKernelWithAccesses(s, write ? "writer" : "reader", [] {}, &a, 1);
}

VNPU_CHILD_SCENARIO(SanitizerOrdering) {
  CHILD_CHECK_EQ(vnpuSanitizerIsEnabled(), 1);
  vnpuStream_t a = nullptr, b = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamCreate(&b), vnpuSuccess);
  char* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);

  CHILD_CHECK_EQ(Launch(a, p, 1024, 1), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p, 1024, 0), vnpuSuccess);            // same stream: ordered
  CHILD_CHECK_EQ(Launch(b, p + 1024, 1024, 1), vnpuSuccess);     // disjoint bytes
  std::this_thread::sleep_for(20ms);                             // `a` is idle by now: still a race
  CHILD_CHECK_EQ(Launch(b, p + 512, 16, 0), vnpuErrorStreamRace);
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.stream == b && r.other_stream == a && r.other_write == 1 && r.other_name == "writer");
  CHILD_CHECK(r.ptr == p + 512 && r.bytes == 16);
  // The host waited for `a`: work queued afterwards on any stream is ordered after it.
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(b, p + 512, 16, 0), vnpuSuccess);
  // b read [512, 528): a write there from a must wait for b.
  CHILD_CHECK_EQ(Launch(a, p, 1024, 1), vnpuErrorStreamRace);
  vnpuEvent_t e = nullptr;
  CHILD_CHECK_EQ(vnpuEventCreate(&e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventRecord(e, b), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamWaitEvent(a, e, 0), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p, 1024, 1), vnpuSuccess);
  // Copies declare their ranges: b reads what a just wrote.
  std::vector<char> host(64);
  CHILD_CHECK_EQ(vnpuMemcpyAsync(host.data(), p, 64, vnpuMemcpyDeviceToHost, b), vnpuErrorStreamRace);
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemcpyAsync(host.data(), p, 64, vnpuMemcpyDeviceToHost, b), vnpuSuccess);
  // Host accesses: a write from a, unsynchronized, is a race for the host.
  CHILD_CHECK_EQ(Launch(a, p + 2048, 8, 1), vnpuSuccess);
  const vnpuMemAccess h{p + 2048, 8, 0};
  CHILD_CHECK_EQ(vnpuSanitizerHostAccess("host read", &h, 1), vnpuErrorStreamRace);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerHostAccess("host read", &h, 1), vnpuSuccess);
  return 0;
}

VNPU_CHILD_SCENARIO(SanitizerFree) {
  vnpuStream_t a = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  float* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemsetAsync(p, 0, 4096, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerFree(p, 4096, a), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p + 10, 4, 0), vnpuErrorUseAfterFree);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessBegin(), vnpuSuccess);  // the test peeks at device memory (check 4)
  const float poisoned = p[0];
  CHILD_CHECK_EQ(vnpuSanitizerDeviceAccessEnd(), vnpuSuccess);
  CHILD_CHECK(poisoned != poisoned);  // poisoned in stream order: NaN
  CHILD_CHECK_EQ(vnpuSanitizerAlloc(p, 2048), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p + 10, 4, 0), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p + 600, 4, 0), vnpuErrorUseAfterFree);  // beyond the new allocation
  return 0;
}

// Note [Sanitizer and graphs]: captured tasks are no accesses; each replay declares them on its stream.
VNPU_CHILD_SCENARIO(SanitizerGraphReplay) {
  vnpuStream_t a = nullptr, b = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamCreate(&b), vnpuSuccess);
  char* p = nullptr;
  char* q = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&q), 4096), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p, 1024, 1), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamBeginCapture(b, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(b, p, 1024, 0), vnpuSuccess);  // recorded: not checked against a's write
  CHILD_CHECK_EQ(Launch(a, p, 1024, 1), vnpuSuccess);  // nor is the recorded read an access
  CHILD_CHECK_EQ(vnpuSanitizerFree(q, 4096, b), vnpuSuccess);  // no poison fill recorded into the graph
  vnpuGraph_t g = nullptr;
  CHILD_CHECK_EQ(vnpuStreamEndCapture(b, &g), vnpuSuccess);
  size_t nodes = 0;
  CHILD_CHECK_EQ(vnpuGraphGetNodeCount(g, &nodes), vnpuSuccess);
  CHILD_CHECK_EQ(nodes, 1u);
  vnpuGraphExec_t x = nullptr;
  CHILD_CHECK_EQ(vnpuGraphInstantiate(&x, g, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphLaunch(x, b), vnpuErrorStreamRace);  // the replay reads p, unordered with a
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.stream == b && r.other_stream == a && r.other_write == 1 && !r.write);
  CHILD_CHECK(r.name == "reader (in a graph replay)" && r.ptr == p && r.bytes == 1024);
  vnpuEvent_t e = nullptr;
  CHILD_CHECK_EQ(vnpuEventCreate(&e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamWaitEvent(b, e, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphLaunch(x, b), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p + 16, 16, 1), vnpuErrorStreamRace);  // the replay on b may still read it
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.stream == a && r.other_stream == b && r.other_name == "reader (in a graph replay)");
  CHILD_CHECK_EQ(vnpuStreamSynchronize(b), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p + 16, 16, 1), vnpuSuccess);
  // A replay captured into another graph hands its accesses on to that graph.
  CHILD_CHECK_EQ(vnpuStreamBeginCapture(b, vnpuStreamCaptureModeGlobal), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphLaunch(x, b), vnpuSuccess);
  vnpuGraph_t g2 = nullptr;
  CHILD_CHECK_EQ(vnpuStreamEndCapture(b, &g2), vnpuSuccess);
  vnpuGraphExec_t x2 = nullptr;
  CHILD_CHECK_EQ(vnpuGraphInstantiate(&x2, g2, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphLaunch(x2, a), vnpuSuccess);      // same stream as the last write
  CHILD_CHECK_EQ(Launch(b, p, 8, 1), vnpuErrorStreamRace);  // the outer replay on a reads p
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(b, p, 8, 1), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphExecDestroy(x2), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphDestroy(g2), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphExecDestroy(x), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuGraphDestroy(g), vnpuSuccess);
  return 0;
}

// Note [Frees without record_stream]: a free is a write by the freeing stream; another stream's
// unordered use is reported at the next call, and the poison fill waits for that stream's work.
VNPU_CHILD_SCENARIO(SanitizerFreeRace) {
  vnpuStream_t a = nullptr, b = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamCreate(&b), vnpuSuccess);
  float* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemsetAsync(p, 0, 4096, a), vnpuSuccess);
  vnpuEvent_t e = nullptr;
  CHILD_CHECK_EQ(vnpuEventCreate(&e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamWaitEvent(b, e, 0), vnpuSuccess);
  float seen = -1.0f;
  const vnpuMemAccess rd{p, 4096, 0};
  CHILD_CHECK_EQ(vnpuLaunchKernelWithAccesses(b, "late reader", [p, &seen] {
    std::this_thread::sleep_for(100ms);  // still running when `a` would poison the block
    seen = p[7];
  }, &rd, 1), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerFree(p, 4096, a), vnpuErrorStreamRace);  // freed all the same
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuErrorStreamRace);         // the next call reports it
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.deferred == 1 && r.freed_on == a && r.other_stream == b && r.other_name == "late reader");
  CHILD_CHECK(r.ptr == p && r.bytes == 4096 && r.other_write == 0 && r.stream == a);
  CHILD_CHECK(r.name == "vnpuStreamSynchronize");
  CHILD_CHECK(seen == 0.0f);  // the poison fill on `a` waited for b's reader: it saw the values, not NaN
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);  // reported once
  // Ordered before the free (an event recorded on b after its use, waited for by a): no race.
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);  // b's late read is history for the next owner
  CHILD_CHECK_EQ(vnpuSanitizerAlloc(p, 4096), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemsetAsync(p, 0, 4096, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamWaitEvent(b, e, 0), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(b, p, 4096, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventRecord(e, b), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamWaitEvent(a, e, 0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerFree(p, 4096, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventDestroy(e), vnpuSuccess);
  return 0;
}

// Note [Strided accesses]: row sets of one stride conflict only where their rows overlap.
VNPU_CHILD_SCENARIO(SanitizerRows) {
  vnpuStream_t a = nullptr, b = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamCreate(&b), vnpuSuccess);
  char* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  auto rows = [](vnpuStream_t s, char* start, size_t n_rows, size_t row, size_t stride, int write) {
    vnpuMemAccess acc{start, (n_rows - 1) * stride + row, write};
    acc.row_bytes = row;
    acc.row_stride = stride;
    return vnpuLaunchKernelWithAccesses(s, write ? "rows writer" : "rows reader", [] {}, &acc, 1);
  };
  CHILD_CHECK_EQ(rows(a, p, 64, 16, 64, 1), vnpuSuccess);        // bytes [0,16) of every 64
  CHILD_CHECK_EQ(rows(b, p + 16, 64, 16, 64, 1), vnpuSuccess);   // [16,32): disjoint, interleaved
  CHILD_CHECK_EQ(rows(b, p + 32, 63, 28, 64, 0), vnpuSuccess);   // [32,60): in a's gaps
  CHILD_CHECK_EQ(Launch(b, p + 40, 8, 1), vnpuSuccess);          // a contiguous write inside a gap of a's rows
  CHILD_CHECK_EQ(Launch(b, p + 64 * 10 + 32, 32, 0), vnpuSuccess);
  // A report makes its stream ordered after the other access (Note [One report per race]), so each
  // probe that races runs on a stream of its own.
  auto fresh = [] {
    vnpuStream_t s = nullptr;
    return vnpuStreamCreate(&s) == vnpuSuccess ? s : nullptr;
  };
  vnpuStream_t c = fresh();
  CHILD_CHECK_EQ(rows(c, p + 48, 63, 24, 64, 0), vnpuErrorStreamRace);  // [48,72) reaches a's next row
  CHILD_CHECK_EQ(rows(c, p + 48, 63, 24, 64, 0), vnpuSuccess);          // reported once, then assumed ordered
  CHILD_CHECK_EQ(rows(fresh(), p + 8, 64, 16, 64, 0), vnpuErrorStreamRace);  // [8,24) overlaps a's [0,16)
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.other_stream == a && r.other_name == "rows writer");
  CHILD_CHECK_EQ(Launch(fresh(), p + 64 * 5 + 4, 4, 0), vnpuErrorStreamRace);  // inside one of a's rows
  // Another stride: counted as overlapping wherever both touch a range (the fallback), though [32,48)
  // of every 128 bytes misses a's rows.
  CHILD_CHECK_EQ(rows(fresh(), p + 32, 32, 16, 128, 1), vnpuErrorStreamRace);
  CHILD_CHECK_EQ(rows(a, p + 16, 64, 8, 64, 0), vnpuErrorStreamRace);   // a reads what b wrote
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p, 4096, 0), vnpuSuccess);
  return 0;
}

// Note [Pinned uploads]: host code rewriting the source of a queued upload is found at the host's
// first wait ordered after the copy, whether or not the copy ran before the write.
VNPU_CHILD_SCENARIO(SanitizerPinnedUpload) {
  vnpuStream_t a = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  char* h = nullptr;
  char* p = nullptr;
  CHILD_CHECK_EQ(vnpuMallocHost(reinterpret_cast<void**>(&h), 4096), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMalloc(reinterpret_cast<void**>(&p), 4096), vnpuSuccess);
  std::memset(h, 1, 4096);
  CHILD_CHECK_EQ(vnpuMemcpyAsync(p, h, 4096, vnpuMemcpyHostToDevice, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);  // ordered: the host may write now
  h[100] = 2;
  CHILD_CHECK_EQ(vnpuMemcpyAsync(p, h, 4096, vnpuMemcpyHostToDevice, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);  // the copy ran long before the write below
  h[200] = 3;
  CHILD_CHECK_EQ(vnpuMemcpyAsync(p, h, 4096, vnpuMemcpyHostToDevice, a), vnpuSuccess);
  std::this_thread::sleep_for(20ms);  // the copy has run: still a race by ordering
  h[300] = 4;                         // the host refills the buffer without waiting
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuErrorStreamRace);
  vnpuSanitizerReport r;
  CHILD_CHECK_EQ(vnpuSanitizerGetLastReport(&r), vnpuSuccess);
  CHILD_CHECK(r.deferred == 2 && r.ptr == h && r.bytes == 4096 && r.host_offset == 300);
  CHILD_CHECK(r.other_stream == a && r.other_name == "memcpy HtoD" && r.name == "vnpuStreamSynchronize");
  CHILD_CHECK_EQ(vnpuStreamSynchronize(a), vnpuSuccess);  // reported once
  // An event recorded after the copy and waited for orders the host too.
  vnpuEvent_t e = nullptr;
  CHILD_CHECK_EQ(vnpuEventCreate(&e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuMemcpyAsync(p, h, 4096, vnpuMemcpyHostToDevice, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventRecord(e, a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventSynchronize(e), vnpuSuccess);
  h[400] = 5;
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuEventDestroy(e), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuFreeHost(h), vnpuSuccess);
  return 0;
}

VNPU_CHILD_SCENARIO(SanitizerEnableAfterInit) {
  CHILD_CHECK_EQ(vnpuSanitizerIsEnabled(), 0);
  CHILD_CHECK_EQ(vnpuInit(0), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuSanitizerEnable(), vnpuErrorNotSupported);
  CHILD_CHECK_EQ(vnpuSanitizerIsEnabled(), 0);
  void* p = nullptr;
  CHILD_CHECK_EQ(vnpuMalloc(&p, 64), vnpuSuccess);
  vnpuStream_t a = nullptr, b = nullptr;
  CHILD_CHECK_EQ(vnpuStreamCreate(&a), vnpuSuccess);
  CHILD_CHECK_EQ(vnpuStreamCreate(&b), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(a, p, 64, 1), vnpuSuccess);
  CHILD_CHECK_EQ(Launch(b, p, 64, 1), vnpuSuccess);  // off: not checked
  CHILD_CHECK_EQ(vnpuDeviceSynchronize(), vnpuSuccess);
  return 0;
}

TEST(SanitizerTest, OrderingByStreamsEventsAndHostWaits) {
  EXPECT_EQ(RunScenario("SanitizerOrdering", {"VNPU_SANITIZE=1"}), 0);
}

TEST(SanitizerTest, FreedMemoryIsPoisonedAndRefused) {
  EXPECT_EQ(RunScenario("SanitizerFree", {"VNPU_SANITIZE=1"}), 0);
}

TEST(SanitizerTest, FreeUnorderedWithAnotherStreamsUseIsReportedLater) {
  EXPECT_EQ(RunScenario("SanitizerFreeRace", {"VNPU_SANITIZE=1"}), 0);
}

TEST(SanitizerTest, StridedRowsConflictOnlyWhereTheyOverlap) {
  EXPECT_EQ(RunScenario("SanitizerRows", {"VNPU_SANITIZE=1"}), 0);
}

TEST(SanitizerTest, HostRewritingAQueuedUploadsPinnedSourceIsReported) {
  EXPECT_EQ(RunScenario("SanitizerPinnedUpload", {"VNPU_SANITIZE=1"}), 0);
}

TEST(SanitizerTest, GraphReplaysDeclareTheCapturedAccesses) {
  EXPECT_EQ(RunScenario("SanitizerGraphReplay", {"VNPU_SANITIZE=1"}), 0);
}

TEST(SanitizerTest, EnableRefusedAfterInitialization) { EXPECT_EQ(RunScenario("SanitizerEnableAfterInit"), 0); }

}  // namespace
