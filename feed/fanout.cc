// The fan-out's worker threads.
#include "feed/fanout.h"

#include <algorithm>

namespace endpointd::feed {

FanOut::FanOut(size_t threads) {
  if (threads == 0) threads = std::max<size_t>(1, std::thread::hardware_concurrency());
  threads = std::min(threads, kMaxThreads);
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

FanOut::~FanOut() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// Part `k` of `parts` over [0, n): [begin, end).
std::pair<size_t, size_t> part(size_t n, size_t parts, size_t k) {
  return {n * k / parts, n * (k + 1) / parts};
}
}  // namespace

void FanOut::run(size_t n, const std::function<void(size_t)>& fn) {
  size_t parts = std::min(threads(), n / kMinPerThread);
  if (parts <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lock(mu_);
    n_ = n;
    fn_ = &fn;
    parts_ = parts;
    pending_ = parts - 1;
    ++round_;
  }
  start_cv_.notify_all();
  auto [begin, end] = part(n, parts, 0);
  for (size_t i = begin; i < end; ++i) fn(i);
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

void FanOut::work(size_t index) {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || round_ != seen; });
    if (stop_) return;
    seen = round_;
    if (index >= parts_) continue;  // this round has fewer parts than there are workers
    const size_t n = n_, parts = parts_;
    const auto* fn = fn_;
    lock.unlock();
    auto [begin, end] = part(n, parts, index);
    for (size_t i = begin; i < end; ++i) (*fn)(i);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace endpointd::feed
