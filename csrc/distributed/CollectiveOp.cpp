#include "CollectiveOp.h"

#include <c10/util/StringUtil.h>

namespace c10d::vnpu {

CollectiveOp::~CollectiveOp() {
  if (declared) vnpuEventDestroy(declared);
}

void CollectiveOp::markReady() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (state_ == State::kQueued) state_ = State::kReady;
  }
  cv_.notify_all();
}

bool CollectiveOp::waitReady(Clock::time_point deadline) {
  std::unique_lock<std::mutex> g(mu_);
  return cv_.wait_until(g, deadline, [&] { return state_ != State::kQueued; });
}

bool CollectiveOp::isReady() {
  std::lock_guard<std::mutex> g(mu_);
  return state_ != State::kQueued;
}

void CollectiveOp::finish(const std::string& error, int source_rank) {
  for (auto& member : batch) member->finish(error);
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (state_ == State::kDone || state_ == State::kFailed) return;
    state_ = error.empty() ? State::kDone : State::kFailed;
    error_ = error;
    if (!error.empty() && !group_ranks_note.empty() && error.find(group_ranks_note) == std::string::npos) {
      error_ += group_ranks_note;
    }
    if (source_rank >= 0) source_rank_ = source_rank;
    finished_ = Clock::now();
    callbacks.swap(on_finish_);
  }
  cv_.notify_all();
  for (auto& cb : callbacks) cb();
}

void CollectiveOp::markReportPosted() {
  {
    std::lock_guard<std::mutex> g(mu_);
    report_posted_ = true;
  }
  cv_.notify_all();
}

bool CollectiveOp::waitReportPosted(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  return cv_.wait_for(g, timeout, [&] { return report_posted_; });
}

void CollectiveOp::onFinish(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (state_ != State::kDone && state_ != State::kFailed) {
      on_finish_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

bool CollectiveOp::waitDone(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  auto done = [&] { return state_ == State::kDone || state_ == State::kFailed; };
  if (timeout.count() <= 0) {
    cv_.wait(g, done);
    return true;
  }
  return cv_.wait_for(g, timeout, done);
}

CollectiveOp::State CollectiveOp::state() {
  std::lock_guard<std::mutex> g(mu_);
  return state_;
}

bool CollectiveOp::completed() {
  auto s = state();
  return s == State::kDone || s == State::kFailed;
}

std::string CollectiveOp::error() {
  std::lock_guard<std::mutex> g(mu_);
  return error_;
}

int CollectiveOp::sourceRank() {
  std::lock_guard<std::mutex> g(mu_);
  return source_rank_;
}

float CollectiveOp::durationMs() {
  std::lock_guard<std::mutex> g(mu_);
  if (state_ != State::kDone && state_ != State::kFailed) return -1.f;
  return std::chrono::duration<float, std::milli>(finished_ - issued).count();
}

std::string describe(const CollectiveOp& op) {
  switch (op.type) {
    case OpType::SEND:
      return c10::str(op.name, " to rank ", op.peer, " (tag ", op.tag, ")");
    case OpType::RECV:
      return c10::str(op.name, " from rank ", op.peer, " (tag ", op.tag, ")");
    case OpType::RECVANYSOURCE:
      return c10::str(op.name, " from any rank (tag ", op.tag, ")");
    case OpType::COALESCED:
      return c10::str("coalesced batch of ", op.batch.size(), " operations");
    default:
      return c10::str(op.name, " #", op.seq);
  }
}

}  // namespace c10d::vnpu
