#include "ShmSegment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace c10d::vnpu {
namespace {

std::string nameOf(uint64_t nonce) { return "vccl-shm-" + std::to_string(nonce); }

}  // namespace

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  std::swap(fd_, o.fd_);
  std::swap(id_, o.id_);
  return *this;
}

ShmSegment ShmSegment::create(size_t bytes) {
  std::random_device rd;
  ShmSegment s;
  s.id_.nonce = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
  s.fd_ = memfd_create(nameOf(s.id_.nonce).c_str(), MFD_CLOEXEC);
  if (s.fd_ < 0) throw std::runtime_error(std::string("memfd_create failed: ") + std::strerror(errno));
  if (ftruncate(s.fd_, static_cast<off_t>(bytes)) != 0)
    throw std::runtime_error(std::string("ftruncate failed: ") + std::strerror(errno));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_, 0);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("mmap failed: ") + std::strerror(errno));
  s.data_ = p;
  s.bytes_ = bytes;
  s.id_.pid = getpid();
  s.id_.fd = s.fd_;
  s.id_.bytes = bytes;
  return s;
}

ShmSegment ShmSegment::open(const Id& id) {
  const std::string path = "/proc/" + std::to_string(id.pid) + "/fd/" + std::to_string(id.fd);
  char target[256] = {0};
  ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  if (n <= 0 || std::string(target) != "/memfd:" + nameOf(id.nonce) + " (deleted)") {
    throw std::runtime_error(path + " is not the peer's shared segment (the process is gone, or this user "
                             "may not inspect it)");
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  void* p = mmap(nullptr, id.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw std::runtime_error(std::string("mmap of a peer segment failed: ") + std::strerror(errno));
  ShmSegment s;
  s.data_ = p;
  s.bytes_ = id.bytes;
  s.id_ = id;
  return s;
}

std::string ShmSegment::encode(const Id& id) {
  std::ostringstream os;
  os << id.pid << ' ' << id.fd << ' ' << id.nonce << ' ' << id.bytes;
  return os.str();
}

ShmSegment::Id ShmSegment::decode(const std::string& s) {
  Id id;
  std::istringstream is(s);
  is >> id.pid >> id.fd >> id.nonce >> id.bytes;
  if (!is) throw std::runtime_error("malformed shared segment id '" + s + "'");
  return id;
}

}  // namespace c10d::vnpu
