// torch_vnpu._C bindings of csrc/io (checkpoint loading and saving).
#include "CheckpointIO.h"

#include "../io/StagedFileRead.h"
#include "../io/StagedFileWrite.h"

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
  // sources: (pointer, bytes, vnpu device index or -1 for host memory, tensor name), written after `header`;
  // downloads run on each device's current stream. The GIL is released while writing.
  m.def("_write_from_device",
        [](const std::string& path, const py::bytes& header,
           const std::vector<std::tuple<uintptr_t, uint64_t, int, std::string>>& srcs, size_t chunk_bytes,
           int slots) {
          std::vector<at::vnpu::io::Source> sources;
          sources.reserve(srcs.size());
          for (const auto& [ptr, nbytes, device, name] : srcs) {
            sources.push_back({reinterpret_cast<const void*>(ptr), nbytes, static_cast<c10::DeviceIndex>(device),
                               name});
          }
          std::string head = header;
          py::gil_scoped_release no_gil;
          at::vnpu::io::writeFromDevice(path, head, sources, chunk_bytes, slots);
        },
        py::arg("path"), py::arg("header"), py::arg("sources"), py::arg("chunk_bytes"), py::arg("slots"));
}

}  // namespace torch_vnpu
