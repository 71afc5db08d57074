// torch_vnpu._C bindings of csrc/io (checkpoint loading).
#include "CheckpointIO.h"

#include "../io/StagedFileRead.h"

#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>

namespace py = pybind11;

namespace torch_vnpu {

void bind_checkpoint_io(py::module& m) {
  // segments: (file offset, bytes, destination device pointer, tensor name), uploaded on the current stream
  // of the current device. The GIL is released while reading.
  m.def("_read_into_device",
        [](const std::string& path, const std::vector<std::tuple<uint64_t, uint64_t, uintptr_t, std::string>>& segs,
           size_t chunk_bytes, int slots, int upload_streams) {
          std::vector<at::vnpu::io::Segment> segments;
          segments.reserve(segs.size());
          for (const auto& [offset, nbytes, dst, name] : segs) {
            segments.push_back({offset, nbytes, reinterpret_cast<void*>(dst), name});
          }
          auto stream = c10::vnpu::getCurrentVNPUStream();
          py::gil_scoped_release no_gil;
          at::vnpu::io::readIntoDevice(path, std::move(segments), chunk_bytes, slots, stream, upload_streams);
        },
        py::arg("path"), py::arg("segments"), py::arg("chunk_bytes"), py::arg("slots"), py::arg("upload_streams") = 2);
}

}  // namespace torch_vnpu
