#include "VNPUAllocatorConfig.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/util/Exception.h>
#include <c10/util/env.h>
#include <c10/util/llvmMathExtras.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>

namespace c10::vnpu::allocator {
namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kIntervals = 16;  // power-of-two intervals from 1 MiB (the last one is open-ended)

size_t interval_of_mb(size_t mb) {
  const size_t index = mb == 0 ? 0 : static_cast<size_t>(c10::llvm::Log2_64(mb));
  return std::min(index, kIntervals - 1);
}

class Parser {
 public:
  Parser(const std::string& text, std::string variable) : tok_(text), var_(std::move(variable)) {}

  AllocatorConfig run() {
    AllocatorConfig c;
    c.source = var_;
    for (size_t i = 0; i < tok_.size(); ++i) {
      const std::string& key = tok_[i];
      if (key == ",") continue;
      expect(i + 1, ":", key);
      size_t v = i + 2;
      check(v < tok_.size(), "missing value for '", key, "'");
      if (key == "expandable_segments") {
        c.expandable_segments = boolean(v, key);
      } else if (key == "max_split_size_mb") {
        const size_t mb = number(v, key);
        check(mb >= 20, "max_split_size_mb must be >= 20 (the large segment size), but got ", mb);
        c.max_split_size = mb > std::numeric_limits<size_t>::max() / kMiB ? std::numeric_limits<size_t>::max()
                                                                          : mb * kMiB;
      } else if (key == "max_non_split_rounding_mb") {
        c.max_non_split_rounding = number(v, key) * kMiB;
      } else if (key == "large_segment_size_mb") {
        const size_t mb = number(v, key);
        check(mb >= 2, "large_segment_size_mb must be >= 2, but got ", mb);
        c.large_segment_size = mb * kMiB;
      } else if (key == "garbage_collection_threshold") {
        const double t = real(v, key);
        check(t > 0.0 && t < 1.0, "garbage_collection_threshold must be in (0.0, 1.0), but got ", tok_[v]);
        c.garbage_collection_threshold = t;
      } else if (key == "roundup_power2_divisions") {
        v = divisions(v, &c.roundup_power2_divisions);
      } else if (key == "backend") {
        check(tok_[v] == "native" || tok_[v] == "cudaMallocAsync",
              "backend must be native or cudaMallocAsync, but got ", tok_[v]);
        if (tok_[v] != "native")
          TORCH_WARN(var_, ": backend:", tok_[v], " is CUDA's; vnpu has only its native caching allocator, used.");
      } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
                 key == "pinned_use_host_register" || key == "pinned_use_background_threads" ||
                 key == "graph_capture_record_stream_reuse") {
        boolean(v, key);
        TORCH_WARN(var_, ": ", key, " has no effect on vnpu (", why(key), "); ignored.");
      } else if (key == "pinned_num_register_threads" || key == "pinned_max_round_threshold_mb" ||
                 key == "pinned_max_cached_size_mb" || key == "pinned_reserve_segment_size_mb") {
        number(v, key);
        TORCH_WARN(var_, ": ", key, " has no effect on vnpu (", why(key), "); ignored.");
      } else {
        if (tok_[v] == "[") v = tok_.skipKey(i);
        TORCH_WARN(var_, ": unknown key '", key, "' ignored. vnpu understands expandable_segments, ",
                   "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, ",
                   "garbage_collection_threshold and large_segment_size_mb.");
      }
      i = v;
      check(i + 1 >= tok_.size() || tok_[i + 1] == ",", "expected ',' after the value of '", key, "'");
    }
    return c;
  }

 private:
  template <typename... Args>
  void check(bool ok, const Args&... what) const {
    TORCH_CHECK_VALUE(ok, "Invalid ", var_, ": ", what..., " (syntax: key:value,key:value; e.g. ",
                      "expandable_segments:True,max_split_size_mb:128)");
  }
  void expect(size_t i, const char* token, const std::string& key) const {
    check(i < tok_.size() && tok_[i] == token, "expected '", token, "' after '", key, "'");
  }
  bool boolean(size_t i, const std::string& key) const {
    check(tok_[i] == "True" || tok_[i] == "False", key, " takes True or False, but got '", tok_[i], "'");
    return tok_[i] == "True";
  }
  size_t number(size_t i, const std::string& key) const {
    const std::string& t = tok_[i];
    check(!t.empty() && std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
              t.size() < 19,
          key, " takes a non-negative integer, but got '", t, "'");
    return std::stoull(t);
  }
  double real(size_t i, const std::string& key) const {
    size_t used = 0;
    double d = 0;
    try {
      d = std::stod(tok_[i], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == tok_[i].size() && used > 0, key, " takes a number, but got '", tok_[i], "'");
    return d;
  }
  size_t power_of_two(size_t i, const std::string& what) const {
    const size_t n = number(i, what);
    check(c10::llvm::isPowerOf2_64(n), what, " must be a power of 2, but got ", n);
    return n;
  }
  // "N" for every size, or "[MB:N,...,>:N]" (N divisions for sizes up to MB MiB, ">" for the rest).
  size_t divisions(size_t i, std::vector<size_t>* out) const {
    out->assign(kIntervals, 0);
    if (tok_[i] != "[") {
      std::fill(out->begin(), out->end(), power_of_two(i, "roundup_power2_divisions"));
      return i;
    }
    size_t last = 0;
    bool first = true;
    for (++i; i < tok_.size() && tok_[i] != "]"; ++i) {
      if (tok_[i] == ",") continue;
      const std::string& bound = tok_[i];
      expect(i + 1, ":", bound);
      check(i + 2 < tok_.size(), "missing divisions after '", bound, ":'");
      const size_t n = power_of_two(i + 2, "roundup_power2_divisions");
      if (bound == ">") {
        const size_t from = first ? 0 : std::min(last + 1, kIntervals);
        std::fill(out->begin() + static_cast<std::ptrdiff_t>(from), out->end(), n);
      } else {
        const size_t index = interval_of_mb(power_of_two(i, "a roundup_power2_divisions interval (MiB)"));
        if (first) std::fill(out->begin(), out->begin() + static_cast<std::ptrdiff_t>(index), n);
        for (size_t k = first ? index : last + 1; k <= index; ++k) (*out)[k] = n;
        first = false;
        last = index;
      }
      i += 2;
    }
    check(i < tok_.size(), "missing ']' in roundup_power2_divisions");
    return i;
  }
  static const char* why(const std::string& key) {
    if (key.rfind("pinned_", 0) == 0) return "pinned host memory is ordinary host memory registered with the runtime";
    if (key.rfind("graph_", 0) == 0) return "vnpu has no graph capture";
    return "the vnpu runtime's allocation takes no global lock";
  }

  c10::CachingAllocator::ConfigTokenizer tok_;
  std::string var_;
};

}  // namespace

AllocatorConfig::AllocatorConfig()
    : max_split_size(std::numeric_limits<size_t>::max()),
      max_non_split_rounding(20 * kMiB),
      large_segment_size(20 * kMiB) {}

size_t AllocatorConfig::divisions_for(size_t size) const {
  if (roundup_power2_divisions.empty()) return 0;
  return roundup_power2_divisions[interval_of_mb(size / kMiB)];
}

AllocatorConfig parse_config(const std::string& text, const std::string& variable) {
  return Parser(text, variable).run();
}

const AllocatorConfig& config() {
  static std::mutex mu;  // guards parsed
  static std::optional<AllocatorConfig> parsed;
  std::lock_guard<std::mutex> g(mu);
  if (!parsed) {
    for (const char* var : {"PYTORCH_VNPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
      if (auto text = c10::utils::get_env(var)) {
        parsed = parse_config(*text, var);
        break;
      }
    }
    if (!parsed) parsed.emplace();
  }
  return *parsed;
}

}  // namespace c10::vnpu::allocator
