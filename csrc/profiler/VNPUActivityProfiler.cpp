// See Note [Device activities in the profiler] in VNPUActivityProfiler.h.
#include "VNPUActivityProfiler.h"

#include "../core/VNPUStream.h"

#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <unistd.h>

#include <chrono>
#include <map>

namespace torch_vnpu::profiler {
namespace {

using libkineto::ActivityType;

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Lanes: pid = device index; trace viewers sort processes by sort_index, and
// the device rows go below the host's (CUDA's GPU rows do the same).
constexpr int64_t kDeviceSortBase = 0x1000000;

// How long stop() waits for tasks still running on the streams (any device).
constexpr int64_t kStopTimeoutMs = 60000;

std::string memcpy_name(const vnpuActivityRecord& r) {
  // CUDA's names, so tools that look for "Memcpy HtoD" find them.
  const char* host = r.host_pinned ? "Pinned" : "Pageable";
  switch (r.copy_kind) {
    case vnpuMemcpyHostToDevice: return std::string("Memcpy HtoD (") + host + " -> Device)";
    case vnpuMemcpyDeviceToHost: return std::string("Memcpy DtoH (Device -> ") + host + ")";
    case vnpuMemcpyDeviceToDevice:
      // Between two devices: CUPTI's peer-to-peer kind.
      return r.src_device >= 0 && r.dst_device >= 0 && r.src_device != r.dst_device
                 ? "Memcpy PtoP (Device -> Device)"
                 : "Memcpy DtoD (Device -> Device)";
    case vnpuMemcpyHostToHost: return "Memcpy HtoH (Host -> Host)";
  }
  return "Memcpy";
}

const char* runtime_call_name(vnpuActivityKind kind) {
  switch (kind) {
    case vnpuActivityKindMemcpy: return "vnpuMemcpyAsync";
    case vnpuActivityKindMemset: return "vnpuMemsetAsync";
    default: return "vnpuLaunchKernel";
  }
}

std::string stream_lane_name(int64_t id) {
  return id == 0 ? "stream 0 (default)" : "stream " + std::to_string(id);
}

}  // namespace

VNPUActivityProfilerSession::~VNPUActivityProfilerSession() {
  if (recording_) vnpuActivityEnable(0);
}

void VNPUActivityProfilerSession::start() {
  int64_t steady = 0;
  vnpuActivityGetTimestamp(&steady);
  start_ns_ = unix_now_ns();
  steady_to_unix_ns_ = start_ns_ - steady;
  records_.clear();
  vnpuActivityEnable(1);
  recording_ = true;
  status_ = libkineto::TraceStatus::RECORDING;
}

void VNPUActivityProfilerSession::stop() {
  vnpuActivityEnable(0);
  recording_ = false;
  // PyTorch synchronized the current device only (torch.vnpu.synchronize()):
  // wait for what the other devices' streams still run of the profiled work.
  const vnpuError_t waited = vnpuActivitySynchronize(kStopTimeoutMs);
  if (waited != vnpuSuccess) {
    errors_.push_back(std::string("vnpu: tasks launched while profiling were still running ") +
                      (waited == vnpuErrorInterrupted ? "when the wait for them was interrupted"
                                                      : "after " + std::to_string(kStopTimeoutMs / 1000) + " s") +
                      " at the profiler's stop; they are missing from the trace");
  }
  end_ns_ = unix_now_ns();
  vnpuActivityFlushAll(&records_);
  status_ = libkineto::TraceStatus::PROCESSING;
}

void VNPUActivityProfilerSession::processTrace(libkineto::ActivityLogger& logger) {
  processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, start_ns_, end_ns_);
}

void VNPUActivityProfilerSession::processTrace(libkineto::ActivityLogger& logger,
                                               libkineto::getLinkedActivityCallback getLinkedActivity,
                                               int64_t /*startTime*/, int64_t /*endTime*/) {
  // Tasks that ended after stop() gave up waiting for them (if it did).
  vnpuActivityFlushAll(&records_);
  buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
  buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "vnpu");
  buffer_->gpuOpCount = 0;
  const int32_t pid = static_cast<int32_t>(::getpid());
  std::map<vnpuStream_t, int64_t> stream_ids;
  uint32_t flow = 0;
  for (const vnpuActivityRecord& r : records_) {
    if (r.kind == vnpuActivityKindSync) continue;  // event record / wait: not device work
    auto [it, fresh] = stream_ids.emplace(r.stream, -1);
    if (fresh) {
      it->second = c10::vnpu::streamIdOf(static_cast<c10::DeviceIndex>(r.device), r.stream);
    }
    const int64_t stream_id = it->second;
    const ActivityType type = r.kind == vnpuActivityKindMemcpy   ? ActivityType::GPU_MEMCPY
                              : r.kind == vnpuActivityKindMemset ? ActivityType::GPU_MEMSET
                                                                 : ActivityType::CONCURRENT_KERNEL;
    const std::string name = r.kind == vnpuActivityKindMemcpy   ? memcpy_name(r)
                             : r.kind == vnpuActivityKindMemset ? std::string("Memset (Device)")
                                                                : r.name;
    const libkineto::ITraceActivity* launcher =
        r.correlation_id != 0 ? getLinkedActivity(static_cast<int32_t>(r.correlation_id)) : nullptr;
    ++flow;

    // The launch on the host thread: start of the arrow.
    buffer_->emplace_activity(buffer_->span, ActivityType::PRIVATEUSE1_RUNTIME, runtime_call_name(r.kind));
    auto& call = *buffer_->activities.back();
    call.startTime = r.queued_ns + steady_to_unix_ns_;
    call.endTime = call.startTime;  // the runtime only timestamps the submission
    call.id = static_cast<int32_t>(r.correlation_id);
    call.device = pid;
    call.resource = static_cast<int32_t>(r.host_thread);
    call.threadId = static_cast<int32_t>(r.host_thread);
    call.linked = launcher;
    call.flow.id = flow;
    call.flow.type = libkineto::kLinkAsyncCpuGpu;
    call.flow.start = true;
    call.addMetadata("correlation", flow);
    logger.handleActivity(call);

    // The task on its stream's lane: end of the arrow.
    buffer_->emplace_activity(buffer_->span, type, name);
    auto& task = *buffer_->activities.back();
    task.startTime = r.start_ns + steady_to_unix_ns_;
    task.endTime = r.end_ns + steady_to_unix_ns_;
    task.id = static_cast<int32_t>(r.correlation_id);
    task.device = r.device;
    task.resource = static_cast<int32_t>(stream_id);
    task.threadId = static_cast<int32_t>(stream_id);
    task.linked = launcher;
    task.flow.id = flow;
    task.flow.type = libkineto::kLinkAsyncCpuGpu;
    task.flow.start = false;
    task.addMetadata("device", r.device);
    task.addMetadata("stream", stream_id);
    task.addMetadata("correlation", flow);
    task.addMetadata("queued (us)", (r.start_ns - r.queued_ns) / 1000.0);
    if (r.kind != vnpuActivityKindKernel) {
      task.addMetadata("bytes", r.bytes);
      if (r.kind == vnpuActivityKindMemcpy && r.src_device >= 0 && r.dst_device >= 0) {
        task.addMetadata("src device", r.src_device);
        task.addMetadata("dst device", r.dst_device);
      }
      const int64_t dur = r.end_ns - r.start_ns;
      if (dur > 0) task.addMetadata("memory bandwidth (GB/s)", static_cast<double>(r.bytes) / dur);
    }
    if (r.failed) task.addMetadataQuoted("error", "the task failed: see the device's error");
    logger.handleActivity(task);
    ++buffer_->gpuOpCount;
    devices_.insert(r.device);
    lanes_.emplace(r.device, stream_id);
  }
  records_.clear();
  buffer_->span.iteration = 0;
  buffer_->span.opCount = buffer_->gpuOpCount;
  // Names of the device processes (the first one: getDeviceInfo) and their stream lanes.
  for (int d : devices_) {
    if (d == *devices_.begin()) continue;
    logger.handleDeviceInfo(
        libkineto::DeviceInfo{d, kDeviceSortBase + d, "vnpu:" + std::to_string(d), "vnpu " + std::to_string(d)},
        start_ns_);
  }
  for (const auto& [d, s] : lanes_) {
    logger.handleResourceInfo(libkineto::ResourceInfo{s, s, d, stream_lane_name(s)}, start_ns_);
  }
}

std::unique_ptr<libkineto::DeviceInfo> VNPUActivityProfilerSession::getDeviceInfo() {
  // Kineto labels rows "GPU 0".."GPU 15" when no session names its device;
  // processTrace already named every vnpu device seen.
  const int d = devices_.empty() ? 0 : *devices_.begin();
  return std::make_unique<libkineto::DeviceInfo>(
      libkineto::DeviceInfo{d, kDeviceSortBase + d, "vnpu:" + std::to_string(d), "vnpu " + std::to_string(d)});
}

std::vector<libkineto::ResourceInfo> VNPUActivityProfilerSession::getResourceInfos() { return {}; }

std::unique_ptr<libkineto::CpuTraceBuffer> VNPUActivityProfilerSession::getTraceBuffer() {
  return std::move(buffer_);
}

void VNPUActivityProfilerSession::pushCorrelationId(uint64_t id) { vnpuActivityPushExternalCorrelationId(id); }
void VNPUActivityProfilerSession::popCorrelationId() { vnpuActivityPopExternalCorrelationId(nullptr); }
// record_function ranges: a task launched directly inside one (a compiled
// kernel) links to the range; an operator inside it is innermost otherwise.
void VNPUActivityProfilerSession::pushUserCorrelationId(uint64_t id) { vnpuActivityPushExternalCorrelationId(id); }
void VNPUActivityProfilerSession::popUserCorrelationId() { vnpuActivityPopExternalCorrelationId(nullptr); }

std::string VNPUActivityProfilerSession::getDeviceProperties() {
  // The trace's "deviceProperties" (CUDA gives one object per GPU).
  int count = 0;
  if (vnpuGetDeviceCount(&count) != vnpuSuccess) return "";
  std::string out;
  for (int d = 0; d < count; ++d) {
    vnpuDeviceProp p{};
    if (vnpuGetDeviceProperties(&p, d) != vnpuSuccess) continue;
    if (!out.empty()) out += ",";
    out += "\n    {\"id\": " + std::to_string(d) + ", \"name\": \"" + p.name + "\", \"totalGlobalMem\": " +
           std::to_string(p.totalGlobalMem) + ", \"computeMajor\": " + std::to_string(p.major) +
           ", \"computeMinor\": " + std::to_string(p.minor) + ", \"numSms\": " +
           std::to_string(p.multiProcessorCount) + "}";
  }
  return out;
}

const std::set<libkineto::ActivityType>& VNPUActivityProfiler::availableActivities() const {
  static const std::set<ActivityType> kActivities{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                                  ActivityType::GPU_MEMSET, ActivityType::PRIVATEUSE1_RUNTIME};
  return kActivities;
}

std::unique_ptr<libkineto::IActivityProfilerSession> VNPUActivityProfiler::configure(
    const std::set<libkineto::ActivityType>& activity_types, const libkineto::Config& config) {
  // Once registered, Kineto asks every trace, CPU-only ones too: record
  // device work only when device activities were asked for.
  for (ActivityType t : {ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY, ActivityType::GPU_MEMSET}) {
    if (activity_types.count(t)) return std::make_unique<VNPUActivityProfilerSession>();
  }
  return nullptr;
}

std::unique_ptr<libkineto::IActivityProfilerSession> VNPUActivityProfiler::configure(
    int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<libkineto::ActivityType>& activity_types,
    const libkineto::Config& config) {
  return configure(activity_types, config);
}

}  // namespace torch_vnpu::profiler

using torch_vnpu::profiler::VNPUActivityProfiler;
REGISTER_PRIVATEUSE1_PROFILER(VNPUActivityProfiler);
