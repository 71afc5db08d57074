// See Sanitizer.h. Reports: Note [Sanitizer reports].
#include "Sanitizer.h"

#include "../core/VNPUCachingAllocator.h"
#include "../core/VNPUException.h"
#include "../core/VNPUStream.h"
#include "../ops/HostOpenMP.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <Python.h>

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <sstream>
#include <vector>

namespace py = pybind11;

// From torch/csrc/profiler/python/combined_traceback.h (libtorch_python); see csrc/python/MemoryHistory.cpp.
namespace torch {
TORCH_PYTHON_API std::vector<py::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace at::vnpu::sanitizer {
namespace {

thread_local const char* t_op = nullptr;

// Where a block was allocated: the op running then and the Python stack.
struct AllocationSite : c10::GatheredContext {
  std::string op;
  std::shared_ptr<torch::CapturedTraceback> stack;
};

bool python_thread() { return Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_GetThisThreadState() != nullptr; }

std::shared_ptr<c10::GatheredContext> record_site() {
  auto site = std::make_shared<AllocationSite>();
  site->op = t_op != nullptr ? t_op : "";
  if (python_thread()) site->stack = torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
  return site;
}

// The Python class torch_vnpu.sanitizer.<name> (RuntimeError if it cannot be imported). Called with the GIL.
PyObject* python_error_type(const char* name) {
  PyObject* mod = PyImport_ImportModule("torch_vnpu.sanitizer");
  if (mod == nullptr) {
    PyErr_Clear();
    return PyExc_RuntimeError;
  }
  PyObject* t = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  if (t == nullptr) {
    PyErr_Clear();
    return PyExc_RuntimeError;
  }
  return t;  // kept for the process
}

// Not c10::Error: torch's CATCH_CORE_ERRORS maps PyTorchError to its python_type().
struct StreamRaceError : torch::PyTorchError {
  using PyTorchError::PyTorchError;
  PyObject* python_type() override {
    static PyObject* t = python_error_type("StreamRaceError");
    return t;
  }
};
struct UseAfterFreeError : torch::PyTorchError {
  using PyTorchError::PyTorchError;
  PyObject* python_type() override {
    static PyObject* t = python_error_type("UseAfterFreeError");
    return t;
  }
};
struct HostAccessError : torch::PyTorchError {
  using PyTorchError::PyTorchError;
  PyObject* python_type() override {
    static PyObject* t = python_error_type("HostAccessError");
    return t;
  }
};

thread_local int t_host_kernel_depth = 0;  // HostKernelGuard nesting

std::string stream_name(vnpuStream_t s) {
  if (s == nullptr) return "the host";
  int dev = 0;
  vnpuStreamGetDevice(s, &dev);
  const c10::StreamId id = c10::vnpu::streamIdOf(static_cast<c10::DeviceIndex>(dev), s);
  std::ostringstream o;
  if (id == 0) o << "the default stream of vnpu:" << dev;
  else o << "<torch.vnpu.Stream device=vnpu:" << dev << " stream_id=" << id << ">";
  return o.str();
}

// The innermost frames outside torch and torch_vnpu (the user's code), innermost last.
std::string format_stack(const std::shared_ptr<torch::CapturedTraceback>& tb) {
  if (!tb || !Py_IsInitialized() || _Py_IsFinalizing()) return "";
  py::gil_scoped_acquire gil;
  std::vector<torch::CapturedTraceback*> v{tb.get()};
  std::vector<std::string> lines;
  try {
    auto frames = torch::py_symbolize(v);
    if (frames.empty()) return "";
    for (const py::handle f : frames[0]) {
      std::string file = py::str(f["filename"]);
      if (file.find("/torch/") != std::string::npos || file.find("/torch_vnpu/") != std::string::npos) continue;
      lines.push_back("    " + file + ":" + std::string(py::str(f["line"])) + " in " + std::string(py::str(f["name"])));
      if (lines.size() == 6) break;
    }
  } catch (const py::error_already_set&) {
    return "";
  }
  std::reverse(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::string dtype_name(c10::ScalarType t) {
  std::string s = c10::toString(t);  // "Float"
  if (s == "Float") return "torch.float32";
  if (s == "Double") return "torch.float64";
  if (s == "Half") return "torch.float16";
  if (s == "BFloat16") return "torch.bfloat16";
  if (s == "Long") return "torch.int64";
  if (s == "Int") return "torch.int32";
  if (s == "Bool") return "torch.bool";
  return "torch." + s;
}

// Note [Sanitizer reports]
// One paragraph each: what the refused op does to which tensor, what the
// earlier unordered access was, then the tensor's allocation site, then the
// fix. Python stacks are symbolized only here (gathered cheaply at allocation).
// The allocation site of the live block starting at `base`, as " by 'op' at:\n<stack>" (or "").
std::string allocation_site(int device, const void* base) {
  auto ctx = c10::vnpu::allocator::sanitizerContext(static_cast<c10::DeviceIndex>(device), base);
  auto* site = dynamic_cast<AllocationSite*>(ctx.get());
  if (site == nullptr) return "";
  const std::string stack = format_stack(site->stack);
  return (site->op.empty() ? std::string() : " by '" + site->op + "'") +
         (stack.empty() ? std::string(".") : " at:\n" + stack);
}

// Check 4: host code touched device memory (Note [Protection keys], runtime host_access.cpp).
const char kAtExit[] = "<at exit>";  // check_pending(true)'s op

// Where a kept report surfaces: the call that returned it, or the exit.
std::string pointer_text(const void* p) {
  std::ostringstream o;
  o << p;
  return o.str();
}

std::string reported_where(const char* op, const vnpuSanitizerReport& r) {
  if (op == kAtExit) return "at exit, after the program's last vnpu call";
  const char* name = op != nullptr ? op : r.name.c_str();
  return std::string("at the next vnpu call, '") + name + "'" +
         (r.stream != nullptr ? " on " + stream_name(r.stream) : std::string());
}

std::string describe_host_access(const char* op, const vnpuSanitizerReport& r) {
  std::ostringstream m;
  vnpuPointerAttributes attr{};
  vnpuPointerGetAttributes(&attr, r.ptr);
  const int dev = attr.device >= 0 ? attr.device : 0;
  m << "vNPU sanitizer: host access to device memory: host code " << (r.write ? "wrote" : "read") << " vnpu:" << dev
    << " memory directly at " << r.ptr << ", on thread " << r.host_thread;
  if (r.host_thread_name[0] != '\0') m << " ('" << r.host_thread_name << "')";
  void* base = nullptr;
  size_t size = 0;
  std::string site;
  if (r.freed_since) {
    // The memory was allocated again between the access and this report: the tensor there now is not the one.
    m << ", in device memory that no live tensor owned at the access (a freed tensor's: a use after free through "
         "a kept data_ptr()); the caching allocator has since handed it to a tensor allocated after the access";
  } else if (c10::vnpu::allocator::blockContaining(static_cast<c10::DeviceIndex>(dev), r.ptr, &base, &size)) {
    m << ", inside the tensor memory of " << size << " bytes at " << base << " (byte offset "
      << (static_cast<const char*>(r.ptr) - static_cast<const char*>(base)) << ")";
    site = allocation_site(dev, base);
  } else {
    m << ", in device memory that no live tensor owns: memory in the caching allocator's cache (freed: a use after "
         "free through a kept data_ptr(), or never handed out)";
  }
  m << ". On a real accelerator device memory is not host memory: host code that dereferences a vnpu data_ptr() "
       "(ctypes, numpy over the pointer, torch.from_blob on the CPU, a C extension) crashes or reads garbage there.";
  while (!site.empty() && site.back() == '\n') site.pop_back();
  if (!site.empty()) m << "\nThe tensor was allocated" << site;
  m << "\nThe access was carried out (" << r.host_pages << " page" << (r.host_pages == 1 ? "" : "s")
    << " of device memory touched by host code since the last report) and is reported " << reported_where(op, r)
    << ".";
  m << "\nFix: copy to the host first (t.cpu(), t.to(\"cpu\"), t.cpu().numpy(), t.tolist()) and write results back "
       "with t.copy_(cpu_tensor), or use torch operations on the vnpu tensor itself; never hand a vnpu data_ptr() "
       "to host code.";
  return m.str();
}

// Where `ctx` (an AllocationSite) was gathered, as " by 'op' at:\n<stack>" (or ".").
std::string site_of(const std::shared_ptr<c10::GatheredContext>& ctx) {
  auto* site = dynamic_cast<AllocationSite*>(ctx.get());
  if (site == nullptr) return "";
  const std::string stack = format_stack(site->stack);
  std::string out = (site->op.empty() ? std::string() : " by '" + site->op + "'") +
                    (stack.empty() ? std::string(".") : " at:\n" + stack);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// A free checked like a write (Note [Frees without record_stream], runtime sanitizer.cpp), reported later.
std::string describe_free_race(const char* op, const vnpuSanitizerReport& r) {
  std::shared_ptr<c10::GatheredContext> allocated, dropped;
  c10::vnpu::allocator::takeSanitizerFreeRace(&allocated, &dropped);
  const std::string freer = stream_name(r.freed_on), there = stream_name(r.other_stream);
  std::ostringstream m;
  const bool recorded = r.recorded_on != nullptr;  // Note [Frees with record_stream]
  const std::string reuse = recorded ? "once " + stream_name(r.recorded_on) + " passes the free" : "at once";
  m << "vNPU sanitizer: stream race at a free: the tensor memory of " << r.bytes << " bytes at " << r.ptr
    << " was freed on " << freer
    << (recorded ? " (its tensor dropped after record_stream on " + stream_name(r.recorded_on) + " only)"
                 : std::string(" (its tensor dropped without record_stream)"))
    << " while '" << r.other_name << "' on " << there << " (its task #" << r.other_position << ") "
    << (r.other_write ? "writes" : "reads") << " it, and nothing orders that stream before the free ("
    << (recorded ? "no record_stream on it" : "no record_stream") << ", event, wait_stream or synchronize). "
    << "The caching allocator hands the memory to the next allocation on " << freer << " " << reuse
    << ", which overwrites it while " << there
    << " may still use it. This is reported by ordering, not timing: on a real accelerator the result depends on "
       "which stream runs first.";
  const std::string a = site_of(allocated), d = site_of(dropped);
  if (!a.empty()) m << "\nThe tensor was allocated" << a;
  if (!d.empty()) m << "\nIt was freed" << d;
  m << "\nA free cannot raise: this is reported " << reported_where(op, r) << ". The sanitizer poisons the freed memory only after the work " << there << " had queued at the free.";
  m << "\nFix: call t.record_stream(s) "
    << (r.other_stream != nullptr ? "with s = " + there : std::string("for the side stream s")) << " before dropping the tensor t (the caching allocator "
       "then waits for s before reusing the memory), or keep t alive until s's work is done (s.synchronize(), or an "
       "event recorded on s that "
    << freer << " waits for before the tensor is dropped).";
  return m.str();
}

// Host code rewrote the source of a queued upload (Note [Pinned uploads], runtime sanitizer.cpp).
std::string describe_pinned_rewrite(const char* op, const vnpuSanitizerReport& r) {
  const std::string there = stream_name(r.other_stream);
  std::ostringstream m;
  m << "vNPU sanitizer: stream race on pinned memory: host code rewrote the pinned host memory of " << r.bytes
    << " bytes at " << r.ptr << " (first changed byte at offset " << r.host_offset << ") that '" << r.other_name
    << "' on " << there << " (its task #" << r.other_position
    << "), a non_blocking copy to the device queued from it, reads, before the host waited for that copy. The "
       "device gets the old or the new bytes depending on which runs first (a staging buffer refilled for the next "
       "batch while the previous upload is still queued).";
  m << "\nFound at the host's first wait ordered after the copy and reported " << reported_where(op, r) << ".";
  m << "\nFix: wait for the copy before the host writes the buffer again (s.synchronize() for the copying stream "
       "s, or e = torch.vnpu.Event(); e.record(s) after the copy and e.synchronize() before the write), or give each "
       "batch in flight its own pinned tensor (the pinned memory allocator reuses a block only after the copies that "
       "used it are done).";
  return m.str();
}

std::string describe(vnpuError_t err, const char* op, const Accesses* accesses, const vnpuSanitizerReport& r) {
  if (err == vnpuErrorHostAccess) return describe_host_access(op, r);
  if (r.deferred == 1) return describe_free_race(op, r);
  if (r.deferred == 2) return describe_pinned_rewrite(op, r);
  std::ostringstream m;
  const std::string here = stream_name(r.stream), there = stream_name(r.other_stream);
  std::string tensor = "device memory";
  const Accesses::Desc* d = accesses != nullptr && r.access < accesses->size() ? &accesses->desc(r.access) : nullptr;
  if (d != nullptr) {
    std::ostringstream t;
    if (d->dtype != c10::ScalarType::Undefined) {
      t << "the tensor of shape " << c10::IntArrayRef(d->sizes) << " and dtype " << dtype_name(d->dtype);
    } else {
      t << "the memory";
    }
    t << " passed as " << d->what;
    tensor = t.str();
  }
  // No declaration at hand (a graph replay, a runtime call): the live block holding the range.
  void* block_base = nullptr;
  size_t block_size = 0;
  int block_device = -1;
  if (d == nullptr) {
    vnpuPointerAttributes attr{};
    if (vnpuPointerGetAttributes(&attr, r.ptr) == vnpuSuccess && attr.device >= 0 &&
        c10::vnpu::allocator::blockContaining(static_cast<c10::DeviceIndex>(attr.device), r.ptr, &block_base,
                                              &block_size)) {
      block_device = attr.device;
      std::ostringstream t;
      t << "the tensor memory of " << block_size << " bytes at " << block_base;
      tensor = t.str();
    }
  }
  const char* name = op != nullptr ? op : r.name.c_str();
  if (err == vnpuErrorUseAfterFree) {
    m << "vNPU sanitizer: use after free: '" << name << "' on " << here << (r.write ? " writes " : " reads ") << tensor
      << " (" << r.bytes << " bytes at " << r.ptr << "), memory the caching allocator took back (freed on "
      << stream_name(r.freed_on) << ") and has not handed out again.";
    if (!r.other_name.empty()) m << " Its last writer was '" << r.other_name << "' on " << there << ".";
    int dev = d != nullptr ? d->device : -1;
    if (dev < 0) {
      vnpuPointerAttributes attr{};
      if (vnpuPointerGetAttributes(&attr, r.ptr) == vnpuSuccess) dev = attr.device;
    }
    const std::string a =
        dev >= 0 ? site_of(c10::vnpu::allocator::sanitizerFreedContext(static_cast<c10::DeviceIndex>(dev), r.ptr))
                 : std::string();
    if (!a.empty()) m << "\nThe freed tensor was allocated" << a;
    m << "\nFreed device memory is poisoned (NaN for floating dtypes, 0xFF bytes otherwise). Fix: keep the tensor "
         "alive while work that uses it is queued; never keep a data_ptr() or a kernel argument past the tensor's "
         "lifetime.";
    return m.str();
  }
  // The access's own range, unless the block named above is exactly it.
  const bool whole_block = block_device >= 0 && block_base == r.ptr && block_size == r.bytes;
  const std::string range =
      whole_block ? std::string() : " (" + std::to_string(r.bytes) + " bytes at " + pointer_text(r.ptr) + ")";
  m << "vNPU sanitizer: stream race: '" << name << "' on " << here << (r.write ? " writes " : " reads ") << tensor
    << range << ", which '" << r.other_name << "' on " << there << " (its task #"
    << r.other_position << ") " << (r.other_write ? "writes" : "reads")
    << ", and nothing orders the two (no wait_stream, synchronize, or event recorded on " << there
    << " after that task and waited for before this op: an event recorded earlier does not cover it). This is "
       "reported by ordering, not timing: on a real accelerator the result depends on which stream runs first.";
  // Freed by the stream that made the earlier access: a legal free, the block handed out again on that same
  // stream (per-stream pools); the tensor this op uses belongs to that stream, which it did not wait for.
  const bool reused_on_other = r.freed_since && r.freed_on != nullptr && r.freed_on == r.other_stream;
  if (reused_on_other) {
    m << "\nThe memory was freed since that access (on " << there << ", in its order) and handed out again on "
      << there << ": the tensor this op uses was allocated there, after work of " << there
      << " on the same memory that may still be running.";
  } else if (r.freed_since) {
    m << "\nThe memory was freed since that access and handed out again: the tensor that " << there
      << " used was dropped while that stream could still be using it.";
  }
  if (d != nullptr && d->base != nullptr) {
    auto ctx = c10::vnpu::allocator::sanitizerContext(static_cast<c10::DeviceIndex>(d->device), d->base);
    if (auto* site = dynamic_cast<AllocationSite*>(ctx.get())) {
      m << "\nThe tensor was allocated" << (site->op.empty() ? std::string() : " by '" + site->op + "'");
      const std::string stack = format_stack(site->stack);
      m << (stack.empty() ? std::string(".") : " at:\n" + stack);
    }
  } else if (block_device >= 0) {
    std::string site = allocation_site(block_device, block_base);
    while (!site.empty() && site.back() == '\n') site.pop_back();
    if (!site.empty()) m << "\nThe tensor was allocated" << site << "\n";
  }
  m << "\nFix: ";
  if (reused_on_other && r.stream != nullptr) {
    int dev = 0;
    vnpuStreamGetDevice(r.stream, &dev);
    m << "a tensor allocated on one stream and used on another needs that other stream to wait first: "
      << "torch.vnpu.current_stream(" << dev << ").wait_stream(s) with s = " << there << " before this op (or an "
      << "event recorded on s and waited for), as on CUDA.";
  } else if (r.freed_since) {
    m << "call t.record_stream(s) for the side stream s before dropping the tensor t (the caching allocator then "
         "waits for s before reusing the memory), or keep t alive until s's work is done (s.synchronize(), or an "
         "event recorded on s that the allocating stream waits for).";
  } else if (r.stream == nullptr) {
    m << "this op runs on the host after synchronizing the current stream only: make the current stream wait for "
      << there << " first (torch.vnpu.current_stream().wait_stream(s), or an event), or synchronize it (s.synchronize(), "
      << "torch.vnpu.synchronize()).";
  } else if (r.other_stream == nullptr) {
    m << "host work and stream work are ordered by program order: this should not happen; please report it.";
  } else if (r.other_write) {
    // Name the waiting stream's device: a peer copy runs on the destination device's stream, which need not
    // be the current device's.
    int dev = 0;
    vnpuStreamGetDevice(r.stream, &dev);
    const std::string waiter = "torch.vnpu.current_stream(" + std::to_string(dev) + ")";
    m << "make " << here << " wait for the producer before this op: where that stream is current (inside its "
      << "`with torch.vnpu.stream(...)` block, before this op), " << waiter << ".wait_stream(s) with s = " << there
      << ", or e = torch.vnpu.Event(); e.record(s); " << waiter << ".wait_event(e).";
  } else {
    m << "this op overwrites memory " << there << " may still be reading: make " << here
      << " wait for that stream first (wait_stream or an event), and if the tensor changes hands between streams, "
         "call t.record_stream(s) before dropping it.";
  }
  return m.str();
}

void raise_from_check(vnpuError_t err, const char* op) { raise(err, op, nullptr); }

}  // namespace

std::atomic<int> g_enabled{-1};

bool enabled_slow() {
  const bool on = vnpuSanitizerIsEnabled() != 0;
  if (vnpuIsInitialized()) g_enabled.store(on ? 1 : 0, std::memory_order_relaxed);
  return on;
}

// Note [Strided accesses] (runtime sanitizer.cpp): a view whose elements form equally spaced rows (a
// slice of a contiguous tensor along one dimension, a 2-D box, a column) is declared as those rows, so
// streams writing disjoint interleaved slices of one tensor do not conflict. Contiguous views, and
// views more complex than rows (3-level boxes, negative strides, x[::2, ::2]), are declared as their span.
void Accesses::add(const void* base, size_t storage_nbytes, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t storage_offset, c10::ScalarType dtype, int device, bool write, std::string what) {
  if (base == nullptr) return;
  int64_t lo = 0, hi = 0, numel = 1;
  bool simple = true;  // no negative stride
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return;
    numel *= sizes[i];
    const int64_t span = (sizes[i] - 1) * strides[i];
    (span < 0 ? lo : hi) += span;
    if (span < 0) simple = false;
  }
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t first = (storage_offset + lo) * item, last = (storage_offset + hi + 1) * item;
  first = std::max<int64_t>(first, 0);
  last = std::min<int64_t>(last, static_cast<int64_t>(storage_nbytes));
  if (last <= first) return;
  vnpuMemAccess a{static_cast<const char*>(base) + first, static_cast<size_t>(last - first), write ? 1 : 0};
  // Rows: the dims that matter (size > 1, stride != 0), outermost first, adjacent ones merged.
  if (simple && numel > 1 && last - first > numel * item) {  // not dense: maybe rows
    int64_t dim_size[2], dim_stride[2];
    int n = 0;
    c10::SmallVector<std::pair<int64_t, int64_t>, 8> dims;  // (stride, size)
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] > 1 && strides[i] != 0) dims.emplace_back(strides[i], sizes[i]);
    }
    std::sort(dims.begin(), dims.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    for (const auto& [st, sz] : dims) {
      if (n > 0 && dim_stride[n - 1] == sz * st) {  // the previous (outer) dim continues this one
        dim_size[n - 1] *= sz;
        dim_stride[n - 1] = st;
      } else if (n == 2) {
        n = 3;  // more than rows: the span
        break;
      } else {
        dim_size[n] = sz;
        dim_stride[n++] = st;
      }
    }
    int64_t row = 0, period = 0;
    if (n == 1 && dim_stride[0] > 1) {  // single elements, equally spaced
      row = item;
      period = dim_stride[0] * item;
    } else if (n == 2 && dim_stride[1] == 1 && dim_size[1] < dim_stride[0]) {  // rows of contiguous elements
      row = dim_size[1] * item;
      period = dim_stride[0] * item;
    }
    if (row > 0 && first == (storage_offset + lo) * item) {
      a.row_bytes = static_cast<size_t>(row);
      a.row_stride = static_cast<size_t>(period);
    }
  }
  acc_.push_back(a);
  desc_.push_back({base, sizes.vec(), dtype, device, std::move(what)});
}

void Accesses::add_raw(const void* ptr, size_t bytes, int device, bool write, std::string what) {
  if (ptr == nullptr || bytes == 0) return;
  acc_.push_back({ptr, bytes, write ? 1 : 0});
  desc_.push_back({nullptr, {}, c10::ScalarType::Undefined, device, std::move(what)});
}

void launch_checked(vnpuStream_t stream, const char* name, vnpuKernel_t kernel, const Accesses& accesses) {
  const vnpuError_t e = vnpuLaunchKernelWithAccesses(stream, name, std::move(kernel), accesses.data(), accesses.size());
  if (e == vnpuErrorStreamRace || e == vnpuErrorUseAfterFree || e == vnpuErrorHostAccess) raise(e, name, &accesses);
  VNPU_CHECK(e);
}

void host_access(const char* name, const Accesses& accesses) {
  const vnpuError_t e = vnpuSanitizerHostAccess(name, accesses.data(), accesses.size());
  if (e == vnpuErrorStreamRace || e == vnpuErrorUseAfterFree || e == vnpuErrorHostAccess) raise(e, name, &accesses);
  VNPU_CHECK(e);
}

namespace {
// The memory of the errors raised so far (bounded): at exit, a pending report on the same memory is the
// consequence of one of them (the racing tensor freed unordered when the program stopped), not a new bug.
// Allocations, not addresses: memory handed to a new tensor since is a new bug's.
std::mutex g_raised_mu;
std::vector<uint64_t> g_raised;  // allocation epochs (vnpuSanitizerAllocationEpoch)
constexpr size_t kMaxRaised = 256;

bool concerns_raised(const void* ptr) {
  const uint64_t epoch = vnpuSanitizerAllocationEpoch(ptr);
  if (epoch == 0) return false;
  std::lock_guard<std::mutex> g(g_raised_mu);
  return std::find(g_raised.begin(), g_raised.end(), epoch) != g_raised.end();
}
}  // namespace

void raise(vnpuError_t err, const char* op, const Accesses* accesses) {
  vnpuSanitizerReport r;
  vnpuSanitizerGetLastReport(&r);
  if (const uint64_t epoch = vnpuSanitizerAllocationEpoch(r.ptr); epoch != 0) {
    std::lock_guard<std::mutex> g(g_raised_mu);
    if (g_raised.size() < kMaxRaised) g_raised.push_back(epoch);
  }
  std::string msg = describe(err, op, accesses, r);
  if (err == vnpuErrorUseAfterFree) throw UseAfterFreeError(std::move(msg));
  if (err == vnpuErrorHostAccess) throw HostAccessError(std::move(msg));
  throw StreamRaceError(std::move(msg));
}

void check_pending(bool at_exit) {
  const vnpuError_t e = vnpuSanitizerCheckHostAccess();
  if (e == vnpuErrorHostAccess || e == vnpuErrorStreamRace || e == vnpuErrorUseAfterFree) {
    if (at_exit) {
      vnpuSanitizerReport r;
      vnpuSanitizerGetLastReport(&r);
      if (concerns_raised(r.ptr)) return;  // the consequence of an error already raised
    }
    raise(e, at_exit ? kAtExit : nullptr, nullptr);
  }
  VNPU_CHECK(e);
}

bool host_access_check() { return enabled() && vnpuSanitizerHostAccessCheckEnabled(nullptr) != 0; }

HostKernelGuard::HostKernelGuard() {
  if (!host_access_check()) return;
  active_ = true;
  if (t_host_kernel_depth++ == 0) {
    vnpuSanitizerDeviceAccessBegin();
    release_host_openmp_pool();  // the kernel's helpers are created with the access
  }
}

HostKernelGuard::~HostKernelGuard() {
  if (!active_) return;
  if (--t_host_kernel_depth == 0) {
    release_host_openmp_pool();  // and none keeps it afterwards
    vnpuSanitizerDeviceAccessEnd();
  }
}

CurrentOp::CurrentOp(const char* name) : prev_(t_op) { t_op = name; }
CurrentOp::~CurrentOp() { t_op = prev_; }

void install() {
  c10::vnpu::allocator::setSanitizerRecorder(&record_site);
  c10::vnpu::set_sanitizer_raiser(&raise_from_check);
}

}  // namespace at::vnpu::sanitizer
