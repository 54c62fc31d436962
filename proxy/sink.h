// The proxy sink: applies snapshots to the kernel's endpointd tables. Plans the change,
// sends one batch, and only after the kernel committed it reports applied(g) to the board.
// A rejected batch is logged and counted, then repaired by a full resync with bounded,
// jittered backoff while the last good rules keep serving.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "pipeline/ack_board.h"
#include "pipeline/sink.h"
#include "proxy/backend.h"
#include "proxy/conntrack.h"
#include "proxy/planner.h"

namespace prometheus {
class Registry;
}

namespace endpointd::proxy {

class HealthCheckServer;

// The UDP conntrack entries to delete after `before` became `after` (either may be null):
// entries still bound to an endpoint that is no longer used, and, for a UDP port that had no
// endpoint and now has some, the entries that blackholed its addresses (NAT is chosen only on
// a connection's first packet); for a node port, entries to that port on any address.
std::vector<FlowMatch> stale_udp_flows(const model::ServiceState* before,
                                       const model::ServiceState* after);

class ProxySink : public pipeline::Sink {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    NodeContext node;
    prometheus::Registry* registry = nullptr;  // may be null
    // healthy() is false when an update was queued this long ago and is still not applied
    // (kube-proxy's healthz-bind-address semantics).
    std::chrono::milliseconds health_timeout{std::chrono::seconds(60)};
    std::chrono::milliseconds backoff_min{std::chrono::milliseconds(100)};
    std::chrono::milliseconds backoff_max{std::chrono::seconds(10)};
    uint32_t jitter_seed = 0;                    // 0: seeded from the clock
    Conntrack* conntrack = nullptr;              // UDP cleanup after each batch; null: off
    HealthCheckServer* health_checks = nullptr;  // healthCheckNodePort listeners; null: off
  };

  // `backend` and `board` must outlive the sink. Registers "proxy" on the board.
  ProxySink(Backend* backend, pipeline::AckBoard* board, Options opts);
  ~ProxySink() override;

  std::string name() const override { return "proxy"; }
  void apply(const model::SnapshotPtr& snap, const model::Delta& delta) override;

  // Any thread: the table must be fully re-synced (the monitor saw a foreign change).
  void request_resync();
  // The daemon calls this when it hands the sink an update (UpdateLoop::on_publish).
  void note_queued(Clock::time_point t = Clock::now());
  bool healthy(Clock::time_point now = Clock::now()) const;
  // True after the first successful full sync (for /readyz).
  bool synced() const { return synced_.load(); }
  uint64_t failures() const { return failures_.load(); }
  uint64_t full_syncs() const { return full_syncs_.load(); }
  uint64_t skipped() const { return skipped_.load(); }
  // Service updates the tables could not hold (each logged naming the service and element).
  uint64_t rejected() const { return rejected_.load(); }
  uint64_t conntrack_deleted() const { return conntrack_deleted_.load(); }
  uint64_t conntrack_failures() const { return conntrack_failures_.load(); }
  // Waits until no resync is pending (tests).
  bool wait_idle(std::chrono::milliseconds timeout);

  // For render and debugging: the model as last planned.
  const Planner* planner() const { return planner_.get(); }

 private:
  struct Metrics;
  bool full_sync_locked(const model::SnapshotPtr& snap);
  void resync_loop();
  void record_success(const model::SnapshotPtr& snap, bool full, Clock::time_point started);
  void count_changes(const model::Snapshot* old, const model::Snapshot& snap,
                     const model::Delta& d);
  // After a committed batch: conntrack cleanup and the health-check listeners.
  void after_commit(const model::Snapshot* before, const model::Snapshot& now,
                    const model::Delta& d, bool full);
  // Follows this node's Node object; true when the context changed (a full sync is due).
  bool follow_node(const model::Snapshot& snap);

  Backend* backend_;
  pipeline::AckBoard* board_;
  Options opts_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Planner> planner_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  model::SnapshotPtr latest_;   // newest snapshot given
  model::SnapshotPtr applied_;  // newest snapshot in the kernel
  model::Delta pending_;        // applied_ -> latest_, merged from the deltas given
  bool need_full_ = true;
  bool stopping_ = false;
  int attempt_ = 0;
  Clock::time_point next_try_{};
  Clock::time_point last_queued_{};
  Clock::time_point last_applied_{};
  uint32_t rng_;
  std::atomic<bool> synced_{false};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> full_syncs_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> conntrack_deleted_{0};
  std::atomic<uint64_t> conntrack_failures_{0};
  std::thread resync_;
};

}  // namespace endpointd::proxy
