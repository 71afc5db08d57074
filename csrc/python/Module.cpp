// torch_vnpu._C: the Python bindings behind torch.vnpu (private API; the
// public surface is the torch_vnpu.vnpu package, mirroring torch.cuda).
#include "../core/VNPUCachingAllocator.h"
#include "../distributed/Bindings.h"
#include "../core/VNPUFunctions.h"
#include "../core/VNPUGeneratorImpl.h"
#include "../core/VNPUHooks.h"
#include "../core/VNPUHostAllocator.h"
#include "../core/VNPUStream.h"
#include "../ops/Executor.h"
#include "../ops/HostOpenMP.h"
#include "../ops/OpStats.h"
#include "../ops/WorkerWarnings.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>

#include <vnpu/runtime.h>

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

py::list snapshot_segments() {
  py::list out;
  for (const auto& seg : c10::vnpu::allocator::snapshot()) {
    py::dict d;
    d["device"] = seg.device;
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = reinterpret_cast<uintptr_t>(seg.stream);
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["is_expandable"] = false;
    d["frames"] = py::list();
    py::list blocks;
    size_t addr = seg.address;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = addr;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated" : (b.active ? "active_pending_free" : "inactive");
      bd["frames"] = py::list();
      blocks.append(bd);
      addr += b.size;
    }
    d["blocks"] = blocks;
    out.append(d);
  }
  return out;
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

  m.def("_device_count", &c10::vnpu::device_count);
  m.def("_current_device", &c10::vnpu::current_device);
  m.def("_set_device", &c10::vnpu::set_device);
  m.def("_exchange_device", &c10::vnpu::ExchangeDevice);
  m.def("_is_in_bad_fork", &c10::vnpu::is_in_bad_fork);
  m.def("_synchronize", [](c10::DeviceIndex d) { c10::vnpu::device_synchronize(d); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_get_device_properties", [](c10::DeviceIndex d) {
    c10::vnpu::check_device_index(d);
    vnpuDeviceProp p{};
    vnpuGetDeviceProperties(&p, d);
    return py::make_tuple(std::string(p.name), p.totalGlobalMem, p.multiProcessorCount, p.major, p.minor);
  });
  m.def("_launch_blocking", [] {
    const char* v = std::getenv("VNPU_LAUNCH_BLOCKING");
    return v != nullptr && std::string(v) == "1";
  });

  // Streams: (stream_id, device_index, device_type) triples, as torch.cuda uses.
  m.def("_current_stream", [](c10::DeviceIndex d) { return stream_tuple(c10::vnpu::getCurrentVNPUStream(d)); });
  m.def("_default_stream", [](c10::DeviceIndex d) { return stream_tuple(c10::vnpu::getDefaultVNPUStream(d)); });
  m.def("_set_stream", [](int64_t id, c10::DeviceIndex d, int64_t type) {
    auto s = c10::Stream::unpack3(id, d, static_cast<c10::DeviceType>(type));
    c10::vnpu::setCurrentVNPUStream(c10::vnpu::VNPUStream(s));
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
  m.def("_empty_cache", &c10::vnpu::allocator::emptyCache, py::call_guard<py::gil_scoped_release>());
  m.def("_memory_stats", &memory_stats);
  m.def("_memory_snapshot", &snapshot_segments);
  m.def("_reset_peak_memory_stats", &c10::vnpu::allocator::resetPeakStats);
  m.def("_reset_accumulated_memory_stats", &c10::vnpu::allocator::resetAccumulatedStats);
  m.def("_mem_get_info", [](c10::DeviceIndex d) { return c10::vnpu::allocator::get()->getMemoryInfo(d); });
  m.def("_host_empty_cache", [] { at::vnpu::getVNPUHostAllocator()->empty_cache(); });

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

  // Distributed (vccl), defined lazily by torch_vnpu.distributed.
  torch_vnpu::distributed::init_module(m);
}
