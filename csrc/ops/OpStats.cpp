#include "OpStats.h"

#include <mutex>
#include <unordered_map>

namespace at::vnpu {
namespace {
std::mutex g_mu;  // guards both maps
std::unordered_map<std::string, uint64_t> g_executed;
std::unordered_map<std::string, uint64_t> g_extra_copy;
std::unordered_map<std::string, std::pair<std::string, uint64_t>> g_fallback;
}  // namespace

void record_executed(const std::string& op) {
  std::lock_guard<std::mutex> g(g_mu);
  ++g_executed[op];
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
  return {g_executed.begin(), g_executed.end()};
}

std::map<std::string, std::pair<std::string, uint64_t>> fallback_ops() {
  std::lock_guard<std::mutex> g(g_mu);
  return {g_fallback.begin(), g_fallback.end()};
}

void reset_op_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  g_executed.clear();
  g_extra_copy.clear();
  g_fallback.clear();
}

}  // namespace at::vnpu
