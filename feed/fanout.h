// A parallel for-each for the feed's fan-out: one change notifies every subscriber, and each
// notification is a gRPC write (a syscall); on a node with more than one core, a few threads
// share the list so that the last subscriber is written to sooner.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace endpointd::feed {

class FanOut {
 public:
  // `threads` is the parallelism including the caller of run(); 0 picks one per core, at most
  // kMaxThreads. 1 runs everything on the caller.
  explicit FanOut(size_t threads);
  ~FanOut();
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // Calls fn(i) for every i in [0, n) and returns when every call returned. The range is cut
  // into contiguous parts, one per thread, but only when each part gets at least kMinPerThread
  // items: below that a hand-off costs more than it saves. One run() at a time.
  void run(size_t n, const std::function<void(size_t)>& fn);

  size_t threads() const { return workers_.size() + 1; }

  static constexpr size_t kMaxThreads = 4;
  static constexpr size_t kMinPerThread = 64;

 private:
  void work(size_t index);

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t round_ = 0;  // bumped by run(); each worker runs once per round
  size_t pending_ = 0;  // workers still busy in this round
  size_t parts_ = 0;    // how many parts this round has (the caller takes part 0)
  size_t n_ = 0;
  const std::function<void(size_t)>* fn_ = nullptr;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace endpointd::feed
