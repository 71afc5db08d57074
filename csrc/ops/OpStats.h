// Which ops ran on vnpu and which took a slower path (torch.vnpu.get_executed_ops /
// get_fallback_ops). Counts are per process; thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace at::vnpu {

// Registers the execution counter of an op (e.g. "aten::add.Tensor"); both
// pointers must stay valid for the process (the executor's per-op records).
void register_op_counter(const std::string* op, std::atomic<uint64_t>* calls);
// Records that `op` took a slower path (synchronized and ran on the host thread), with the reason (first reason kept).
void record_fallback(const std::string& op, const std::string& reason);
// Counts one run of `op` whose kernel has no out= form: its result is computed
// into fresh memory and copied into the device output on the stream (no
// synchronization, one extra device-side copy).
void record_extra_copy(const std::string& op);
std::map<std::string, uint64_t> executed_ops();
std::map<std::string, uint64_t> extra_copy_ops();
// op -> {reason, count}
std::map<std::string, std::pair<std::string, uint64_t>> fallback_ops();
void reset_op_stats();

}  // namespace at::vnpu
