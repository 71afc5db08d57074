#include "ProgressEngine.h"

#include "../ops/HostOpenMP.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/thread_name.h>
#include <vnpu/runtime.h>

namespace c10d::vnpu {
namespace {

std::string seconds(std::chrono::milliseconds ms) {
  return c10::str(static_cast<double>(ms.count()) / 1000.0, " s");
}

}  // namespace

ProgressEngine::ProgressEngine(std::string group_name) : group_name_(std::move(group_name)) {}

ProgressEngine::~ProgressEngine() { shutdown("the process group was destroyed"); }

void ProgressEngine::start(std::shared_ptr<Transport> transport) {
  transport_ = std::move(transport);
  thread_ = std::thread([this] { loop(); });
}

void ProgressEngine::submit(OpPtr op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stop_) {
      queue_.push_back(std::move(op));
      cv_.notify_all();
      return;
    }
  }
  op->finish(c10::str("vccl: ", describe(*op), " was issued after the process group was shut down"));
}

void ProgressEngine::poison(const std::string& reason) {
  std::lock_guard<std::mutex> g(mu_);
  if (poison_.empty()) poison_ = reason;
}

std::string ProgressEngine::poisoned() {
  std::lock_guard<std::mutex> g(mu_);
  return poison_;
}

void ProgressEngine::drain(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  {
    std::unique_lock<std::mutex> g(mu_);
    if (stop_) return;
    idle_cv_.wait_until(g, deadline, [&] { return queue_.empty() && !busy_; });
  }
  if (transport_) transport_->drain(deadline);
}

void ProgressEngine::shutdown(const std::string& reason) {
  std::deque<OpPtr> queued;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    queued.swap(queue_);
  }
  cv_.notify_all();
  if (transport_) transport_->shutdown(reason);
  for (auto& op : queued) op->finish(c10::str("vccl: ", describe(*op), " did not run: ", reason));
  if (thread_.joinable()) thread_.join();
}

void ProgressEngine::loop() {
  c10::setThreadName("vccl-progress");
  // The transports copy and reduce device memory on this thread (and on threads it starts): it is
  // device work for VNPU_SANITIZE check 4 (Note [Protection keys] in the runtime). No-op otherwise.
  vnpuSanitizerDeviceAccessBegin();
  for (;;) {
    OpPtr op;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      op = queue_.front();
    }
    // Wait (in slices, to notice shutdown) for the issuing stream to reach the op.
    const auto deadline = op->issued + op->timeout;
    bool ready = false;
    for (;;) {
      auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      ready = op->waitReady(slice);
      if (ready || Clock::now() >= deadline) break;
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return;  // shutdown() fails the queued ops
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return;
      queue_.pop_front();
      busy_ = true;
    }
    struct Idle {
      ProgressEngine* e;
      ~Idle() {
        {
          std::lock_guard<std::mutex> g(e->mu_);
          e->busy_ = false;
        }
        e->idle_cv_.notify_all();
      }
    } idle{this};
    if (!ready) {
      std::string msg = c10::str(
          "vccl: ", describe(*op), " in group ", group_name_, " did not start within its timeout (",
          seconds(op->timeout), "): the work queued before it on its vnpu stream did not finish "
          "(a kernel, or the wait() of an earlier collective, is stuck)");
      poison(msg);
      op->finish(msg);
      continue;
    }
    std::string first_failure = poisoned();
    if (!first_failure.empty()) {
      op->finish(c10::str("vccl: ", describe(*op), " was not run because the process group failed earlier "
                          "(destroy it and create a new one): ", first_failure));
      continue;
    }
    run(op);
  }
}

void ProgressEngine::run(const OpPtr& op) {
  // CPU ops a transport runs here (scaling, widening) may start an OpenMP pool on this thread;
  // release it so stream workers keep the only busy one (Note [One OpenMP pool]).
  struct ReleasePool {
    ~ReleasePool() { at::vnpu::release_host_openmp_pool(); }
  } release;
  try {
    transport_->start(op);
  } catch (const TransportError& e) {
    if (e.fatal()) poison(e.what());
    op->finish(e.what());
  } catch (const c10::Error& e) {
    std::string msg = c10::str("vccl: ", describe(*op), " failed: ", e.msg());
    poison(msg);
    op->finish(msg);
  } catch (const std::exception& e) {
    std::string msg = c10::str("vccl: ", describe(*op), " failed: ", e.what());
    poison(msg);
    op->finish(msg);
  }
}

}  // namespace c10d::vnpu
