// The update loop: one thread owns the Store, drains whatever events have queued, builds the
// next Snapshot and hands it to every sink's own mailbox. It never waits on a sink.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "model/event.h"
#include "model/snapshot.h"
#include "pipeline/sink.h"
#include "pipeline/store.h"

namespace prometheus {
class Registry;
}

namespace endpointd::pipeline {

class UpdateLoop {
 public:
  struct Options {
    std::set<model::ObjectKind> expected_kinds = {model::ObjectKind::kService,
                                                  model::ObjectKind::kEndpointSlice};
    prometheus::Registry* registry = nullptr;
  };

  explicit UpdateLoop(Options opts);
  ~UpdateLoop();
  UpdateLoop(const UpdateLoop&) = delete;
  UpdateLoop& operator=(const UpdateLoop&) = delete;

  // Before start(). The sink must outlive the loop; it runs on a thread of its own.
  void add_sink(Sink* sink);
  // Called on the loop thread for each new snapshot, before sinks get it and before it is
  // current. Keep it cheap.
  void on_publish(std::function<void(const model::SnapshotPtr&)> fn);

  void start();
  void stop();

  // Thread-safe; never blocks on the loop.
  void post(model::Event ev);

  // The newest published snapshot (never null once started: generation 0 is empty).
  model::SnapshotPtr current() const;
  // Waits until a published snapshot satisfies `pred`; returns it, or null at the timeout.
  model::SnapshotPtr wait_for(const std::function<bool(const model::Snapshot&)>& pred,
                              std::chrono::milliseconds timeout) const;

  uint64_t events_applied() const { return events_applied_.load(); }

  // The longest any update has been waiting now: an event in the loop's queue or being built
  // into a snapshot ("update loop"), or a snapshot offered to a sink that has not finished
  // applying it (the sink's name). A zero age: nothing waits. What /livez bounds.
  struct Wait {
    std::string where;
    std::chrono::steady_clock::duration age{};
  };
  Wait longest_wait(std::chrono::steady_clock::time_point now) const;

 private:
  class SinkRunner;
  using DeltaPtr = std::shared_ptr<const model::Delta>;
  struct Metrics;
  void run();
  void publish(model::SnapshotPtr snap, const DeltaPtr& delta,
               std::chrono::steady_clock::time_point oldest_event);

  Store store_;
  std::unique_ptr<Metrics> metrics_;
  std::vector<std::unique_ptr<SinkRunner>> sinks_;
  std::vector<std::function<void(const model::SnapshotPtr&)>> observers_;

  mutable std::mutex mu_;                      // guards queue_, current_, stopping_
  mutable std::condition_variable cv_;         // queue_ not empty / stopping
  mutable std::condition_variable published_;  // current_ changed
  std::deque<model::Event> queue_;
  // Since when the loop has had work it has not published: the first event queued while idle.
  std::chrono::steady_clock::time_point waiting_since_{};
  model::SnapshotPtr current_;
  bool stopping_ = false;
  std::thread thread_;
  std::atomic<uint64_t> events_applied_{0};
};

}  // namespace endpointd::pipeline
