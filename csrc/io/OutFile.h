// A checkpoint file being written: created under a temporary name in the same directory and renamed over its
// path by commit(), so a failed save leaves any earlier file at the path intact (the temporary is removed).
#pragma once

#include <cstdint>
#include <string>

namespace at::vnpu::io {

class OutFile {
 public:
  // Raises c10::Error naming the path if the temporary cannot be created.
  explicit OutFile(std::string path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  // Writes n bytes at `offset`; raises c10::Error naming the file and `what` (the tensor) on a failure.
  void pwrite(const char* p, size_t n, uint64_t offset, const std::string& what);
  // Closes and renames; raises c10::Error naming the file if either fails.
  void commit();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace at::vnpu::io
