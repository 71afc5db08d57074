// A host shared-memory segment that processes of one host map by (pid, fd):
// the creator backs it with a memfd; peers open /proc/<pid>/fd/<fd> (the same
// user) and check the memfd's name, which carries a random nonce, so a
// recycled pid or fd is never mapped by mistake. The memory is freed when the
// last process unmaps it (also when processes die).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace c10d::vnpu {

class ShmSegment {
 public:
  struct Id {
    int64_t pid = 0;
    int32_t fd = -1;
    uint64_t nonce = 0;
    uint64_t bytes = 0;
  };
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;

  // A new zero-filled segment of `bytes`; throws std::runtime_error on failure.
  static ShmSegment create(size_t bytes);
  // Maps a peer's segment; throws std::runtime_error naming the cause on failure.
  static ShmSegment open(const Id& id);

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const Id& id() const { return id_; }

  // "pid fd nonce bytes", and back (for the rendezvous store).
  static std::string encode(const Id& id);
  static Id decode(const std::string& s);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;  // the creator's memfd (kept open: peers open it through /proc)
  Id id_;
};

}  // namespace c10d::vnpu
