// Writing device memory to a file (Note [File writes from device memory] in the runtime, Note [Checkpoint
// writes] here). Used by torch_vnpu.checkpoints to save safetensors files of vnpu tensors.
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
// A device source's bytes are those it holds after the work queued so far on the
// current stream of its device: chunks of at most `chunk_bytes` are written
// straight from device memory (vnpuMemcpyToFileAsync) on that stream, at most
// `slots` chunks in flight. Host
// sources are written by the calling thread. Returns when the file is complete.
// Raises c10::Error naming the file (and the tensor) on an I/O error (no space,
// no permission, the file size limit), with the temporary file removed.
// `progress`, if set, is called with the bytes written so far after each chunk
// (an exception it throws ends the save, as any failure).
// Without the device's file writes (the runtime answers vnpuErrorNotSupported,
// or VNPU_FILE_WRITES=0) it uses writeFromDeviceStaged.
void writeFromDevice(const std::string& path, const std::string& header, const std::vector<Source>& sources,
                     size_t chunk_bytes, int slots, const std::function<void(uint64_t)>& progress = {});

// The same through pinned staging buffers (Note [Staged file writes], StagedFileWrite.cpp): each chunk is
// downloaded (vnpuMemcpyAsync) into one of `slots` pinned buffers of up to `chunk_bytes` bytes, and the host
// writes a buffer once its download ran while the next ones download. Same errors.
void writeFromDeviceStaged(const std::string& path, const std::string& header, const std::vector<Source>& sources,
                           size_t chunk_bytes, int slots, const std::function<void(uint64_t)>& progress = {});

}  // namespace at::vnpu::io
