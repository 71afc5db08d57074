#include "OutFile.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <cerrno>
#include <cstring>

namespace at::vnpu::io {

OutFile::OutFile(std::string path) : path_(std::move(path)) {
  // A name of its own for each save (O_EXCL), so that saves to one path from several threads or processes each
  // write a whole file and the last rename wins. The name keeps to NAME_MAX however long the file's name is.
  // Mode 0600, as safetensors' own save leaves the file.
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path_.substr(0, slash + 1);
  const std::string base = path_.substr(dir.size()).substr(0, 160);
  static std::atomic<uint64_t> serial{0};
  std::random_device random;
  for (int attempt = 0; fd_ < 0; ++attempt) {
    tmp_ = dir + "." + base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial.fetch_add(1)) + "." +
           std::to_string(random() & 0xffffff);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    TORCH_CHECK(fd_ >= 0 || (errno == EEXIST && attempt < 100), "cannot create ", tmp_, " (to save ", path_, "): ",
                std::strerror(errno));
  }
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void OutFile::pwrite(const char* p, size_t n, uint64_t offset, const std::string& what) {
  const uint64_t start = offset;
  while (n > 0) {
    // At most 2 MiB a call: larger writes were sporadically several times slower (Note [File writes from
    // device memory] in the runtime).
    const ssize_t w = ::pwrite(fd_, p, std::min(n, size_t{2} << 20), static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    TORCH_CHECK(w > 0, "writing ", path_, " (", what, ") failed at byte ", offset, " (", offset - start, " of ",
                offset - start + n, " bytes written): ", w < 0 ? std::strerror(errno) : "no progress");
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void OutFile::commit() {
  const int fd = fd_;
  fd_ = -1;
  TORCH_CHECK(::close(fd) == 0, "writing ", path_, " failed when closing it: ", std::strerror(errno));
  TORCH_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename ", tmp_, " to ", path_, ": ",
              std::strerror(errno));
  committed_ = true;
}

}  // namespace at::vnpu::io
