// Acknowledgement board bookkeeping.
#include "pipeline/ack_board.h"

#include <algorithm>

namespace endpointd::pipeline {

void AckBoard::add(const std::string& consumer, model::RouteView view) {
  {
    std::lock_guard lock(mu_);
    Entry e;
    e.consumer = consumer;
    e.view = view;
    entries_.try_emplace(consumer, std::move(e));
  }
  cv_.notify_all();
}

void AckBoard::remove(const std::string& consumer) {
  std::vector<std::function<void()>> obs;
  {
    std::lock_guard lock(mu_);
    entries_.erase(consumer);
    obs = observers_;
  }
  cv_.notify_all();
  for (auto& f : obs) f();
}

void AckBoard::applied(const std::string& consumer, model::SnapshotPtr snap) {
  std::vector<std::function<void()>> obs;
  {
    std::lock_guard lock(mu_);
    auto& e = entries_[consumer];
    e.consumer = consumer;
    // Generations only grow; an out-of-order report never moves a consumer back.
    if (!e.snapshot || snap->generation >= e.snapshot->generation) {
      e.snapshot = std::move(snap);
      e.applied_at = Clock::now();
    }
    obs = observers_;
  }
  cv_.notify_all();
  for (auto& f : obs) f();
}

void AckBoard::set_holdouts(const std::string& consumer, std::vector<Holdout> holdouts) {
  std::vector<std::function<void()>> obs;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(consumer);
    if (it == entries_.end()) return;
    it->second.holdouts = std::move(holdouts);
    obs = observers_;
  }
  for (auto& f : obs) f();
}

void AckBoard::set_cache_ttl(const std::string& consumer, std::chrono::milliseconds ttl) {
  std::vector<std::function<void()>> obs;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(consumer);
    if (it == entries_.end()) return;
    it->second.cache_ttl = ttl;
    obs = observers_;
  }
  for (auto& f : obs) f();
}

void AckBoard::set_answers(const std::string& consumer,
                           std::shared_ptr<const AnswerExpiry> answers) {
  std::vector<std::function<void()>> obs;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(consumer);
    if (it == entries_.end()) return;
    it->second.answers = std::move(answers);
    obs = observers_;
  }
  for (auto& f : obs) f();
}

std::vector<AckBoard::Entry> AckBoard::entries() const {
  std::lock_guard lock(mu_);
  std::vector<Entry> out;
  for (const auto& [k, e] : entries_) out.push_back(e);
  return out;
}

uint64_t AckBoard::min_generation() const {
  std::lock_guard lock(mu_);
  if (entries_.empty()) return 0;
  uint64_t g = UINT64_MAX;
  for (const auto& [k, e] : entries_) g = std::min(g, e.generation());
  return g;
}

bool AckBoard::wait_all(uint64_t g, Clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] {
    return std::all_of(entries_.begin(), entries_.end(),
                       [&](const auto& kv) { return kv.second.generation() >= g; });
  });
}

void AckBoard::on_change(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  observers_.push_back(std::move(fn));
}

}  // namespace endpointd::pipeline
