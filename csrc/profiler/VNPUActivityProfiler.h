// Kineto plug-in for the PrivateUse1 activity: vnpu stream tasks in torch.profiler.
//
// Note [Device activities in the profiler]
// torch.profiler.profile(activities=[CPU, PrivateUse1]) runs Kineto in the
// KINETO_PRIVATEUSE1 state; PyTorch forwards the factory registered with
// REGISTER_PRIVATEUSE1_PROFILER to Kineto, which creates one session per
// trace. The session turns the runtime's activity records on at start()
// (vnpuActivityEnable), and forwards Kineto's per-thread correlation ids
// (pushed by PyTorch when an operator or a record_function range begins) to
// the runtime, which stamps each task with the innermost one at submission.
// At the end every record becomes, like a CUDA kernel under CUPTI:
//  * a device activity (CONCURRENT_KERNEL / GPU_MEMCPY / GPU_MEMSET) on
//    pid = device index, tid = the torch StreamId (one lane per stream),
//    linked to the CPU op that launched it (PyTorch adds its time to that
//    op's device_time_total);
//  * a PRIVATEUSE1_RUNTIME activity on the launching thread at the
//    submission time ("vnpuLaunchKernel", "vnpuMemcpyAsync", ...), the
//    start of an "ac2g" flow that ends at the device activity (the arrow
//    Perfetto / chrome://tracing draw from the CPU launch to the task).
// stop() waits (vnpuActivitySynchronize, at most a minute) for the tasks
// launched while profiling that still run on any device: PyTorch only
// synchronized the current one, and work queued on vnpu:1 while vnpu:0 is
// current would be lost otherwise. Each device is its own trace process.
// Event record/wait tasks are not shown (CUDA's default trace does not show
// them either). Times: the runtime's steady clock, moved to Kineto's Unix-epoch
// nanoseconds with the offset between the two clocks taken at start().
#pragma once

#include <IActivityProfiler.h>
#include <libkineto.h>

#include <vnpu/runtime.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace torch_vnpu::profiler {

class VNPUActivityProfilerSession : public libkineto::IActivityProfilerSession {
 public:
  VNPUActivityProfilerSession() = default;
  ~VNPUActivityProfilerSession() override;

  void start() override;
  void stop() override;
  std::vector<std::string> errors() override { return errors_; }
  void processTrace(libkineto::ActivityLogger& logger) override;
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback getLinkedActivity,
                    int64_t startTime, int64_t endTime) override;
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override;
  std::vector<libkineto::ResourceInfo> getResourceInfos() override;
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override;
  void pushCorrelationId(uint64_t id) override;
  void popCorrelationId() override;
  void pushUserCorrelationId(uint64_t id) override;
  void popUserCorrelationId() override;
  std::string getDeviceProperties() override;

 private:
  int64_t steady_to_unix_ns_ = 0;  // add to a runtime timestamp to get Kineto's time
  int64_t start_ns_ = 0, end_ns_ = 0;  // Unix ns
  bool recording_ = false;
  std::vector<vnpuActivityRecord> records_;
  std::vector<std::string> errors_;
  std::set<int> devices_;                              // seen in the trace
  std::set<std::pair<int, int64_t>> lanes_;            // (device, StreamId)
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;  // owns the activities handed to the logger
};

class VNPUActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override;
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types, const libkineto::Config& config) override;
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t ts_ms, int64_t duration_ms, const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override;

 private:
  std::string name_{"VNPUActivityProfiler"};
};

}  // namespace torch_vnpu::profiler
