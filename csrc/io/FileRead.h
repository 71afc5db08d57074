// Reading byte ranges of a file into device memory (Note [File reads into device
// memory] in the runtime, Note [Checkpoint reads] here). Used by torch_vnpu.checkpoints
// to load safetensors checkpoints and torch.load's storages onto vnpu.
#pragma once

#include "ForkedStreams.h"

#include "../core/VNPUStream.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace at::vnpu::io {

// A file open for reading (sequential access advised); raises c10::Error naming it if it cannot be opened.
// With `open_fd` >= 0 it is a duplicate of that descriptor instead (`path` then only names it in messages): the
// caller read the header through it, so the data comes from the same file even if `path` is replaced meanwhile.
struct ReadOnlyFile {
  int fd = -1;
  explicit ReadOnlyFile(const std::string& path, int open_fd = -1);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
};

struct Segment {
  uint64_t file_offset;  // first byte in the file
  uint64_t nbytes;
  void* dst;             // device memory, nbytes long
  std::string name;      // for error messages (the tensor's name)
};

// Reads every segment of `path` into its device destination, in stream order on
// `stream`: chunks of at most `chunk_bytes` are read straight into device memory
// (vnpuMemcpyFromFileAsync) on `stream` and upload_streams - 1 pool streams forked
// from and joined to it, at most `slots` chunks in flight. Returns when every chunk
// has been read: work queued on `stream` afterwards sees the bytes. Raises c10::Error
// naming the file and the tensor on an I/O error or a short read (the file truncated
// or changed while read); the destinations stay valid until the caller frees them
// (stream-ordered). `progress`, if set, is called with the bytes read so far after
// each chunk (an exception it throws, such as Python's KeyboardInterrupt, ends the read).
// Without the device's file reads (the runtime answers vnpuErrorNotSupported, or VNPU_FILE_READS=0) it uses
// readIntoDeviceStaged. `fd` >= 0: read from that open file (ReadOnlyFile), `path` naming it in messages.
void readIntoDevice(const std::string& path, std::vector<Segment> segments, size_t chunk_bytes, int slots,
                    c10::vnpu::VNPUStream stream, int upload_streams = 2,
                    const std::function<void(uint64_t)>& progress = {}, int fd = -1);

// The same through pinned staging buffers (Note [Staged file reads], StagedFileRead.cpp): `slots` host buffers
// of up to `chunk_bytes` bytes are read into (pread) and uploaded as each fills; returns when the last upload
// is queued (not run). Same errors.
void readIntoDeviceStaged(const std::string& path, std::vector<Segment> segments, size_t chunk_bytes, int slots,
                          c10::vnpu::VNPUStream stream, int upload_streams = 2,
                          const std::function<void(uint64_t)>& progress = {}, int fd = -1);

}  // namespace at::vnpu::io
