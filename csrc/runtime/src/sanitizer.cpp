// Sanitizer: happens-before checks of declared memory accesses (runtime.h, "Sanitizer").
//
// Note [Sanitizer clocks]
// Every stream gets a slot (slot 0 is the host, all host threads as one) and
// a vector clock: clock[k][j] = p means the next task of slot k is ordered
// after the first p tasks of slot j. A task's epoch is (slot, position). An
// earlier access with epoch (j, p) is ordered before a task of slot k iff j ==
// k or clock[k][j] >= p. Edges: a task takes the host's clock when it is
// queued (the host did everything it knows of before queueing it); an event
// record copies its stream's clock into the event; vnpuStreamWaitEvent joins
// the event's clock into the stream's; a host wait that returns joins the
// waited stream's (or event's) clock into the host's. Timing never enters:
// a race whose two tasks happened to run in a safe order is reported too.
//
// Note [Sanitizer ranges]
// Memory is a map of disjoint byte ranges, each with its last writer and the
// readers since (the latest per slot), split where accesses begin and end.
// A write conflicts with an unordered writer or reader, a read with an
// unordered writer. A refused access leaves no trace (all accesses of a call
// are checked before any is recorded). Frees mark ranges freed until the
// allocator hands them out again; the history stays, so a stream that used the
// old tensor without being ordered before the free conflicts with the new
// owner's first access (the cross-stream free without record_stream).
#include "internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iterator>
#include <memory>
#include <unordered_set>

namespace vnpu::rt::san {

std::atomic<bool> g_on{false};

namespace {

using Clock = std::vector<uint64_t>;

// Note [Strided accesses]
// A strided view (a channel slice of an NCHW tensor, a column block of a
// matrix) does not touch every byte of its span, and two streams writing
// interleaved, disjoint slices of one tensor are not a race. An access may
// declare itself as rows (vnpuMemAccess::row_bytes/row_stride): the bytes a
// of its span with (a - ptr) % row_stride < row_bytes. Two row sets with the
// same stride overlap iff their intervals modulo the stride do; a row set is
// tested against a range of the map exactly (does it touch it, does it cover
// it). Row sets of different strides count as overlapping wherever both touch
// a range (the fallback; views more complex than rows are declared as their
// span by the layer above).
struct Rows {
  uintptr_t period = 0;  // 0: every byte of the span
  uintptr_t phase = 0;   // address % period of a row start
  uintptr_t len = 0;     // bytes per row (< period)
};

Rows rows_of(const vnpuMemAccess& a) {
  if (a.row_stride == 0 || a.row_bytes == 0 || a.row_bytes >= a.row_stride) return {};
  return {a.row_stride, reinterpret_cast<uintptr_t>(a.ptr) % a.row_stride, a.row_bytes};
}

// Offset of address s inside its period (0 = a row start).
uintptr_t phase_of(const Rows& r, uintptr_t s) { return (s % r.period + r.period - r.phase) % r.period; }

// r touches a byte of [s, e).
bool touches(const Rows& r, uintptr_t s, uintptr_t e) {
  if (r.period == 0 || e - s >= r.period) return true;
  const uintptr_t o = phase_of(r, s);
  return o < r.len || r.period - o < e - s;
}

// r touches every byte of [s, e).
bool full_in(const Rows& r, uintptr_t s, uintptr_t e) {
  if (r.period == 0) return true;
  const uintptr_t o = phase_of(r, s);
  return o < r.len && o + (e - s) <= r.len;
}

// Inside [s, e), some byte both touch.
bool conflict(const Rows& a, const Rows& b, uintptr_t s, uintptr_t e) {
  if (!touches(a, s, e) || !touches(b, s, e)) return false;
  if (full_in(a, s, e) || full_in(b, s, e) || a.period != b.period) return true;
  const uintptr_t d = (b.phase + a.period - a.phase) % a.period;  // b's row start inside a's period
  return d < a.len || a.period - d < b.len;
}

// Inside [s, e), a touches every byte b touches.
bool covers(const Rows& a, const Rows& b, uintptr_t s, uintptr_t e) {
  if (full_in(a, s, e) || !touches(b, s, e)) return true;
  if (a.period != b.period) return false;
  const uintptr_t d = (b.phase + a.period - a.phase) % a.period;
  return d + b.len <= a.len;
}

struct Epoch {
  uint32_t slot = 0;
  uint64_t pos = 0;  // 0: none
  const char* name = nullptr;
  bool before_free = false;  // the range was freed after this access
  Rows rows;                 // the bytes it touched (Note [Strided accesses])
  bool race_noted = false;   // reported as racing a free with record_stream (Note [Frees with record_stream])
};

struct Range {
  uintptr_t end = 0;
  std::vector<Epoch> writers;  // the last writer; more only where strided writes left parts of others
  std::vector<Epoch> readers;
  bool freed = false;
  vnpuStream_st* freed_on = nullptr;
  uint64_t allocated_at = 0;  // g_alloc_epoch after its last allocation
};

std::mutex g_mu;  // guards everything below (and vnpuStream_st::san_slot, vnpuEvent_st::san_clock)
std::map<uintptr_t, Range> g_ranges;           // start -> range, disjoint
std::vector<Clock> g_clocks{Clock(1, 0)};       // per slot
std::vector<uint64_t> g_pos{0};                 // tasks per slot
std::vector<vnpuStream_st*> g_streams{nullptr};  // per slot
std::unordered_set<std::string> g_names;        // interned task names
thread_local vnpuSanitizerReport t_report;

uint32_t slot_of(vnpuStream_st* s) {
  if (s == nullptr) return 0;
  if (s->san_slot < 0) {
    s->san_slot = static_cast<int>(g_clocks.size());
    g_clocks.emplace_back();
    g_pos.push_back(0);
    g_streams.push_back(s);
  }
  return static_cast<uint32_t>(s->san_slot);
}

void join(Clock& a, const Clock& b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  for (size_t i = 0; i < b.size(); ++i) a[i] = std::max(a[i], b[i]);
}

// Whether clock `c` has seen task `pos` of stream slot `slot`.
bool covers(const Clock& c, uint32_t slot, uint64_t pos) { return slot < c.size() && c[slot] >= pos; }

bool ordered(const Clock& c, uint32_t slot, const Epoch& e) {
  return e.pos == 0 || e.slot == slot || covers(c, e.slot, e.pos);
}

const char* intern(const char* name) {
  return g_names.emplace(name == nullptr ? "<kernel>" : name).first->c_str();
}

// Calls f(start, range) for every range overlapping [lo, hi).
template <class F>
void visit(uintptr_t lo, uintptr_t hi, F f) {
  auto it = g_ranges.upper_bound(lo);
  if (it != g_ranges.begin() && std::prev(it)->second.end > lo) --it;
  for (; it != g_ranges.end() && it->first < hi; ++it) {
    if (!f(it->first, it->second)) return;
  }
}

void split_at(uintptr_t a) {
  auto it = g_ranges.upper_bound(a);
  if (it == g_ranges.begin()) return;
  --it;
  if (it->first < a && a < it->second.end) {
    Range right = it->second;
    it->second.end = a;
    g_ranges.emplace_hint(std::next(it), a, std::move(right));
  }
}

// Calls f(start, range) on ranges covering exactly [lo, hi), creating them where none was.
template <class F>
void cover(uintptr_t lo, uintptr_t hi, F f) {
  split_at(lo);
  split_at(hi);
  uintptr_t cur = lo;
  auto it = g_ranges.lower_bound(lo);
  while (cur < hi) {
    if (it == g_ranges.end() || it->first > cur) {
      Range r;
      r.end = it == g_ranges.end() ? hi : std::min<uintptr_t>(hi, it->first);
      it = g_ranges.emplace_hint(it, cur, std::move(r));
    }
    f(it->first, it->second);
    cur = it->second.end;
    ++it;
  }
}

vnpuError_t refuse(vnpuError_t err, size_t index, const vnpuMemAccess& a, uintptr_t start, const Range& r,
                   vnpuStream_st* s, uint64_t pos, const char* name, const Epoch* other, bool other_write) {
  vnpuSanitizerReport rep;
  rep.error = err;
  rep.access = index;
  rep.write = a.write;
  (void)start;  // the whole access is reported: sub-ranges are an artefact of earlier accesses
  rep.ptr = a.ptr;
  rep.bytes = a.bytes;
  rep.stream = s;
  rep.position = pos;
  rep.name = name;
  if (other != nullptr) {
    rep.other_stream = g_streams[other->slot];
    rep.other_position = other->pos;
    rep.other_name = other->name;
    rep.other_write = other_write;
    rep.freed_since = other->before_free;
  }
  rep.freed_on = r.freed_on;
  t_report = std::move(rep);
  // Note [One report per race]: a program that catches the error and goes on
  // would otherwise get the same race again at each later access of this
  // stream to the memory and at its free. From here on the ordering the fix
  // adds is assumed: this stream is ordered after the other access (and only
  // it: that stream's later work is still checked).
  if (err == vnpuErrorStreamRace && other != nullptr) {
    Clock& c = g_clocks[slot_of(s)];
    if (c.size() <= other->slot) c.resize(other->slot + 1, 0);
    c[other->slot] = std::max(c[other->slot], other->pos);
  }
  return err;
}

}  // namespace

void set_report(vnpuSanitizerReport report) { t_report = std::move(report); }

// Note [Frees without record_stream]
// CUDA's caching allocator treats a block as free for its stream at the
// free: a stream that used it without record_stream and is not ordered
// before that point races whatever the allocating stream does with the block
// next (the next owner's writes, our poison fill). So a free is checked like
// a write by the freeing stream against the block's unordered accesses.
// It cannot be refused (the tensor is gone; a deallocator cannot raise), so
// the first such race is kept here and returned by the next runtime call that
// reports deferred errors, as host accesses are (report_host_access). The
// poison fill then waits for the racing streams' work queued so far, so the
// late reader sees the tensor's values, not NaN produced by the sanitizer.
std::atomic<bool> g_deferred_pending{false};
std::atomic<uint64_t> g_alloc_epoch{0};

bool allocated_since(uintptr_t addr, uint64_t epoch) {
  std::lock_guard<std::mutex> g(g_mu);
  bool since = false;
  visit(addr, addr + 1, [&](uintptr_t, Range& r) {
    since = since || r.allocated_at > epoch;
    return true;
  });
  return since;
}
namespace {
vnpuSanitizerReport g_deferred;  // guarded by g_mu: the first race found outside a launching call

void set_deferred(vnpuSanitizerReport r) {
  g_deferred = std::move(r);
  g_deferred_pending.store(true, std::memory_order_release);
}

void note_free_race(const void* ptr, size_t bytes, vnpuStream_st* s, const Epoch& other, bool other_write,
                    vnpuStream_st* recorded_on = nullptr) {
  vnpuSanitizerReport r;
  r.error = vnpuErrorStreamRace;
  r.deferred = 1;
  r.write = 1;
  r.ptr = ptr;
  r.bytes = bytes;
  r.freed_on = s;
  r.other_stream = g_streams[other.slot];
  r.other_position = other.pos;
  r.other_name = other.name == nullptr ? "" : other.name;
  r.other_write = other_write ? 1 : 0;
  r.recorded_on = recorded_on;
  set_deferred(std::move(r));
}

// Note [Pinned uploads]
// A non_blocking copy from pinned host memory reads its source when the
// stream runs it, so host code that refills the source (a staging buffer
// reused for the next batch) before the host waited for the copy races it:
// the device gets the old or the new bytes depending on timing. Host writes
// are not declared (any CPU op, numpy, a DataLoader worker may make them), so
// the sanitizer keeps a snapshot of the source taken at the call and, at the
// host's first wait that orders it after the copy (stream or device
// synchronize, event synchronize or a query that answers complete), compares
// it with the source: a difference is reported as a deferred race (the next
// call that reports host accesses raises it). This is ordering, not timing:
// the write is found whether or not the copy had run before it. Costs a
// host copy of each pinned upload (at most kMaxUploadBytes pending; uploads
// beyond that are not checked). Cannot see a rewrite with the same bytes, nor
// one after a wait that ordered the host after the copy's stream position
// through another path.
struct Upload {
  const char* src = nullptr;
  size_t bytes = 0;
  const char* name = "memcpy HtoD";  // the task that reads it (a replay names its graph's copy)
  std::unique_ptr<char[]> snapshot;
  uint32_t slot = 0;
  uint64_t pos = 0;
};
constexpr size_t kMaxUploadBytes = size_t(256) << 20;
std::vector<Upload> g_uploads;  // guarded by g_mu
size_t g_upload_bytes = 0;

// Note [Pinned buffers both ways]
// A pinned buffer may be the source of an upload and then, in stream order,
// the destination of a download (activation offloading, bounce buffers), or
// the reverse: legal on CUDA. So (a) a download drops the snapshots of the
// uploads from its range that are ordered before it (the stream, not host
// code, rewrites their source), (b) an upload from a range a pending download
// will write is not snapshotted (the bytes it reads are the download's), and
// (c) a download does not poison its destination at the call (Note [Deferred
// host copies]) while an upload from that range has not run yet: the poison
// would be what the upload reads.
struct Download {
  const char* dst = nullptr;
  size_t bytes = 0;
  uint32_t slot = 0;
  uint64_t pos = 0;
};
std::vector<Download> g_downloads;  // guarded by g_mu; until the host is ordered after them
struct Inflight {                   // every pinned upload until it ran
  const char* src = nullptr;
  size_t bytes = 0;
  std::shared_ptr<std::atomic<bool>> ran;
};
std::vector<Inflight> g_inflight;  // guarded by g_mu

bool overlaps(const char* a, size_t na, const char* b, size_t nb) { return a < b + nb && b < a + na; }

// With g_mu held, after the host's clock grew: compares the uploads it now orders.
void check_uploads() {
  if (g_uploads.empty() && g_downloads.empty()) return;
  const Clock& host = g_clocks[0];
  auto done = [&](Upload& u) {
    if (!covers(host, u.slot, u.pos)) return false;
    if (std::memcmp(u.src, u.snapshot.get(), u.bytes) != 0 && !g_deferred_pending.load(std::memory_order_relaxed)) {
      size_t off = 0;
      while (off < u.bytes && u.src[off] == u.snapshot[off]) ++off;
      vnpuSanitizerReport r;
      r.error = vnpuErrorStreamRace;
      r.deferred = 2;
      r.ptr = u.src;
      r.bytes = u.bytes;
      r.host_offset = off;
      r.other_stream = g_streams[u.slot];
      r.other_position = u.pos;
      r.other_name = u.name;
      r.write = 1;
      set_deferred(std::move(r));
    }
    g_upload_bytes -= u.bytes;
    return true;
  };
  g_uploads.erase(std::remove_if(g_uploads.begin(), g_uploads.end(), done), g_uploads.end());
  g_downloads.erase(std::remove_if(g_downloads.begin(), g_downloads.end(),
                                   [&](const Download& d) { return covers(host, d.slot, d.pos); }),
                    g_downloads.end());
}
}  // namespace

vnpuError_t take_deferred(vnpuStream_st* s, const char* name) {
  vnpuSanitizerReport r;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_deferred_pending.load(std::memory_order_relaxed)) return vnpuSuccess;
    r = std::move(g_deferred);
    g_deferred = vnpuSanitizerReport();
    g_deferred_pending.store(false, std::memory_order_relaxed);
  }
  r.stream = s;
  r.name = name == nullptr ? "" : name;
  set_report(std::move(r));
  return vnpuErrorStreamRace;
}

namespace {

// Checks and records one task of s whose i-th access is acc(i), named name(i). Called with g_mu held.
template <class Acc, class Name>
vnpuError_t check_and_record(vnpuStream_st* s, size_t n, Acc acc, Name name) {
  const uint32_t k = slot_of(s);
  Clock c = g_clocks[k];
  if (k != 0) join(c, g_clocks[0]);
  const uint64_t pos = g_pos[k] + 1;
  if (c.size() <= k) c.resize(k + 1, 0);
  c[k] = pos;
  for (size_t i = 0; i < n; ++i) {
    const vnpuMemAccess& a = acc(i);
    if (a.bytes == 0 || a.ptr == nullptr) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(a.ptr), hi = lo + a.bytes;
    const Rows rows = rows_of(a);
    vnpuError_t err = vnpuSuccess;
    visit(lo, hi, [&](uintptr_t start, const Range& r) {
      const uintptr_t s0 = std::max(start, lo), e0 = std::min(r.end, hi);  // the part this access spans
      if (!touches(rows, s0, e0)) return true;
      if (r.freed) {
        err = refuse(vnpuErrorUseAfterFree, i, a, start, r, s, pos, name(i),
                     r.writers.empty() ? nullptr : &r.writers.back(), true);
        return false;
      }
      for (const Epoch& w : r.writers) {
        if (!ordered(c, k, w) && conflict(rows, w.rows, s0, e0)) {
          err = refuse(vnpuErrorStreamRace, i, a, start, r, s, pos, name(i), &w, true);
          return false;
        }
      }
      if (a.write) {
        for (const Epoch& e : r.readers) {
          if (!ordered(c, k, e) && conflict(rows, e.rows, s0, e0)) {
            err = refuse(vnpuErrorStreamRace, i, a, start, r, s, pos, name(i), &e, false);
            return false;
          }
        }
      }
      return true;
    });
    if (err != vnpuSuccess) return err;
  }
  g_clocks[k] = std::move(c);
  g_pos[k] = pos;
  for (int pass = 0; pass < 2; ++pass) {  // reads, then writes (an in-place access ends as a write)
    for (size_t i = 0; i < n; ++i) {
      const vnpuMemAccess& a = acc(i);
      if (a.bytes == 0 || a.ptr == nullptr || (a.write != 0) != (pass == 1)) continue;
      const Epoch me{k, pos, name(i), false, rows_of(a)};
      const uintptr_t lo = reinterpret_cast<uintptr_t>(a.ptr);
      cover(lo, lo + a.bytes, [&](uintptr_t start, Range& r) {
        if (!touches(me.rows, start, r.end)) return;
        // What this access covers is ordered before it (checked above): later accesses need only it.
        auto covered = [&](const Epoch& e) { return covers(me.rows, e.rows, start, r.end); };
        if (a.write) {
          r.writers.erase(std::remove_if(r.writers.begin(), r.writers.end(), covered), r.writers.end());
          r.readers.erase(std::remove_if(r.readers.begin(), r.readers.end(), covered), r.readers.end());
          r.writers.push_back(me);
          return;
        }
        r.readers.erase(std::remove_if(r.readers.begin(), r.readers.end(),
                                       [&](const Epoch& e) { return e.slot == k && covered(e); }),
                        r.readers.end());
        r.readers.push_back(me);
      });
    }
  }
  return vnpuSuccess;
}

}  // namespace

// Note [Sanitizer and graphs]
// Nothing runs while a stream captures, so a captured task is not an access:
// begin_task keeps its declared accesses in the capture (named "<task> (in a
// graph replay)") and checks nothing. Each vnpuGraphLaunch then declares all
// of them as one task at the replay's position on the replay stream (the
// nodes run in order inside that task, so they cannot race each other), which
// is CUDA's ordering: a replay is ordered after earlier work on its stream and
// before later work. A graph launched inside a capture passes its accesses on
// to the outer capture the same way.
vnpuError_t begin_task(vnpuStream_st* s, const char* name, const vnpuMemAccess* acc, size_t n) {
  if (s != nullptr && any_capture()) {
    const char* replay_name = nullptr;
    if (n > 0) {
      std::lock_guard<std::mutex> g(g_mu);
      replay_name = intern((std::string(name == nullptr ? "<kernel>" : name) + " (in a graph replay)").c_str());
    }
    std::lock_guard<std::mutex> lk(s->mu);  // lock order: never g_mu inside a stream's mu
    if (s->capture) {
      std::lock_guard<std::mutex> nl(s->capture->nodes_mu);
      for (size_t i = 0; i < n; ++i) {
        if (acc[i].bytes != 0 && acc[i].ptr != nullptr) s->capture->san_accesses.push_back({acc[i], replay_name});
      }
      return vnpuSuccess;
    }
  }
  std::lock_guard<std::mutex> g(g_mu);
  const char* iname = intern(name);
  return check_and_record(s, n, [acc](size_t i) -> const vnpuMemAccess& { return acc[i]; },
                          [iname](size_t) { return iname; });
}

vnpuError_t begin_replay(vnpuStream_st* s, const std::vector<GraphAccess>& acc) {
  if (any_capture()) {
    bool capturing;
    {
      std::lock_guard<std::mutex> lk(s->mu);
      capturing = s->capture != nullptr;
      if (capturing) {
        std::lock_guard<std::mutex> nl(s->capture->nodes_mu);
        s->capture->san_accesses.insert(s->capture->san_accesses.end(), acc.begin(), acc.end());
      }
    }
    if (capturing) return vnpuSuccess;
  }
  std::lock_guard<std::mutex> g(g_mu);
  return check_and_record(s, acc.size(), [&acc](size_t i) -> const vnpuMemAccess& { return acc[i].access; },
                          [&acc](size_t i) { return acc[i].name; });
}

void event_recorded(vnpuEvent_st* e, vnpuStream_st* s) {
  std::lock_guard<std::mutex> g(g_mu);
  e->san_clock = g_clocks[slot_of(s)];
}

void stream_waits_event(vnpuStream_st* s, vnpuEvent_st* e) {
  std::lock_guard<std::mutex> g(g_mu);
  join(g_clocks[slot_of(s)], e->san_clock);
}

void host_waited_stream(vnpuStream_st* s) {
  std::lock_guard<std::mutex> g(g_mu);
  if (s->san_slot < 0) return;
  join(g_clocks[0], g_clocks[s->san_slot]);
  check_uploads();
}

void host_waited_event(vnpuEvent_st* e) {
  std::lock_guard<std::mutex> g(g_mu);
  join(g_clocks[0], e->san_clock);
  check_uploads();
}

std::shared_ptr<std::atomic<bool>> note_upload(vnpuStream_st* s, const void* src, size_t bytes, const char* name) {
  std::lock_guard<std::mutex> g(g_mu);
  auto ran = std::make_shared<std::atomic<bool>>(false);
  g_inflight.erase(std::remove_if(g_inflight.begin(), g_inflight.end(), [](const Inflight& i) { return i.ran->load(); }),
                   g_inflight.end());
  g_inflight.push_back({static_cast<const char*>(src), bytes, ran});
  for (const Download& d : g_downloads) {
    if (overlaps(d.dst, d.bytes, static_cast<const char*>(src), bytes)) return ran;  // Note [Pinned buffers both ways] (b)
  }
  if (g_upload_bytes + bytes > kMaxUploadBytes) return ran;
  Upload u;
  u.src = static_cast<const char*>(src);
  u.bytes = bytes;
  u.name = name;
  u.snapshot.reset(new char[bytes]);
  std::memcpy(u.snapshot.get(), src, bytes);
  u.slot = slot_of(s);
  u.pos = g_pos[u.slot];  // the copy's task (begin_task just counted it)
  g_upload_bytes += bytes;
  g_uploads.push_back(std::move(u));
  return ran;
}

bool note_download(vnpuStream_st* s, void* dst, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mu);
  const char* d = static_cast<const char*>(dst);
  const uint32_t k = slot_of(s);
  const Clock& c = g_clocks[k];
  // (a): uploads ordered before this download stop being compared.
  g_uploads.erase(std::remove_if(g_uploads.begin(), g_uploads.end(),
                                 [&](const Upload& u) {
                                   const bool drop = overlaps(u.src, u.bytes, d, bytes) &&
                                                     (u.slot == k || covers(c, u.slot, u.pos));
                                   if (drop) g_upload_bytes -= u.bytes;
                                   return drop;
                                 }),
                  g_uploads.end());
  g_downloads.push_back({d, bytes, k, g_pos[k]});
  // (c): poison only if no upload from this range is still to run.
  for (const Inflight& i : g_inflight) {
    if (!i.ran->load() && overlaps(i.src, i.bytes, d, bytes)) return false;
  }
  return true;
}

// Note [Deferred host copies]
// A non_blocking device->host copy into pinned memory is complete only once the
// host synchronizes with it; reading the destination before is a race whose
// outcome depends on timing (usually right on a fast device). With the
// sanitizer on, the destination is filled with 0xFF bytes (NaN in floating
// dtypes) at the call and the copy itself waits on its stream until the host
// waits for or queries something ordered after it by the sanitizer's clocks:
// its stream (or a stream that waited for an event recorded after the copy),
// such an event, or the device. So a read before that synchronization sees the
// poison every time, also when the program synchronized the wrong stream. It
// costs the stream a stall until that point, at most kMaxGate: a program that
// never waits for the stream (it polls the pinned destination, or waits on
// another thread) would otherwise hang; after it the copy runs, and a read in
// that window has seen the poison.
namespace {
constexpr std::chrono::milliseconds kMaxGate{1000};
std::mutex g_gate_mu;  // guards g_released; taken after g_mu, never before
std::condition_variable g_gate_cv;
std::vector<uint64_t> g_released;  // per slot: copies at or before this position may run

// With g_mu held.
void release_upto(const Clock& c) {
  bool more = false;
  {
    std::lock_guard<std::mutex> g(g_gate_mu);
    if (g_released.size() < c.size()) g_released.resize(c.size(), 0);
    for (size_t i = 0; i < c.size(); ++i) {
      if (c[i] > g_released[i]) {
        g_released[i] = c[i];
        more = true;
      }
    }
  }
  if (more) g_gate_cv.notify_all();
}
}  // namespace

Gate gate_ticket(vnpuStream_st* s) {
  std::lock_guard<std::mutex> g(g_mu);
  const uint32_t k = slot_of(s);
  return Gate{k, g_pos[k]};
}

void wait_gate(Gate gate) {
  if (gate.slot == 0) return;
  std::unique_lock<std::mutex> lk(g_gate_mu);
  g_gate_cv.wait_for(lk, kMaxGate,
                     [&] { return gate.slot < g_released.size() && g_released[gate.slot] >= gate.pos; });
}

void release_stream(vnpuStream_st* s) {
  std::lock_guard<std::mutex> g(g_mu);
  if (s->san_slot < 0) return;
  release_upto(g_clocks[s->san_slot]);  // its own tasks, and what it waited for
}

void release_event(vnpuEvent_st* e) {
  std::lock_guard<std::mutex> g(g_mu);
  release_upto(e->san_clock);
}

}  // namespace vnpu::rt::san

using namespace vnpu::rt;

vnpuError_t vnpuSanitizerEnable() {
  devices();  // reads VNPU_SANITIZE
  if (san::on()) return vnpuSuccess;
  if (vnpuIsInitialized()) return vnpuErrorNotSupported;
  san::g_on.store(true);
  san::setup_host_check();
  return vnpuSuccess;
}

int vnpuSanitizerIsEnabled() {
  devices();
  return san::on() ? 1 : 0;
}

vnpuError_t vnpuSanitizerHostAccess(const char* name, const vnpuMemAccess* accesses, size_t count) {
  if (!san::on()) return vnpuSuccess;
  if (count > 0 && accesses == nullptr) return vnpuErrorInvalidValue;
  if (vnpuError_t e = san::report_host_access(nullptr, name); e != vnpuSuccess) return e;
  return san::begin_task(nullptr, name, accesses, count);
}

vnpuError_t vnpuSanitizerGetLastReport(vnpuSanitizerReport* report) {
  if (report == nullptr) return vnpuErrorInvalidValue;
  *report = san::t_report;
  return vnpuSuccess;
}

vnpuError_t vnpuSanitizerFree(void* ptr, size_t bytes, vnpuStream_t stream) {
  if (!san::on() || bytes == 0) return vnpuSuccess;
  if (ptr == nullptr || device_of(ptr) < 0) return vnpuErrorInvalidValue;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  std::vector<std::pair<vnpuStream_st*, uint64_t>> wait_for;  // Note [Frees without record_stream]
  bool reported = false;
  {
    std::lock_guard<std::mutex> g(san::g_mu);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
    const uint32_t k = san::slot_of(s);
    san::Clock c = san::g_clocks[k];
    if (k != 0) san::join(c, san::g_clocks[0]);
    std::vector<uint32_t> racing;
    auto check = [&](const san::Epoch& e, bool write) {
      if (e.pos == 0 || e.before_free || san::ordered(c, k, e)) return;
      if (std::find(racing.begin(), racing.end(), e.slot) == racing.end()) racing.push_back(e.slot);
      if (!e.race_noted && !reported && !san::g_deferred_pending.load(std::memory_order_relaxed)) {
        reported = true;
        san::note_free_race(ptr, bytes, s, e, write);
      }
    };
    san::cover(lo, lo + bytes, [&](uintptr_t, san::Range& r) {
      if (!r.freed) {
        for (const auto& e : r.writers) check(e, true);
        for (const auto& e : r.readers) check(e, false);
      }
      r.freed = true;
      r.freed_on = s;
      for (auto& e : r.writers) e.before_free = true;
      for (auto& e : r.readers) e.before_free = true;
    });
    for (uint32_t j : racing) {
      vnpuStream_st* other = san::g_streams[j];
      if (other == nullptr) continue;  // the host: its accesses were made already
      std::lock_guard<std::mutex> lk(other->mu);  // lock order: a stream's mu inside g_mu
      wait_for.emplace_back(other, other->submitted);
    }
  }
  // Stream-ordered, never a host write racing queued kernels; not an access
  // of its own (the free point is what later accesses are checked against).
  // Not on a capturing stream: the fill would be recorded into the graph.
  if (!capture_of(s)) {
    s->submit("sanitizer poison", [ptr, bytes, wait_for = std::move(wait_for)] {
      for (auto& [other, target] : wait_for) {  // streams still using it without record_stream
        std::unique_lock<std::mutex> lk(other->mu);
        other->cv_done.wait(lk, [&, target = target] { return other->completed_or_wake_at(target); });
      }
      std::memset(ptr, 0xFF, bytes);
    }, nullptr, {vnpuActivityKindMemset, bytes, vnpuMemcpyHostToHost, false});
  }
  return reported ? vnpuErrorStreamRace : vnpuSuccess;
}

// Note [Frees with record_stream]
// A block recorded on other streams (record_stream) is reused only once they
// pass the free, so the allocator frees it in the runtime (vnpuSanitizerFree)
// late, at the allocation that finds their events complete, or never before
// exit. A stream that used the block but was not recorded (record_stream on
// the wrong stream) races that reuse all the same, so the free is checked at
// the free too, against the freeing stream, the host and the recorded
// streams. A race found here is reported once (race_noted); the later
// vnpuSanitizerFree still makes its poison fill wait for that stream.
vnpuError_t vnpuSanitizerFreeRecorded(void* ptr, size_t bytes, vnpuStream_t stream, const vnpuStream_t* uses,
                                      size_t count) {
  if (!san::on() || bytes == 0) return vnpuSuccess;
  if (ptr == nullptr || device_of(ptr) < 0 || (count > 0 && uses == nullptr)) return vnpuErrorInvalidValue;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  std::vector<vnpuStream_st*> recorded;
  for (size_t i = 0; i < count; ++i) {
    vnpuStream_st* u = resolve(uses[i]);
    if (u == nullptr) return vnpuErrorInvalidResourceHandle;
    recorded.push_back(u);
  }
  std::lock_guard<std::mutex> g(san::g_mu);
  const uint32_t k = san::slot_of(s);
  san::Clock c = san::g_clocks[k];
  san::join(c, san::g_clocks[0]);
  std::vector<uint32_t> covered{k};
  for (vnpuStream_st* u : recorded) {
    covered.push_back(san::slot_of(u));
    san::join(c, san::g_clocks[covered.back()]);
  }
  bool reported = false;
  auto check = [&](san::Epoch& e, bool write) {
    if (e.pos == 0 || e.before_free || e.race_noted || san::ordered(c, k, e)) return;
    if (std::find(covered.begin(), covered.end(), e.slot) != covered.end()) return;
    e.race_noted = true;
    if (!reported && !san::g_deferred_pending.load(std::memory_order_relaxed)) {
      reported = true;
      san::note_free_race(ptr, bytes, s, e, write, recorded.front());
    }
  };
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
  san::cover(lo, lo + bytes, [&](uintptr_t, san::Range& r) {
    if (r.freed) return;
    for (auto& e : r.writers) check(e, true);
    for (auto& e : r.readers) check(e, false);
  });
  return reported ? vnpuErrorStreamRace : vnpuSuccess;
}

uint64_t vnpuSanitizerAllocationEpoch(const void* ptr) {
  if (!san::on() || ptr == nullptr) return 0;
  std::lock_guard<std::mutex> g(san::g_mu);
  uint64_t epoch = 0;
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  san::visit(a, a + 1, [&](uintptr_t, san::Range& r) {
    epoch = r.allocated_at;
    return false;
  });
  return epoch;
}

vnpuError_t vnpuSanitizerAlloc(void* ptr, size_t bytes) {
  if (!san::on() || bytes == 0) return vnpuSuccess;
  if (ptr == nullptr) return vnpuErrorInvalidValue;
  std::lock_guard<std::mutex> g(san::g_mu);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr), hi = lo + bytes;
  const uint64_t epoch = san::g_alloc_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  // Ranges over all of it (not only where earlier accesses left some): every byte knows its allocation.
  san::cover(lo, hi, [epoch](uintptr_t, san::Range& r) {
    r.freed = false;
    r.allocated_at = epoch;
  });
  return vnpuSuccess;
}
