// torch_vnpu._C: the Python bindings behind torch.vnpu (private API; the
// public surface is the torch_vnpu.vnpu package, mirroring torch.cuda).
#include "../core/VNPUAllocatorConfig.h"
#include "../core/VNPUCachingAllocator.h"
#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"
#include "../core/VNPUGeneratorImpl.h"
#include "../core/VNPUGraph.h"
#include "../core/VNPUHooks.h"
#include "../core/VNPUHostAllocator.h"
#include "../core/VNPUPluggableAllocator.h"
#include "../core/VNPUStream.h"
#include "../distributed/Bindings.h"
#include "../inductor/KernelLaunch.h"
#include "../ops/Executor.h"
#include "../ops/HostModes.h"
#include "../ops/HostOpenMP.h"
#include "../ops/Interrupts.h"
#include "../ops/OpStats.h"
#include "../ops/WorkerWarnings.h"
#include "../sanitizer/Sanitizer.h"
#include "Interrupts.h"
#include "CheckpointIO.h"
#include "GraphTrees.h"
#include "Ipc.h"
#include "MemoryHistory.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>

#include <vnpu/runtime.h>

#include <chrono>
#include <thread>

namespace py = pybind11;

namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;

py::dict stat_dict(const Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array_dict(const StatArray& a) {
  static const char* names[] = {"all", "small_pool", "large_pool"};
  py::dict d;
  for (size_t i = 0; i < a.size(); ++i) d[names[i]] = stat_dict(a[i]);
  return d;
}

// Nested dict in the layout of torch.cuda.memory_stats_as_nested_dict().
py::dict memory_stats(c10::DeviceIndex device) {
  auto s = c10::vnpu::allocator::getDeviceStats(device);
  py::dict d;
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  d["max_split_size"] = s.max_split_size;
  d["num_sync_all_streams"] = s.num_sync_all_streams;
  d["num_device_alloc"] = s.num_device_alloc;
  d["num_device_free"] = s.num_device_free;
  d["allocation"] = stat_array_dict(s.allocation);
  d["segment"] = stat_array_dict(s.segment);
  d["active"] = stat_array_dict(s.active);
  d["inactive_split"] = stat_array_dict(s.inactive_split);
  d["allocated_bytes"] = stat_array_dict(s.allocated_bytes);
  d["reserved_bytes"] = stat_array_dict(s.reserved_bytes);
  d["active_bytes"] = stat_array_dict(s.active_bytes);
  d["inactive_split_bytes"] = stat_array_dict(s.inactive_split_bytes);
  d["requested_bytes"] = stat_array_dict(s.requested_bytes);
  d["oversize_allocations"] = stat_dict(s.oversize_allocations);
  d["oversize_segments"] = stat_dict(s.oversize_segments);
  return d;
}

// Nested dict in the layout of torch.cuda.host_memory_stats_as_nested_dict() (pinned host memory).
py::dict host_memory_stats() {
  const at::HostStats s = at::vnpu::getVNPUHostAllocator()->get_stats();
  auto timing = [](const c10::CachingAllocator::DurationStat& t) {
    py::dict d;
    d["total"] = t.total;
    d["max"] = t.max;
    d["min"] = t.min;
    d["count"] = t.count;
    d["avg"] = t.count == 0 ? 0 : t.total / t.count;
    return d;
  };
  py::dict d;
  d["num_host_alloc"] = s.num_host_alloc;
  d["num_host_free"] = s.num_host_free;
  d["allocations"] = stat_dict(s.allocations);
  d["allocated_bytes"] = stat_dict(s.allocated_bytes);
  d["active_requests"] = stat_dict(s.active_requests);
  d["active_bytes"] = stat_dict(s.active_bytes);
  d["host_alloc_time"] = timing(s.host_alloc_time);
  d["host_free_time"] = timing(s.host_free_time);
  return d;
}

// See Note [Interrupts are not failures]: a Python exception that is a
// BaseException but not an Exception (KeyboardInterrupt, SystemExit).
// Python kernels (Meta kernels registered from Python) raise pybind11's
// error_already_set; torch's own bindings raise python_error.
bool is_python_interrupt(const std::exception& e) {
  PyObject* type = nullptr;
  if (const auto* pe = dynamic_cast<const python_error*>(&e)) type = pe->type;
  const auto* pb = dynamic_cast<const py::error_already_set*>(&e);
  if (type == nullptr && pb == nullptr) return false;
  py::gil_scoped_acquire gil;
  if (pb != nullptr) type = pb->type().ptr();
  return type != nullptr && PyType_Check(type) &&
         !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type), reinterpret_cast<PyTypeObject*>(PyExc_Exception));
}

py::tuple stream_tuple(const c10::vnpu::VNPUStream& s) {
  return py::make_tuple(s.id(), s.device_index(), static_cast<int64_t>(s.device().type()));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_vnpu native bindings (private; use torch.vnpu)";
  at::vnpu::register_hooks();
  at::vnpu::register_cpu_kernel_overrides();
  at::vnpu::register_sparse_kernel_overrides();
  at::vnpu::release_openmp_pool_when_workers_idle();
  at::vnpu::set_interrupt_test(&is_python_interrupt);
  torch_vnpu::install_interrupt_handling();
  at::vnpu::register_graph_impl();  // torch.accelerator.Graph on vnpu
  at::vnpu::sanitizer::install();

  m.def("_device_count", &c10::vnpu::device_count);
  m.def("_set_worker_flush_denormal", &at::vnpu::set_worker_flush_denormal);
  // Note [Host modes take effect as of the call]: queued work runs under the modes of its call.
  m.def("_wait_all_devices_idle", [] {
    py::gil_scoped_release no_gil;
    for (int d = 0; d < c10::vnpu::device_count(); ++d) VNPU_CHECK(vnpuDeviceWaitIdle(d));
  });
  // Discovery (device_count, properties) does not initialize; _init does (Note [Discovery and initialization]).
  m.def("_init", [] { VNPU_CHECK(vnpuInit(0)); });
  m.def("_device_utilization", [](c10::DeviceIndex d) {
    c10::vnpu::check_device_index(d);
    unsigned percent = 0;
    VNPU_CHECK(vnpuDeviceGetUtilization(d, &percent));
    return percent;
  });
  m.def("_is_initialized", [] { return vnpuIsInitialized() != 0; });
  // VNPU_SANITIZE (src/torch_vnpu/sanitizer): False once the runtime was initialized without it.
  m.def("_sanitizer_enable", [] { return vnpuSanitizerEnable() == vnpuSuccess; });
  m.def("_sanitizer_is_enabled", [] { return vnpuSanitizerIsEnabled() != 0; });
  // Check 4 (host access to device memory): (on, why not).
  m.def("_sanitizer_host_access_check", [] {
    const char* why = nullptr;
    const bool on = vnpuSanitizerHostAccessCheckEnabled(&why) != 0;
    return py::make_tuple(on, std::string(why != nullptr ? why : ""));
  });
  // The calling thread may touch device memory until _sanitizer_device_access(False) (threads it
  // creates meanwhile keep the access): for code that hands device memory to host threads on purpose.
  m.def("_sanitizer_device_access", [](bool begin) {
    VNPU_CHECK(begin ? vnpuSanitizerDeviceAccessBegin() : vnpuSanitizerDeviceAccessEnd());
  });
  // Raises what the runtime kept for the next call (HostAccessError if host code touched device memory since
  // the last report, a free's StreamRaceError...); at_exit: the interpreter-exit check.
  m.def("_sanitizer_check_host_access", &at::vnpu::sanitizer::check_pending, py::arg("at_exit") = false);
  m.def("_configuration_warnings", [] { return std::string(vnpuGetConfigurationWarningString()); });
  m.def("_check_device_index", &c10::vnpu::check_device_index);
  m.def("_current_device", &c10::vnpu::current_device);
  m.def("_set_device", &c10::vnpu::set_device);
  m.def("_exchange_device", &c10::vnpu::ExchangeDevice);
  m.def("_is_in_bad_fork", &c10::vnpu::is_in_bad_fork);
  m.def("_set_sync_debug_mode", [](int64_t mode) {
    TORCH_CHECK(mode >= 0 && mode <= 2, "invalid value of debug_mode, expected one of 0,1,2");
    c10::vnpu::set_sync_debug_mode(static_cast<c10::vnpu::SyncDebugMode>(mode));
  });
  m.def("_get_sync_debug_mode", [] { return static_cast<int>(c10::vnpu::get_sync_debug_mode()); });
  m.def("_synchronize", [](c10::DeviceIndex d) { c10::vnpu::device_synchronize(d); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_get_device_properties", [](c10::DeviceIndex d) {
    c10::vnpu::check_device_index(d);
    vnpuDeviceProp p{};
    vnpuGetDeviceProperties(&p, d);
    return py::make_tuple(std::string(p.name), p.totalGlobalMem, p.multiProcessorCount, p.major, p.minor);
  });
  m.def("_launch_blocking", [] {
    int on = 0;
    vnpuGetEnvFlag("VNPU_LAUNCH_BLOCKING", 0, &on);  // the runtime's rule (Note [Boolean environment variables])
    return on != 0;
  });
  // torch.cuda._sleep's counterpart: the current stream spins for `cycles` ns (a 1 GHz clock).
  m.def("_sleep", [](int64_t cycles) {
    TORCH_CHECK(cycles >= 0, "_sleep: expected cycles >= 0, but got ", cycles);
    auto s = c10::vnpu::getCurrentVNPUStream();
    VNPU_CHECK(vnpuLaunchKernel(s.stream(), "vnpu::sleep", [cycles] {
      std::this_thread::sleep_for(std::chrono::nanoseconds(cycles));
    }));
  });

  // Streams: (stream_id, device_index, device_type) triples, as torch.cuda uses.
  m.def("_current_stream", [](c10::DeviceIndex d) { return stream_tuple(c10::vnpu::getCurrentVNPUStream(d)); });
  m.def("_default_stream", [](c10::DeviceIndex d) { return stream_tuple(c10::vnpu::getDefaultVNPUStream(d)); });
  m.def("_set_stream", [](int64_t id, c10::DeviceIndex d, int64_t type) {
    auto s = c10::Stream::unpack3(id, d, static_cast<c10::DeviceType>(type));
    c10::vnpu::setCurrentVNPUStream(c10::vnpu::VNPUStream(s));
  });
  // The vnpuStream_t of a stream as an int (torch.cuda.Stream.cuda_stream's counterpart; snapshots name it).
  m.def("_stream_handle", [](int64_t id, c10::DeviceIndex d, int64_t type) {
    auto s = c10::vnpu::VNPUStream(c10::Stream::unpack3(id, d, static_cast<c10::DeviceType>(type)));
    return static_cast<int64_t>(reinterpret_cast<intptr_t>(s.stream()));
  });
  m.def("_stream_from_external", [](uintptr_t handle, c10::DeviceIndex d) {
    c10::vnpu::check_device_index(d);
    c10::Stream s = c10::vnpu::getStreamFromExternal(reinterpret_cast<vnpuStream_t>(handle), d).unwrap();
    return py::make_tuple(s.id(), s.device_index(), static_cast<int64_t>(s.device_type()));
  });
  m.def("_stream_priority", [](int64_t id, c10::DeviceIndex d, int64_t type) {
    return c10::vnpu::VNPUStream(c10::Stream::unpack3(id, d, static_cast<c10::DeviceType>(type))).priority();
  });

  // torch.Event's own elapsed_time accepts only the exact torch.Event type;
  // torch.vnpu.Event subclasses it (same object layout), as torch.cuda.Event
  // users expect, so timing goes through here.
  m.def("_event_elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK_TYPE(PyObject_IsInstance(start.ptr(), (PyObject*)THPEventClass) == 1 &&
                         PyObject_IsInstance(end.ptr(), (PyObject*)THPEventClass) == 1,
                     "expected torch.Event objects");
    auto* a = reinterpret_cast<THPEvent*>(start.ptr());
    auto* b = reinterpret_cast<THPEvent*>(end.ptr());
    return a->event.elapsedTime(b->event);
  });

  // Memory.
  m.def("_graph_pool_handle", [] {
    auto id = at::vnpu::graph_pool_handle();
    return py::make_tuple(id.first, id.second);
  });
  // torch.vnpu.MemPool / use_mem_pool (CUDA's _cuda_beginAllocateCurrentThreadToPool & co): allocations of
  // the calling thread on `device` come from the pool until the matching end.
  m.def("_begin_allocate_current_thread_to_pool", [](c10::DeviceIndex d, std::pair<c10::CaptureId_t, c10::CaptureId_t> id) {
    c10::vnpu::check_device_index(d);
    c10::vnpu::allocator::beginAllocateToPool(
        d, id, [tid = std::this_thread::get_id()](vnpuStream_t) { return std::this_thread::get_id() == tid; });
  });
  m.def("_end_allocate_to_pool", [](c10::DeviceIndex d, std::pair<c10::CaptureId_t, c10::CaptureId_t> id) {
    c10::vnpu::allocator::endAllocateToPool(d, id);
  });
  m.def("_release_pool", [](c10::DeviceIndex d, std::pair<c10::CaptureId_t, c10::CaptureId_t> id) {
    c10::vnpu::allocator::releasePool(d, id);
  });
  m.def("_pool_use_count", [](c10::DeviceIndex d, std::pair<c10::CaptureId_t, c10::CaptureId_t> id) {
    return c10::vnpu::allocator::poolUseCount(d, id);
  });
  m.def("_is_current_stream_capturing", &at::vnpu::is_current_stream_capturing);
  m.def("_empty_cache", &c10::vnpu::allocator::emptyCache, py::call_guard<py::gil_scoped_release>());
  m.def("_memory_stats", &memory_stats);
  m.def("_reset_peak_memory_stats", &c10::vnpu::allocator::resetPeakStats);
  m.def("_set_memory_fraction", &c10::vnpu::allocator::setMemoryFraction);
  m.def("_caching_allocator_alloc", [](size_t n, c10::DeviceIndex d, uintptr_t handle) {
    c10::vnpu::check_device_index(d);
    auto stream = reinterpret_cast<vnpuStream_t>(handle);
    TORCH_CHECK_VALUE(handle != 0 && c10::vnpu::streamIdOf(d, stream) >= 0, "stream handle ", handle,
                      " is not a stream of vnpu:", int(d), ": pass a torch.vnpu.Stream of that device or its "
                      ".vnpu_stream");
    return reinterpret_cast<uintptr_t>(c10::vnpu::allocator::rawAlloc(n, stream));
  });
  m.def("_caching_allocator_delete", [](uintptr_t ptr) { c10::vnpu::allocator::rawDelete(reinterpret_cast<void*>(ptr)); });
  // torch.vnpu.memory.VNPUPluggableAllocator / change_current_allocator / caching_allocator_enable.
  m.def("_create_pluggable_allocator", [](uintptr_t alloc, uintptr_t free) {
    return reinterpret_cast<uintptr_t>(c10::vnpu::allocator::createPluggableAllocator(
        reinterpret_cast<c10::vnpu::allocator::PluggableAllocFn>(alloc),
        reinterpret_cast<c10::vnpu::allocator::PluggableFreeFn>(free)));
  });
  m.def("_change_current_allocator", [](uintptr_t allocator) {
    c10::vnpu::allocator::changeCurrentAllocator(reinterpret_cast<c10::DeviceAllocator*>(allocator));
  });
  m.def("_is_caching_allocator_current", &c10::vnpu::allocator::isCachingAllocatorCurrent);
  m.def("_set_caching_allocator_enabled", &c10::vnpu::allocator::setCachingEnabled);
  m.def("_is_caching_allocator_enabled", &c10::vnpu::allocator::isCachingEnabled);
  m.def("_get_memory_fraction", &c10::vnpu::allocator::getMemoryFraction);
  m.def("_reset_accumulated_memory_stats", &c10::vnpu::allocator::resetAccumulatedStats);
  m.def("_mem_get_info", [](c10::DeviceIndex d) { return c10::vnpu::allocator::get()->getMemoryInfo(d); });
  // Parses an allocator configuration as if PYTORCH_VNPU_ALLOC_CONF held it (tests; the allocator itself
  // reads its settings once): warnings become Python warnings, malformed values raise ValueError.
  m.def("_parse_allocator_config", [](const std::string& text) {
    torch::PyWarningHandler warnings_to_python;
    auto c = c10::vnpu::allocator::parse_config(text, "PYTORCH_VNPU_ALLOC_CONF");
    py::dict d;
    d["expandable_segments"] = c.expandable_segments;
    d["max_split_size"] = c.max_split_size;
    d["max_non_split_rounding"] = c.max_non_split_rounding;
    d["large_segment_size"] = c.large_segment_size;
    d["garbage_collection_threshold"] = c.garbage_collection_threshold;
    d["roundup_power2_divisions"] = c.roundup_power2_divisions;
    return d;
  });
  m.def("_host_empty_cache", [] { at::vnpu::getVNPUHostAllocator()->empty_cache(); });
  m.def("_host_memory_stats", &host_memory_stats);
  m.def("_host_reset_accumulated_stats", [] { at::vnpu::getVNPUHostAllocator()->reset_accumulated_stats(); });
  m.def("_host_reset_peak_stats", [] { at::vnpu::getVNPUHostAllocator()->reset_peak_stats(); });
  // _record_memory_history, _memory_snapshot, _memory_snapshot_full, _attach_out_of_memory_observer.
  torch_vnpu::bind_memory_history(m);

  // Random.
  m.def("_default_generator", [](c10::DeviceIndex d) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(at::vnpu::getDefaultVNPUGenerator(d)));
  });

  // Op tracking.
  m.def("_take_worker_warnings", &at::vnpu::take_worker_warnings);
  m.def("_executed_ops", &at::vnpu::executed_ops);
  m.def("_fallback_ops", &at::vnpu::fallback_ops);
  m.def("_extra_copy_ops", &at::vnpu::extra_copy_ops);
  m.def("_reset_op_stats", &at::vnpu::reset_op_stats);

  // torch.compile: the C ABI of Inductor's generated vnpu kernel bindings
  // (Note [Compiled kernels on the stream]), as a capsule for PyCapsule_Import.
  m.attr("_inductor_launch_api") = py::capsule(static_cast<const void*>(at::vnpu::inductor_launch_api()),
                                               "torch_vnpu._C._inductor_launch_api");

  // torch.multiprocessing with vnpu tensors (src/torch_vnpu/_multiprocessing_reductions.py).
  torch_vnpu::bind_ipc(m);
  torch_vnpu::bind_graph_trees(m);
  torch_vnpu::bind_checkpoint_io(m);

  // Distributed (vccl), defined lazily by torch_vnpu.distributed.
  torch_vnpu::distributed::init_module(m);
}
