// reset()'s helper: a full sync of thousands of services planned on two threads. A helper
// thread plans runs of services ahead (Planner::plan_ahead, in planner.cc) while the calling
// thread puts their elements in the tables, in the snapshot's order; the tables come out the
// same as when one thread plans them. The planner's one thread and its mutex are here, so
// planner.cc stays pure.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "proxy/planner.h"

namespace endpointd::proxy {

using model::ServiceState;

Status Planner::put_planned(PlannedRun& run, size_t begin, size_t end, const ServiceState& st) {
  for (size_t i = begin; i < end; ++i) {
    auto& [f, id, e] = run.elements[i];
    // Without a changes list, add_element leaves `e` as it was (it only copies it into a set).
    Status s = add_element(f, id, std::move(e), nullptr);
    if (s.ok()) continue;
    for (size_t j = begin; j < i; ++j) {
      const auto& done = run.elements[j];
      remove_element(done.family, done.id, done.element, nullptr);
    }
    return prefixed(st.key().str(), s.error());
  }
  return {};
}

// The helper plans runs of services ahead (at most kAhead runs, so its elements never hold
// more than a few thousand services' worth of memory) and this thread puts them in, in order.
// Planning a service reads only the snapshot and planned_, which stay as they are until the
// helper is joined; the tables, stats_ and services_ are this thread's alone.
void Planner::reset_with_helper(const model::Snapshot& snap,
                                std::map<model::ServiceKey, PlannedService>& previous) {
  constexpr size_t kRun = 256;
  constexpr size_t kAhead = 4;
  const size_t runs = (snap.services.size() + kRun - 1) / kRun;
  std::vector<PlannedRun> ring(kAhead);
  std::mutex mu;
  std::condition_variable cv;
  size_t planned = 0;  // runs the helper finished
  size_t taken = 0;    // runs this thread finished
  bool stop = false;
  std::thread planner([&] {
    auto it = snap.services.begin();
    for (size_t r = 0; r < runs; ++r) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || r < taken + kAhead; });
        if (stop) return;
      }
      PlannedRun& run = ring[r % kAhead];
      run.elements.clear();
      run.services.clear();
      run.skips = {};
      for (size_t i = 0; i < kRun && it != snap.services.end(); ++i, ++it) {
        plan_ahead(*it, run);
      }
      {
        std::lock_guard lock(mu);
        planned = r + 1;
      }
      cv.notify_all();
    }
  });
  auto finish = [&] {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    planner.join();
  };
  try {
    for (size_t r = 0; r < runs; ++r) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return planned > r; });
      }
      PlannedRun& run = ring[r % kAhead];
      stats_.skipped += run.skips.skipped;
      for (auto& why : run.skips.skip_reasons) stats_.skip_reasons.push_back(std::move(why));
      size_t begin = 0;
      for (auto& [p, end] : run.services) {
        Status s = put_planned(run, begin, end, *p.state);
        keep_planned(std::move(p), s, previous);
        begin = end;
      }
      {
        std::lock_guard lock(mu);
        taken = r + 1;
      }
      cv.notify_all();
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
}

}  // namespace endpointd::proxy
