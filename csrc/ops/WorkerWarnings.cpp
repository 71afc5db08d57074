#include "WorkerWarnings.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <deque>
#include <mutex>

namespace at::vnpu {
namespace {

constexpr size_t kMaxQueued = 1024;  // a kernel warning in a loop must not grow memory without bound

std::mutex g_mu;  // guards g_queue, g_dropped
std::deque<c10::Warning> g_queue;
size_t g_dropped = 0;
std::atomic<bool> g_pending{false};

class QueueingHandler final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_queue.size() >= kMaxQueued) {
      ++g_dropped;
    } else {
      g_queue.push_back(w);
    }
    g_pending.store(true, std::memory_order_release);
  }
};

std::deque<c10::Warning> drain(size_t& dropped) {
  std::lock_guard<std::mutex> g(g_mu);
  std::deque<c10::Warning> out;
  out.swap(g_queue);
  dropped = g_dropped;
  g_dropped = 0;
  g_pending.store(false, std::memory_order_relaxed);
  return out;
}

std::string dropped_message(size_t n) {
  return std::to_string(n) + " more warnings from vnpu kernels were dropped (at most " +
         std::to_string(kMaxQueued) + " are kept between synchronizations)";
}

}  // namespace

void capture_warnings_on_this_thread() {
  static thread_local QueueingHandler handler;
  c10::WarningUtils::set_warning_handler(&handler);
}

AttemptWarnings::AttemptWarnings() : prev_(c10::WarningUtils::get_warning_handler()) {
  c10::WarningUtils::set_warning_handler(this);
}

AttemptWarnings::~AttemptWarnings() { c10::WarningUtils::set_warning_handler(prev_); }

void AttemptWarnings::commit() {
  c10::WarningUtils::set_warning_handler(prev_);
  for (const auto& w : held_) prev_->process(w);
  held_.clear();
}

void flush_worker_warnings() {
  if (!g_pending.load(std::memory_order_acquire)) return;
  size_t dropped = 0;
  for (const auto& w : drain(dropped)) c10::warn(w);
  if (dropped > 0) TORCH_WARN(dropped_message(dropped));
}

std::vector<std::pair<std::string, bool>> take_worker_warnings() {
  std::vector<std::pair<std::string, bool>> out;
  if (!g_pending.load(std::memory_order_acquire)) return out;
  size_t dropped = 0;
  for (const auto& w : drain(dropped))
    out.emplace_back(w.msg(), std::holds_alternative<c10::Warning::DeprecationWarning>(w.type()));
  if (dropped > 0) out.emplace_back(dropped_message(dropped), false);
  return out;
}

}  // namespace at::vnpu
