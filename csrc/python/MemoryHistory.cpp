#include "MemoryHistory.h"

#include "../core/VNPUAllocatorConfig.h"
#include "../core/VNPUCachingAllocator.h"

#include <pybind11/stl.h>
#include <torch/csrc/Export.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/profiler/unwind/unwind.h>

#include <Python.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

// From torch/csrc/profiler/python/combined_traceback.h (libtorch_python), declared here because that
// header includes nlohmann/json.hpp, which torch's wheel does not ship.
namespace torch {
TORCH_PYTHON_API std::vector<py::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace torch_vnpu {
namespace {

using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
namespace alloc = c10::vnpu::allocator;

// Python frames only on threads Python knows (the stream workers are not: they never wait for the
// GIL), and not while the interpreter shuts down.
bool python_thread() { return Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_GetThisThreadState() != nullptr; }

std::shared_ptr<c10::GatheredContext> gather_python() {
  return torch::CapturedTraceback::gather(python_thread(), /*script=*/true, /*cpp=*/false);
}
std::shared_ptr<c10::GatheredContext> gather_python_and_cpp() {
  return torch::CapturedTraceback::gather(python_thread(), /*script=*/true, /*cpp=*/true);
}

void check_option_in(const std::string& option, std::initializer_list<const char*> valid, const char* error) {
  for (const char* v : valid) {
    if (option == v) return;
  }
  TORCH_CHECK(false, error);
}

// As torch.cuda.memory._record_memory_history (its checks and messages).
void record_memory_history(std::optional<std::string> enabled, std::optional<std::string> context,
                           const std::string& stacks, size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions) {
  if (enabled) check_option_in(*enabled, {"state", "all"}, "expected state to be 'state', 'all', or None");
  if (context) {
    check_option_in(*context, {"state", "alloc", "all"},
                    "expected context to be 'state', 'alloc', 'all', or None");
  }
  check_option_in(stacks, {"python", "all"}, "expected stacks to be 'python', or 'all'");
  uint32_t skip = 0;
  for (const auto& a : skip_actions) skip |= 1u << c10::CachingDeviceAllocator::parseTraceEntryAction(a);
  c10::CachingDeviceAllocator::CreateContextFn recorder = gather_python;
  if (enabled && stacks == "all") {
    recorder = gather_python_and_cpp;
    torch::unwind::unwind();  // warm up C++ stack unwinding, as CUDA does
  }
  if (!enabled || *enabled != "all") max_entries = 1;  // "state": no history, as CUDA
  RecordContext when = RecordContext::NEVER;
  if (context == "all") {
    when = RecordContext::ALL;
  } else if (context == "alloc") {
    when = RecordContext::ALLOC;
  } else if (context == "state") {
    when = RecordContext::STATE;
  }
  py::gil_scoped_release no_gil;
  alloc::recordHistory(enabled.has_value(), recorder, max_entries, when, clear_history, skip);
}

const char* action_name(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::ALLOC: return "alloc";
    case TraceEntry::FREE_REQUESTED: return "free_requested";
    case TraceEntry::FREE_COMPLETED: return "free_completed";
    case TraceEntry::SEGMENT_ALLOC: return "segment_alloc";
    case TraceEntry::SEGMENT_FREE: return "segment_free";
    case TraceEntry::SEGMENT_MAP: return "segment_map";
    case TraceEntry::SEGMENT_UNMAP: return "segment_unmap";
    case TraceEntry::SNAPSHOT: return "snapshot";
    case TraceEntry::OOM: return "oom";
  }
  return "unknown";
}

// Fills "frames" of every dict that has a context, symbolizing them all at once (frames shared
// between entries are symbolized once, as CUDA's snapshot does).
class FrameFiller {
 public:
  void add(py::dict d, const std::shared_ptr<c10::GatheredContext>& ctx, bool always) {
    if (ctx) {
      tracebacks_.push_back(torch::getCapturedTracebackFromContext(ctx));
      dicts_.push_back(std::move(d));
    } else if (always) {
      d["frames"] = py::list();
    }
  }
  void fill() {
    auto frames = torch::py_symbolize(tracebacks_);
    for (size_t i = 0; i < frames.size(); ++i) dicts_[i]["frames"] = frames[i];
  }

 private:
  std::vector<torch::CapturedTraceback*> tracebacks_;
  std::vector<py::dict> dicts_;
};

int64_t stream_int(const void* s) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(s)); }

py::list segments_list(const std::vector<c10::CachingDeviceAllocator::SegmentInfo>& segments, FrameFiller& ff) {
  py::list out;
  for (const auto& seg : segments) {
    py::dict d;
    d["device"] = seg.device;
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = stream_int(seg.stream);
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(seg.owner_private_pool_id.first, seg.owner_private_pool_id.second);
    d["is_expandable"] = seg.is_expandable;
    ff.add(d, seg.context_when_allocated, /*always=*/true);
    py::list blocks;
    size_t addr = seg.address;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = addr;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated" : (b.active ? "active_pending_free" : "inactive");
      ff.add(bd, b.context_when_allocated, /*always=*/true);
      blocks.append(bd);
      addr += b.size;
    }
    d["blocks"] = blocks;
    out.append(d);
  }
  return out;
}

alloc::SnapshotInfo take_snapshot() {
  py::gil_scoped_release no_gil;  // the allocator's locks never wait for the GIL; we must not hold it there
  return alloc::snapshot();
}

py::list memory_snapshot_segments() {
  auto snap = take_snapshot();
  FrameFiller ff;
  py::list segments = segments_list(snap.segments, ff);
  ff.fill();
  return segments;
}

py::dict allocator_settings() {
  const auto& cfg = alloc::config();
  py::dict s;
  if (!cfg.source.empty()) {
    const char* value = std::getenv(cfg.source.c_str());
    s[py::str(cfg.source)] = value != nullptr ? value : "";
  }
  s["max_split_size"] = cfg.max_split_size == std::numeric_limits<size_t>::max()
                            ? int64_t{-1} : static_cast<int64_t>(cfg.max_split_size);
  s["garbage_collection_threshold"] = cfg.garbage_collection_threshold;
  s["expandable_segments"] = cfg.expandable_segments;
  py::dict roundup;
  size_t key = 1;
  for (size_t v : cfg.roundup_power2_divisions) {
    roundup[py::str(std::to_string(key))] = v;
    key *= 2;
  }
  s["roundup_power2_divisions"] = roundup;
  return s;
}

// The dict of torch.cuda.memory._snapshot(): segments, device_traces, allocator_settings.
py::dict memory_snapshot_full() {
  auto snap = take_snapshot();
  FrameFiller ff;
  py::dict result;
  result["segments"] = segments_list(snap.segments, ff);
  py::list traces;
  for (const auto& device_trace : snap.device_traces) {
    py::list trace;
    for (const auto& te : device_trace) {
      py::dict e;
      e["action"] = action_name(te.action_);
      e[te.action_ == TraceEntry::OOM ? "device_free" : "addr"] = te.addr_;
      e["size"] = te.size_;
      e["stream"] = stream_int(te.stream_);
      e["time_us"] = static_cast<int64_t>(te.time_.t_);
      ff.add(e, te.context_, /*always=*/false);
      trace.append(e);
    }
    traces.append(trace);
  }
  result["device_traces"] = traces;
  result["allocator_settings"] = allocator_settings();
  ff.fill();
  return result;
}

void attach_out_of_memory_observer(py::object observer) {
  TORCH_CHECK_TYPE(PyCallable_Check(observer.ptr()), "observer must be callable, but got ",
                   py::str(py::type::of(observer)).cast<std::string>());
  // Kept for the life of the process, as CUDA's (observers cannot be detached).
  auto* obs = new py::object(std::move(observer));
  alloc::attachOutOfMemoryObserver([obs](int64_t device, int64_t alloc_bytes, int64_t total, int64_t free_bytes) {
    py::gil_scoped_acquire gil;
    (*obs)(device, alloc_bytes, total, free_bytes);
  });
}

}  // namespace

void bind_memory_history(py::module& m) {
  m.def("_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"), py::arg("skip_actions"));
  m.def("_is_history_enabled", [] { return alloc::isHistoryEnabled(); });
  m.def("_memory_snapshot", &memory_snapshot_segments);
  m.def("_memory_snapshot_full", &memory_snapshot_full);
  m.def("_attach_out_of_memory_observer", &attach_out_of_memory_observer);
}

}  // namespace torch_vnpu
