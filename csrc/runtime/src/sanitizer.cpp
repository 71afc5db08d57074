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

#include <cstring>
#include <iterator>
#include <unordered_set>

namespace vnpu::rt::san {

std::atomic<bool> g_on{false};

namespace {

using Clock = std::vector<uint64_t>;

struct Epoch {
  uint32_t slot = 0;
  uint64_t pos = 0;  // 0: none
  const char* name = nullptr;
  bool before_free = false;  // the range was freed after this access
};

struct Range {
  uintptr_t end = 0;
  Epoch writer;
  std::vector<Epoch> readers;
  bool freed = false;
  vnpuStream_st* freed_on = nullptr;
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

bool ordered(const Clock& c, uint32_t slot, const Epoch& e) {
  return e.pos == 0 || e.slot == slot || (e.slot < c.size() && c[e.slot] >= e.pos);
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

// Calls f(range) on ranges covering exactly [lo, hi), creating them where none was.
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
    f(it->second);
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
  return err;
}

}  // namespace

void set_report(vnpuSanitizerReport report) { t_report = std::move(report); }

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
    vnpuError_t err = vnpuSuccess;
    visit(lo, hi, [&](uintptr_t start, const Range& r) {
      if (r.freed) {
        err = refuse(vnpuErrorUseAfterFree, i, a, start, r, s, pos, name(i), r.writer.pos ? &r.writer : nullptr,
                     true);
        return false;
      }
      if (!ordered(c, k, r.writer)) {
        err = refuse(vnpuErrorStreamRace, i, a, start, r, s, pos, name(i), &r.writer, true);
        return false;
      }
      if (a.write) {
        for (const Epoch& e : r.readers) {
          if (!ordered(c, k, e)) {
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
      const Epoch me{k, pos, name(i), false};
      const uintptr_t lo = reinterpret_cast<uintptr_t>(a.ptr);
      cover(lo, lo + a.bytes, [&](Range& r) {
        if (a.write) {
          r.writer = me;
          r.readers.clear();
          return;
        }
        for (Epoch& e : r.readers) {
          if (e.slot == k) {
            e = me;
            return;
          }
        }
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
      if (capturing) s->capture->san_accesses.insert(s->capture->san_accesses.end(), acc.begin(), acc.end());
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
}

void host_waited_event(vnpuEvent_st* e) {
  std::lock_guard<std::mutex> g(g_mu);
  join(g_clocks[0], e->san_clock);
}

// Note [Deferred host copies]
// A non_blocking device->host copy into pinned memory is complete only once the
// host synchronizes; reading the destination before is a race whose outcome
// depends on timing (usually right on a fast device). With the sanitizer on,
// the destination is filled with 0xFF bytes (NaN in floating dtypes) at the
// call and the copy itself waits on its stream until the host next waits for
// or queries any stream or event, so a read before the synchronization sees
// the poison every time. It costs the stream a stall until that point.
namespace {
std::mutex g_gate_mu;  // guards g_gate_gen
std::condition_variable g_gate_cv;
uint64_t g_gate_gen = 0;  // host waits and queries so far
}  // namespace

uint64_t gate_ticket() {
  std::lock_guard<std::mutex> g(g_gate_mu);
  return g_gate_gen;
}

void wait_gate(uint64_t ticket) {
  std::unique_lock<std::mutex> lk(g_gate_mu);
  g_gate_cv.wait(lk, [&] { return g_gate_gen > ticket; });
}

void release_gates() {
  {
    std::lock_guard<std::mutex> g(g_gate_mu);
    ++g_gate_gen;
  }
  g_gate_cv.notify_all();
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
  {
    std::lock_guard<std::mutex> g(san::g_mu);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
    san::cover(lo, lo + bytes, [&](san::Range& r) {
      r.freed = true;
      r.freed_on = s;
      r.writer.before_free = true;
      for (auto& e : r.readers) e.before_free = true;
    });
  }
  // Stream-ordered, never a host write racing queued kernels; not an access
  // of its own (the free point is what later accesses are checked against).
  // Not on a capturing stream: the fill would be recorded into the graph.
  if (capture_of(s)) return vnpuSuccess;
  s->submit("sanitizer poison", [ptr, bytes] { std::memset(ptr, 0xFF, bytes); }, nullptr,
            {vnpuActivityKindMemset, bytes, vnpuMemcpyHostToHost, false});
  return vnpuSuccess;
}

vnpuError_t vnpuSanitizerAlloc(void* ptr, size_t bytes) {
  if (!san::on() || bytes == 0) return vnpuSuccess;
  if (ptr == nullptr) return vnpuErrorInvalidValue;
  std::lock_guard<std::mutex> g(san::g_mu);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr), hi = lo + bytes;
  san::split_at(lo);
  san::split_at(hi);
  san::visit(lo, hi, [](uintptr_t, san::Range& r) {
    r.freed = false;
    return true;
  });
  return vnpuSuccess;
}
