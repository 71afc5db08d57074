// Settings of the vnpu caching allocator (mirrors c10/cuda/CUDAAllocatorConfig.h).
//
// Read once, at the allocator's first use, from PYTORCH_VNPU_ALLOC_CONF or, if
// that is unset, PYTORCH_ALLOC_CONF (the device-generic variable; the CUDA-only
// PYTORCH_CUDA_ALLOC_CONF is not read). The syntax is CUDA's, tokenized by c10's
// ConfigTokenizer: "key:value,key:[a:b,c:d]". Keys with an effect on vnpu:
//   expandable_segments:True|False   grow one mapped range per stream and pool
//                                    instead of separate segments (default False,
//                                    as CUDA's; see VNPUCachingAllocator.h)
//   max_split_size_mb:N              blocks of N MiB and more are never split (N >= 20)
//   max_non_split_rounding_mb:N      such a block serves a request at most N MiB smaller
//   roundup_power2_divisions:N or [MB:N,...,>:N]   round request sizes up to 1/N steps
//                                    between powers of two
//   garbage_collection_threshold:F   in (0, 1): above F x capacity reserved, cached
//                                    blocks are released, least recently freed first,
//                                    before new device memory is mapped
//   large_segment_size_mb:N          segment size for large requests under 10 MiB (default 20)
// CUDA-only keys (backend, release_lock_on_cudamalloc, pinned_*, graph_*) parse
// and warn that they have no effect; unknown keys warn; a malformed value
// raises ValueError naming the variable.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace c10::vnpu::allocator {

struct AllocatorConfig {
  bool expandable_segments = false;
  size_t max_split_size;             // bytes; SIZE_MAX = unlimited
  size_t max_non_split_rounding;     // bytes
  size_t large_segment_size;         // bytes
  double garbage_collection_threshold = 0;  // fraction of the capacity; 0 = off
  std::vector<size_t> roundup_power2_divisions;  // per power-of-two interval from 1 MiB; 0 = off
  std::string source;                // variable the settings came from ("" if none)

  AllocatorConfig();
  // Divisions for a request of `size` bytes (0 or 1: no power-of-two rounding).
  size_t divisions_for(size_t size) const;
};

// The settings, parsed on the first call (TORCH_WARN for keys without effect, c10::ValueError for
// malformed values; a failed parse is retried at the next call).
const AllocatorConfig& config();
// Parses `text` as if it were the value of `variable` (for tests and config()).
AllocatorConfig parse_config(const std::string& text, const std::string& variable);

}  // namespace c10::vnpu::allocator
