// Writing device memory to a file through pinned staging buffers (Note [Staged
// file writes]). Used by torch_vnpu.checkpoints to save safetensors files of
// vnpu tensors.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace at::vnpu::io {

struct Source {
  const void* src;            // device memory of `device`, or host memory when device < 0
  uint64_t nbytes;
  c10::DeviceIndex device;
  std::string name;           // for error messages (the tensor's name)
};

// Writes `header` and then every source's bytes, in order, to `path`: the file
// is written under a temporary name in the same directory and renamed over
// `path` at the end, so a failure leaves any earlier file at `path` intact.
// Device sources are downloaded (vnpuMemcpyAsync) on the current stream of
// their device, after the work queued there so far, in chunks of at most
// `chunk_bytes` into one of `slots` pinned buffers; the host writes a buffer
// once its download ran while the next ones download. Returns when the file is
// complete. Raises c10::Error naming the file (and the tensor) on an I/O error
// (no space, no permission), with the temporary file removed.
// `progress`, if set, is called with the bytes written so far after each write
// (an exception it throws ends the save, as any failure).
void writeFromDevice(const std::string& path, const std::string& header, const std::vector<Source>& sources,
                     size_t chunk_bytes, int slots, const std::function<void(uint64_t)>& progress = {});

}  // namespace at::vnpu::io
