// Graphs: stream capture (vnpuStreamBeginCapture/EndCapture) and replay (vnpuGraphLaunch).
//
// Note [Stream capture]
// A capturing stream has a Capture (vnpuStream_st::capture, set under the
// stream's mutex); submit() appends the task's callable to it instead of
// queuing it, whichever thread submits. Every other call that would make the
// host wait for the capturing stream, or make the capture depend on work
// outside it, is refused and invalidates the capture (CUDA's rules, see
// runtime.h "Graphs"): the work recorded so far is dropped at
// vnpuStreamEndCapture, which reports the first refusal. Nothing is queued on
// a capturing stream, so the stream, the device and the other streams stay
// usable whatever happens inside a capture.
// "Unsafe" calls (allocation and release of device or pinned memory) follow
// cudaStreamCaptureMode: refused from any thread while a Global capture is
// underway, from the capturing thread during a ThreadLocal one, never from a
// thread whose own mode is Relaxed (vnpuThreadExchangeStreamCaptureMode: the
// caching allocator uses it for the segments of a graph's private pool).
// The registry of live captures (g_live) is guarded by g_mu; lock order:
// g_mu, then a stream's mu, then a capture's nodes_mu, then an event's mu.
//
// Note [Cross-stream capture]
// As in CUDA, a capture forks to another stream when that stream waits on an
// event recorded in the capture: the stream joins the capture (its work is
// recorded into the same graph from then on) until the capture ends, and the
// capture joins it back when the origin stream waits on an event recorded on
// it after its last task. This is how the autograd engine's cross-stream
// synchronization (AccumulateGrad nodes on another stream) and fork/join code
// with wait_stream are captured. A graph is replayed as one sequence in the
// order the tasks were recorded, which is a valid order of the fork/join
// graph: a task recorded after a wait was submitted after the event's record,
// so after everything that record covers. At the end every joined stream's
// last task must be ordered before the origin's end, through events
// (transitively: `known` is a vector clock over node counts), else the capture
// fails with vnpuErrorStreamCaptureUnjoined, as cudaStreamEndCapture does.
#include "internal.h"

#include <fstream>
#include <sstream>

struct vnpuGraph_st {
  int device = 0;
  std::vector<std::pair<std::string, vnpuKernel_t>> nodes;
  std::vector<vnpu::rt::san::GraphAccess> san_accesses;  // Note [Sanitizer and graphs] (sanitizer.cpp)
  std::vector<std::pair<const void*, size_t>> san_uploads;  // pinned sources of captured uploads
};

struct vnpuGraphExec_st {
  int device = 0;
  // Shared with queued launches, so the exec may be destroyed while they wait.
  std::shared_ptr<const std::vector<std::pair<std::string, vnpuKernel_t>>> nodes;
  std::vector<vnpu::rt::san::GraphAccess> san_accesses;
  std::vector<std::pair<const void*, size_t>> san_uploads;
};

namespace vnpu::rt {

std::atomic<int> g_captures_underway{0};

namespace {

std::mutex g_mu;                                  // guards g_live and every Capture::invalidated_by
std::vector<std::shared_ptr<Capture>> g_live;    // captures begun and not ended
std::atomic<uint64_t> g_next_id{1};
thread_local vnpuStreamCaptureMode t_mode = vnpuStreamCaptureModeGlobal;

const char* kAfterRefusal =
    " The capture is invalidated: ending it raises (vnpuStreamEndCapture returns "
    "vnpuErrorStreamCaptureInvalidated); the stream, the device and other tensors are unaffected.";

void invalidate_locked(Capture& c, const std::string& why) {
  if (!c.invalidated.exchange(true)) c.invalidated_by = why;
}

std::string refusal_message(const std::string& what) {
  return what + "." + kAfterRefusal;
}

}  // namespace

std::shared_ptr<Capture> capture_of(vnpuStream_st* s) {
  if (!any_capture()) return nullptr;
  std::lock_guard<std::mutex> lk(s->mu);
  return s->capture;
}

void invalidate_capture(Capture& c, const std::string& why) {
  std::lock_guard<std::mutex> g(g_mu);
  invalidate_locked(c, why);
}

vnpuError_t refuse_on_capture(Capture& c, vnpuError_t err, const std::string& what) {
  std::string msg = refusal_message(what);
  invalidate_capture(c, msg);
  set_last_error_message(std::move(msg));
  return err;
}

void capture_record_event(const std::shared_ptr<Capture>& c, vnpuStream_st* s, vnpuEvent_st* event) {
  std::unordered_map<vnpuStream_st*, size_t> known;
  {
    std::lock_guard<std::mutex> nl(c->nodes_mu);
    known = c->known[s];
    auto it = c->last_node.find(s);
    known[s] = it == c->last_node.end() ? 0 : it->second;
  }
  std::lock_guard<std::mutex> g(event->mu);
  event->captured_in = c;
  event->captured_known = std::move(known);
}

vnpuError_t capture_wait_event(const std::shared_ptr<Capture>& c, vnpuStream_st* s, vnpuEvent_st* event) {
  std::lock_guard<std::mutex> g(g_mu);
  {
    std::lock_guard<std::mutex> lk(s->mu);
    if (!s->capture) {
      if (s->device != c->device) {
        const std::string msg = refusal_message(
            "a stream of another device waits on an event recorded in a capture (a graph runs on one device)");
        invalidate_locked(*c, msg);
        set_last_error_message(msg);
        return vnpuErrorStreamCaptureIsolation;
      }
      s->capture = c;  // the fork: s joins the capture
      c->joined.push_back(s);
    } else if (s->capture != c) {
      const std::string msg = refusal_message(
          "a stream capturing one graph waits on an event recorded in another graph's capture (captures cannot "
          "merge); end one capture before the other waits on its work");
      invalidate_locked(*c, msg);
      invalidate_locked(*s->capture, msg);
      set_last_error_message(msg);
      return vnpuErrorStreamCaptureIsolation;
    }
  }
  std::unordered_map<vnpuStream_st*, size_t> from;
  {
    std::lock_guard<std::mutex> ev(event->mu);
    from = event->captured_known;
  }
  std::lock_guard<std::mutex> nl(c->nodes_mu);
  auto& mine = c->known[s];
  for (const auto& [stream, n] : from) mine[stream] = std::max(mine[stream], n);
  return vnpuSuccess;
}

vnpuError_t check_device_not_capturing(int device, const char* what) {
  if (!any_capture()) return vnpuSuccess;
  std::lock_guard<std::mutex> g(g_mu);
  std::string msg;
  for (auto& c : g_live) {
    if (c->device != device) continue;
    if (msg.empty()) {
      msg = refusal_message(std::string(what) + " waits for every stream of vnpu:" + std::to_string(device) +
                            ", one of which is capturing a graph (a host synchronization: move it before the "
                            "capture begins or after it ends)");
    }
    invalidate_locked(*c, msg);
  }
  if (msg.empty()) return vnpuSuccess;
  set_last_error_message(std::move(msg));
  return vnpuErrorStreamCaptureUnsupported;
}

vnpuError_t check_unsafe_call(const char* what) {
  if (!any_capture() || t_mode == vnpuStreamCaptureModeRelaxed) return vnpuSuccess;
  const auto self = std::this_thread::get_id();
  std::lock_guard<std::mutex> g(g_mu);
  std::string msg;
  for (auto& c : g_live) {
    const bool conflicts = c->mode == vnpuStreamCaptureModeGlobal ||
                           (c->mode == vnpuStreamCaptureModeThreadLocal && c->thread == self);
    if (!conflicts) continue;
    if (msg.empty()) {
      msg = refusal_message(std::string(what) +
                            " is potentially unsafe while a capture of mode global (any thread) or thread_local "
                            "(this thread) is underway: allocate or free device/pinned memory before the capture "
                            "begins, or capture with capture_error_mode=\"relaxed\"");
    }
    invalidate_locked(*c, msg);
  }
  if (msg.empty()) return vnpuSuccess;
  set_last_error_message(std::move(msg));
  return vnpuErrorStreamCaptureUnsupported;
}

}  // namespace vnpu::rt

using namespace vnpu::rt;

vnpuError_t vnpuStreamBeginCapture(vnpuStream_t stream, vnpuStreamCaptureMode mode) {
  if (mode < vnpuStreamCaptureModeGlobal || mode > vnpuStreamCaptureModeRelaxed) return vnpuErrorInvalidValue;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  auto c = std::make_shared<Capture>();
  c->id = g_next_id.fetch_add(1);
  c->device = s->device;
  c->stream = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  std::lock_guard<std::mutex> g(g_mu);
  {
    std::lock_guard<std::mutex> lk(s->mu);
    if (s->capture) {
      set_last_error_message("vnpuStreamBeginCapture: the stream is already capturing; end that capture first");
      return vnpuErrorIllegalState;
    }
    s->capture = c;
  }
  g_live.push_back(c);
  g_captures_underway.fetch_add(1);
  return vnpuSuccess;
}

vnpuError_t vnpuStreamEndCapture(vnpuStream_t stream, vnpuGraph_t* graph) {
  if (graph == nullptr) return vnpuErrorInvalidValue;
  *graph = nullptr;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  std::shared_ptr<Capture> c;
  {
    std::lock_guard<std::mutex> g(g_mu);
    {
      std::lock_guard<std::mutex> lk(s->mu);
      c = s->capture;
      if (!c) {
        set_last_error_message("vnpuStreamEndCapture: the stream is not capturing");
        return vnpuErrorIllegalState;
      }
      if (c->mode != vnpuStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
        const std::string msg =
            refusal_message("vnpuStreamEndCapture from a thread other than the one that began the capture "
                            "(mode global/thread_local; use capture_error_mode=\"relaxed\" to end it elsewhere)");
        invalidate_locked(*c, msg);
        set_last_error_message(msg);
        // The capture ends all the same, so that the stream is usable again (as CUDA does).
      }
      s->capture.reset();
    }
    for (vnpuStream_st* j : c->joined) {  // Note [Cross-stream capture]
      std::lock_guard<std::mutex> lk(j->mu);
      if (j->capture == c) j->capture.reset();
    }
    if (!c->invalidated) {
      std::lock_guard<std::mutex> nl(c->nodes_mu);
      const auto& origin = c->known[s];
      for (const auto& [j, last] : c->last_node) {
        if (j == s || last == 0) continue;
        auto it = origin.find(j);
        if (it == origin.end() || it->second < last) {
          std::ostringstream msg;
          msg << "vnpuStreamEndCapture: a stream that joined the capture (stream " << static_cast<const void*>(j)
              << ") has work the capturing stream never waited for: make the capturing stream wait on it "
                 "(wait_stream, or an event recorded on it after its last work) before the capture ends";
          set_last_error_message(msg.str());
          g_live.erase(std::find(g_live.begin(), g_live.end(), c));
          g_captures_underway.fetch_sub(1);
          c->ended = true;
          return vnpuErrorStreamCaptureUnjoined;
        }
      }
    }
    g_live.erase(std::find(g_live.begin(), g_live.end(), c));
    g_captures_underway.fetch_sub(1);
    c->ended = true;
    if (c->invalidated) {
      set_last_error_message("the graph capture on vnpu:" + std::to_string(c->device) +
                             " was invalidated by an earlier call, and nothing was captured. That call: " +
                             c->invalidated_by);
      return vnpuErrorStreamCaptureInvalidated;
    }
  }
  auto* gr = new vnpuGraph_st();
  gr->device = c->device;
  {
    std::lock_guard<std::mutex> nl(c->nodes_mu);  // late submitters finished appending
    gr->nodes = std::move(c->nodes);
    gr->san_accesses = std::move(c->san_accesses);
    gr->san_uploads = std::move(c->san_uploads);
  }
  *graph = gr;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamGetCaptureInfo(vnpuStream_t stream, vnpuStreamCaptureStatus* status,
                                     unsigned long long* id) {
  if (status == nullptr) return vnpuErrorInvalidValue;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  auto c = capture_of(s);
  *status = !c ? vnpuStreamCaptureStatusNone
               : (c->invalidated ? vnpuStreamCaptureStatusInvalidated : vnpuStreamCaptureStatusActive);
  if (id != nullptr) *id = c ? c->id : 0;
  return vnpuSuccess;
}

vnpuError_t vnpuStreamIsCapturing(vnpuStream_t stream, vnpuStreamCaptureStatus* status) {
  return vnpuStreamGetCaptureInfo(stream, status, nullptr);
}

vnpuError_t vnpuThreadExchangeStreamCaptureMode(vnpuStreamCaptureMode* mode) {
  if (mode == nullptr || *mode < vnpuStreamCaptureModeGlobal || *mode > vnpuStreamCaptureModeRelaxed)
    return vnpuErrorInvalidValue;
  std::swap(*mode, t_mode);
  return vnpuSuccess;
}

vnpuError_t vnpuGraphGetNodeCount(vnpuGraph_t graph, size_t* count) {
  if (graph == nullptr || count == nullptr) return vnpuErrorInvalidValue;
  *count = graph->nodes.size();
  return vnpuSuccess;
}

vnpuError_t vnpuGraphDebugDotPrint(vnpuGraph_t graph, const char* path) {
  if (graph == nullptr || path == nullptr) return vnpuErrorInvalidValue;
  std::ofstream out(path);
  if (!out) return vnpuErrorInvalidValue;
  out << "digraph vnpu_graph {\n  label=\"vnpu:" << graph->device << ", " << graph->nodes.size()
      << " nodes, run in order\";\n";
  for (size_t i = 0; i < graph->nodes.size(); ++i) {
    std::string label = graph->nodes[i].first;
    for (char& ch : label) if (ch == '"') ch = '\'';
    out << "  n" << i << " [label=\"" << i << ": " << label << "\"];\n";
    if (i > 0) out << "  n" << i - 1 << " -> n" << i << ";\n";
  }
  out << "}\n";
  return out ? vnpuSuccess : vnpuErrorInvalidValue;
}

vnpuError_t vnpuGraphDestroy(vnpuGraph_t graph) {
  if (graph == nullptr) return vnpuErrorInvalidValue;
  delete graph;
  return vnpuSuccess;
}

vnpuError_t vnpuGraphInstantiate(vnpuGraphExec_t* exec, vnpuGraph_t graph, unsigned long long flags) {
  if (exec == nullptr || graph == nullptr || flags != 0) return vnpuErrorInvalidValue;
  auto* x = new vnpuGraphExec_st();
  x->device = graph->device;
  x->nodes = std::make_shared<const std::vector<std::pair<std::string, vnpuKernel_t>>>(graph->nodes);
  x->san_accesses = graph->san_accesses;
  x->san_uploads = graph->san_uploads;
  *exec = x;
  return vnpuSuccess;
}

vnpuError_t vnpuGraphExecDestroy(vnpuGraphExec_t exec) {
  if (exec == nullptr) return vnpuErrorInvalidValue;
  delete exec;
  return vnpuSuccess;
}

vnpuError_t vnpuGraphLaunch(vnpuGraphExec_t exec, vnpuStream_t stream) {
  if (exec == nullptr) return vnpuErrorInvalidValue;
  if (vnpuError_t e = initialize(); e != vnpuSuccess) return e;
  vnpuStream_st* s = resolve(stream);
  if (s == nullptr) return vnpuErrorInvalidResourceHandle;
  if (s->device != exec->device) {
    set_last_error_message("vnpuGraphLaunch: the graph was captured on vnpu:" + std::to_string(exec->device) +
                           " and cannot run on a stream of vnpu:" + std::to_string(s->device));
    return vnpuErrorInvalidValue;
  }
  std::vector<std::shared_ptr<std::atomic<bool>>> ran;  // the replay's pinned uploads (Note [Pinned uploads])
  if (san::on()) {  // Note [Sanitizer and graphs] (sanitizer.cpp)
    if (vnpuError_t e = san::report_host_access(s, "vnpuGraphLaunch"); e != vnpuSuccess) return e;
    if (vnpuError_t e = san::begin_replay(s, exec->san_accesses); e != vnpuSuccess) return e;
    // Each replay reads the pinned sources anew: snapshotted at its position, as a queued upload is.
    if (auto c = capture_of(s)) {  // a graph launched inside a capture: the outer graph's replays check them
      std::lock_guard<std::mutex> nl(c->nodes_mu);
      c->san_uploads.insert(c->san_uploads.end(), exec->san_uploads.begin(), exec->san_uploads.end());
    } else if (!launch_blocking()) {
      for (const auto& [src, bytes] : exec->san_uploads)
        ran.push_back(san::note_upload(s, src, bytes, "memcpy HtoD (in a graph replay)"));
    }
  }
  auto submitted = s->submit("vnpuGraphLaunch", [nodes = exec->nodes, ran = std::move(ran)] {
    struct MarkRan {  // also when a node fails
      const std::vector<std::shared_ptr<std::atomic<bool>>>& flags;
      ~MarkRan() {
        for (const auto& f : flags) f->store(true);
      }
    } mark{ran};
    for (size_t i = 0; i < nodes->size(); ++i) {
      try {
        (*nodes)[i].second();
      } catch (const std::exception& e) {
        // The rest of the graph does not run (as a failed kernel ends a CUDA graph launch).
        throw std::runtime_error("graph node " + std::to_string(i) + " '" + (*nodes)[i].first + "': " + e.what());
      }
    }
  });
  return finish_submission(s, submitted);
}
