// torch_vnpu._C bindings of csrc/io (checkpoint loading and saving).
#include "CheckpointIO.h"

#include "../io/FileRead.h"
#include "../io/FileWrite.h"

#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>

namespace py = pybind11;

namespace torch_vnpu {

namespace {

// A Python callable (or None) as a progress callback for a loop running without the GIL: it takes the GIL
// for each call, and what it raises (KeyboardInterrupt included) ends the loop.
std::function<void(uint64_t)> progressOf(const py::object& fn) {
  if (fn.is_none()) return {};
  auto f = std::make_shared<py::object>(fn);
  return [f](uint64_t done) {
    py::gil_scoped_acquire gil;
    (*f)(done);
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

}  // namespace

void bind_checkpoint_io(py::module& m) {
  // segments: (file offset, bytes, destination device pointer, tensor name), uploaded on the current stream
  // of the current device; fd >= 0: read from that open file, `path` only naming it. The GIL is released while
  // reading.
  m.def("_read_into_device",
        [](const std::string& path, const std::vector<std::tuple<uint64_t, uint64_t, uintptr_t, std::string>>& segs,
           size_t chunk_bytes, int slots, int upload_streams, const py::object& progress, int fd) {
          std::vector<at::vnpu::io::Segment> segments;
          segments.reserve(segs.size());
          for (const auto& [offset, nbytes, dst, name] : segs) {
            segments.push_back({offset, nbytes, reinterpret_cast<void*>(dst), name});
          }
          auto stream = c10::vnpu::getCurrentVNPUStream();
          const auto report = progressOf(progress);  // destroyed after the GIL is back
          py::gil_scoped_release no_gil;
          at::vnpu::io::readIntoDevice(path, std::move(segments), chunk_bytes, slots, stream, upload_streams, report,
                                      fd);
        },
        py::arg("path"), py::arg("segments"), py::arg("chunk_bytes"), py::arg("slots"), py::arg("upload_streams") = 2,
        py::arg("progress") = py::none(), py::arg("fd") = -1);
  // sources: (pointer, bytes, vnpu device index or -1 for host memory, tensor name), written after `header`;
  // downloads run on each device's current stream. The GIL is released while writing.
  m.def("_write_from_device",
        [](const std::string& path, const py::bytes& header,
           const std::vector<std::tuple<uintptr_t, uint64_t, int, std::string>>& srcs, size_t chunk_bytes,
           int slots, const py::object& progress) {
          std::vector<at::vnpu::io::Source> sources;
          sources.reserve(srcs.size());
          for (const auto& [ptr, nbytes, device, name] : srcs) {
            sources.push_back({reinterpret_cast<const void*>(ptr), nbytes, static_cast<c10::DeviceIndex>(device),
                               name});
          }
          std::string head = header;
          const auto report = progressOf(progress);  // destroyed after the GIL is back
          py::gil_scoped_release no_gil;
          at::vnpu::io::writeFromDevice(path, head, sources, chunk_bytes, slots, report);
        },
        py::arg("path"), py::arg("header"), py::arg("sources"), py::arg("chunk_bytes"), py::arg("slots"),
        py::arg("progress") = py::none());
}

}  // namespace torch_vnpu
