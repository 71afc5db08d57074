#include "OpStats.h"

#include <mutex>
#include <vector>
#include <unordered_map>

namespace at::vnpu {
namespace {
std::mutex g_mu;  // guards both maps
std::vector<std::pair<const std::string*, std::atomic<uint64_t>*>> g_counters;
std::unordered_map<std::string, uint64_t> g_extra_copy;
std::unordered_map<std::string, std::pair<std::string, uint64_t>> g_fallback;
}  // namespace

void register_op_counter(const std::string* op, std::atomic<uint64_t>* calls) {
  std::lock_guard<std::mutex> g(g_mu);
  g_counters.emplace_back(op, calls);
}

void record_fallback(const std::string& op, const std::string& reason) {
  std::lock_guard<std::mutex> g(g_mu);
  auto& e = g_fallback[op];
  if (e.first.empty()) e.first = reason;
  ++e.second;
}

void record_extra_copy(const std::string& op) {
  std::lock_guard<std::mutex> g(g_mu);
  ++g_extra_copy[op];
}

std::map<std::string, uint64_t> extra_copy_ops() {
  std::lock_guard<std::mutex> g(g_mu);
  return {g_extra_copy.begin(), g_extra_copy.end()};
}

std::map<std::string, uint64_t> executed_ops() {
  std::lock_guard<std::mutex> g(g_mu);
  std::map<std::string, uint64_t> out;
  for (const auto& [name, calls] : g_counters) {
    if (uint64_t n = calls->load(std::memory_order_relaxed)) out[*name] += n;
  }
  return out;
}

std::map<std::string, std::pair<std::string, uint64_t>> fallback_ops() {
  std::lock_guard<std::mutex> g(g_mu);
  return {g_fallback.begin(), g_fallback.end()};
}

void reset_op_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto& [name, calls] : g_counters) calls->store(0, std::memory_order_relaxed);
  g_extra_copy.clear();
  g_fallback.clear();
}

}  // namespace at::vnpu
