#include "FutureCompletion.h"

#include <algorithm>

#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>

namespace c10d::vnpu {

namespace {

std::mutex g_live_mu;  // guards g_live
std::vector<FutureCompletion*>& live() {
  static auto* v = new std::vector<FutureCompletion*>();  // leaked: used at exit
  return *v;
}

}  // namespace

FutureCompletion::FutureCompletion() {
  std::lock_guard<std::mutex> g(g_live_mu);
  live().push_back(this);
}

FutureCompletion::~FutureCompletion() {
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    auto& v = live();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  stop("the process group was destroyed");
}

void FutureCompletion::stopAll(const std::string& reason) {
  std::vector<std::shared_ptr<FutureCompletion>> all;
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    for (FutureCompletion* f : live()) {
      if (auto p = f->weak_from_this().lock()) all.push_back(std::move(p));
    }
  }
  for (auto& f : all) f->stop(reason);
}

void FutureCompletion::complete(Pending& p, const std::string& reason) {
  try {
    if (reason.empty() && p.op->state() == CollectiveOp::State::kDone) {
      c10::StreamGuard guard(p.stream);
      p.future->markCompleted(c10::IValue(p.outputs));
    } else {
      const std::string msg = reason.empty() ? p.op->error()
                                             : c10::str("vccl: ", describe(*p.op), " did not complete: ", reason);
      p.future->setError(std::make_exception_ptr(
          c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg)));
    }
  } catch (const std::exception& e) {
    // A callback that throws outside then()'s own handling must not end the
    // completion thread (the other futures would never complete).
    LOG(ERROR) << "vccl: a callback of the future of " << describe(*p.op) << " raised: " << e.what();
  }
}

void FutureCompletion::completeAtIssue(const OpPtr& op, const c10::intrusive_ptr<c10::ivalue::Future>& future,
                                       const std::vector<at::Tensor>& outputs, c10::Stream stream) {
  if (op->state() == CollectiveOp::State::kFailed) {
    future->setError(std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, op->error())));
    return;
  }
  c10::StreamGuard guard(stream);
  future->markCompleted(c10::IValue(outputs));
}

void FutureCompletion::add(const OpPtr& op, c10::intrusive_ptr<c10::ivalue::Future> future,
                           std::vector<at::Tensor> outputs, c10::Stream stream) {
  Pending p{op, std::move(future), std::move(outputs), stream};
  if (op->completed()) {  // VNPU_LAUNCH_BLOCKING=1, an empty batch, a group that failed before
    complete(p);
    return;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) {
      complete(p, "the process group was shut down");
      return;
    }
    pending_.push_back(std::move(p));
    if (threads_.empty()) threads_.emplace_back([this] { loop(); });
  }
  // Wakes this thread when the op finishes (at once if it already has).
  op->onFinish([weak = weak_from_this()] {
    if (auto self = weak.lock()) {
      std::lock_guard<std::mutex> g(self->mu_);
      self->cv_.notify_all();
    }
  });
}

void FutureCompletion::loop() {
  std::unique_lock<std::mutex> g(mu_);
  ++idle_;
  while (true) {
    std::list<Pending> done;
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto next = std::next(it);
      if (it->op->completed()) done.splice(done.end(), pending_, it);
      it = next;
    }
    if (!done.empty()) {
      // A callback may wait for a later collective of this group: keep a thread free to complete it.
      if (--idle_ == 0 && !stop_ && threads_.size() < kMaxThreads) threads_.emplace_back([this] { loop(); });
      g.unlock();  // callbacks may take the GIL, or issue collectives (add())
      for (auto& p : done) complete(p);
      done.clear();  // the outputs' last references may be dropped here
      g.lock();
      ++idle_;
      continue;
    }
    if (stop_) {
      --idle_;
      return;
    }
    cv_.wait(g);
  }
}

void FutureCompletion::stop(const std::string& reason) {
  std::list<Pending> left;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    stop_ = true;
    cv_.notify_all();
  }
  // Threads may start others until they see stop_; none starts after that.
  for (size_t i = 0;; ++i) {
    std::thread t;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (i >= threads_.size()) break;
      t = std::move(threads_[i]);
    }
    if (t.joinable()) t.join();
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    left.swap(pending_);
  }
  for (auto& p : left) complete(p, p.op->completed() ? std::string() : reason);
}

}  // namespace c10d::vnpu
