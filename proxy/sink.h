// The proxy sink: applies snapshots to the kernel's endpointd tables. Plans the change,
// sends one batch, and only after the kernel committed it reports applied(g) to the board.
// A rejected batch is logged and counted, then repaired by a full resync with bounded,
// jittered backoff while the last good rules keep serving.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

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

// The UDP service addresses endpointd serves from `snap` on a node with context `node`
// (cluster, external and load-balancer IPs with the service port; the node's NodePort
// addresses with the node port), each with the endpoints a connection to it may be bound to.
// After a full sync, a UDP entry to one of them is stale when it is DNAT'd to none of those
// endpoints (its endpoint left while no agent watched: a restart), or when it is not DNAT'd
// at all while the address now has endpoints (it was made while there were none). Either way
// the client's datagrams keep going nowhere until the entry is deleted.
class UdpServiceIndex {
 public:
  UdpServiceIndex(const model::Snapshot& snap, const NodeContext& node);
  // No UDP service address at all: a sweep has nothing to look for.
  bool empty() const { return by_address_.empty(); }
  size_t addresses() const { return by_address_.size(); }
  bool stale(const Flow& f) const;

 private:
  struct Key {
    model::IpAddr addr;
    uint16_t port = 0;
    friend auto operator<=>(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return model::IpAddrHash{}(k.addr) * 31 + k.port; }
  };
  using Targets = std::vector<Key>;  // sorted
  void add(const Key& k, const std::shared_ptr<const Targets>& targets);
  std::unordered_map<Key, std::shared_ptr<const Targets>, KeyHash> by_address_;
};

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
    uint32_t jitter_seed = 0;  // 0: seeded from the clock
    // UDP cleanup after each batch and a sweep after each full sync; null: off.
    Conntrack* conntrack = nullptr;
    HealthCheckServer* health_checks = nullptr;  // healthCheckNodePort listeners; null: off
    // kubeproxy_network_programming_duration_seconds leaves out EndpointSlice trigger times
    // before this (kube-proxy: before its change tracker started). Zero: when the sink is made.
    std::chrono::system_clock::time_point process_start{};
  };

  // `backend` and `board` must outlive the sink. Registers "proxy" on the board.
  ProxySink(Backend* backend, pipeline::AckBoard* board, Options opts);
  ~ProxySink() override;

  std::string name() const override { return "proxy"; }
  void apply(const model::SnapshotPtr& snap, const model::Delta& delta) override;

  // Any thread: the table must be fully re-synced (the monitor saw a foreign change).
  void request_resync();
  // Any thread: the host's addresses are now `ips` (the node IPs the sink was given came from
  // the host). When that changes the node's context (which addresses serve NodePorts), a full
  // sync follows; it sends only the elements that differ.
  void set_host_addresses(std::vector<model::IpAddr> ips);
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
  // kube-proxy's *_changes_pending gauges: what was given and is not yet in the kernel
  // (latest_ against applied_). Under mu_.
  void publish_pending();
  // After a committed batch: conntrack cleanup (after a full sync, and at the first synced
  // commit, a sweep of every UDP entry to a served address) and the health-check listeners.
  void after_commit(const model::Snapshot* before, const model::Snapshot& now,
                    const model::Delta& d, bool full);
  // kube-proxy's network programming duration: per service in the committed delta, from its
  // newest EndpointSlice trigger time to now, once per trigger time. At the first sync (no
  // `before`) the trigger times are only noted.
  void observe_programming(const model::Snapshot* before, const model::Snapshot& now,
                           const model::Delta& d);
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
  bool swept_ = false;  // a UDP conntrack sweep succeeded since the process started
  // Per service, the newest trigger time already observed (or noted at the first sync).
  std::map<model::ServiceKey, std::chrono::system_clock::time_point> last_trigger_;
  std::thread resync_;
};

}  // namespace endpointd::proxy
