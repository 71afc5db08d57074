// torch_vnpu._C._distributed: the Python face of vccl (private; the public
// entry point is torch_vnpu.distributed, which registers the backend).
#include "Bindings.h"

#include "FutureCompletion.h"
#include "ProcessGroupVCCL.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_vnpu::distributed {

namespace py = pybind11;
using c10d::vnpu::ProcessGroupVCCL;

namespace {

py::module define(py::module parent) {
  auto m = parent.def_submodule("_distributed", "vccl: the c10d backend of vnpu (private)");
  // Base classes (Backend, Store, ...) are registered by torch._C._distributed_c10d.
  py::module::import("torch.distributed");

  auto cls = py::class_<ProcessGroupVCCL, c10d::Backend, c10::intrusive_ptr<ProcessGroupVCCL>>(
      m, "ProcessGroupVCCL",
      R"(The vccl c10d backend: collectives on vnpu tensors, stream-ordered like NCCL's.

Created by torch.distributed through the "vccl" backend registration; build one
directly only for tests: ``ProcessGroupVCCL(store, rank, size, options, gloo)``
where ``gloo`` is a ``ProcessGroupGloo`` over the same ranks.)");

  py::class_<ProcessGroupVCCL::Options, c10d::Backend::Options, c10::intrusive_ptr<ProcessGroupVCCL::Options>>(
      cls, "Options", "Options of a vccl process group (timeout, cross-rank argument checks).")
      .def(py::init<std::chrono::milliseconds>(), py::arg("timeout") = kBackendDefaultTimeout)
      .def_readwrite("check_args", &ProcessGroupVCCL::Options::check_args,
                     "Compare every collective's arguments across ranks before moving data (default True; "
                     "VNPU_VCCL_CHECK=0 turns it off).")
      .def("__copy__", [](const ProcessGroupVCCL::Options& o) { return c10::make_intrusive<ProcessGroupVCCL::Options>(o); })
      .def("__deepcopy__", [](const ProcessGroupVCCL::Options& o, py::dict) {
        return c10::make_intrusive<ProcessGroupVCCL::Options>(o);
      });

  cls.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      const c10::intrusive_ptr<ProcessGroupVCCL::Options>& options,
                      const c10::intrusive_ptr<c10d::Backend>& gloo) {
             return c10::make_intrusive<ProcessGroupVCCL>(store, rank, size, options, gloo);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"), py::arg("gloo"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("options", &ProcessGroupVCCL::options)
      .def_property_readonly("_gloo", &ProcessGroupVCCL::glooBackend)
      .def_property_readonly("transport", &ProcessGroupVCCL::transportName,
                             "The transport of the group's collectives: 'shm' (all ranks on this host) or 'gloo'.")
      // new_group() calls this on ranks outside the new group when the default group is bound to a
      // device (NCCL's ncclCommSplit needs every rank); vccl builds each group on its own.
      .def("perform_nocolor_split", [](ProcessGroupVCCL&, const c10::Device&) {});

  m.def("_stop_future_completions", [] {
    py::gil_scoped_release nogil;  // the completion threads may be waiting for the GIL
    c10d::vnpu::FutureCompletion::stopAll("the interpreter is exiting");
  });
  m.def("_set_gloo_factory", [](py::function fn) {
    // Leaked on purpose: it must outlive every process group, even at interpreter exit.
    auto* f = new py::object(std::move(fn));
    ProcessGroupVCCL::setGlooFactory([f](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout) {
      py::gil_scoped_acquire gil;
      py::object pg = (*f)(store, rank, size, timeout);
      return pg.cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  });
  return m;
}

}  // namespace

void init_module(py::module& parent) {
  // Defined on first use: torch._C._distributed_c10d exists only once torch.distributed is imported.
  parent.def("_init_distributed", [parent]() {
    if (py::hasattr(parent, "_distributed")) return py::module(parent.attr("_distributed"));
    return define(parent);
  });
}

}  // namespace torch_vnpu::distributed
