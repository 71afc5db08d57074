// Several streams of one device working on one job (checkpoint reads and writes), ordered as one stream.
#pragma once

#include "../core/VNPUStream.h"

#include <vector>

namespace at::vnpu::io {

// `current` and count - 1 pool streams forked from it (each waits for the work queued on `current` so far), for
// spreading reads or writes over several streams; join() makes `current` wait for the work queued on the others.
class ForkedStreams {
 public:
  ForkedStreams(c10::vnpu::VNPUStream current, int count);
  const c10::vnpu::VNPUStream& next();  // round robin, starting with `current`
  void join();

 private:
  std::vector<c10::vnpu::VNPUStream> streams_;
  size_t next_ = 0;
};

}  // namespace at::vnpu::io
