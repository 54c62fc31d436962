// Kubernetes Events on the pods this node drains (events.k8s.io/v1, reportingController
// endpointd.io/agent, the node as reportingInstance), as `kubectl describe pod` shows them.
//
// With client-go's EventRecorder habits: a repeat of the same event within the series window
// patches the first one's series instead of writing another; a per-object and a global token
// bucket; a bounded queue written by one thread. record() never waits on the API server: an
// event it cannot queue, or that the limits refuse, is dropped and counted
// (endpointd_events_total{result}); an API error is counted and not retried. So a slow or
// throttling API server never holds a drain.
//
// DrainEvents turns the drain coordinator's published state (/debug/state's drains) into
// events — state out, not calls in: it reads what drain/ publishes and keeps what it told.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/result.h"
#include "model/snapshot.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Histogram;
}  // namespace prometheus

namespace endpointd::daemon {

struct PodEvent {
  std::string ns, pod, uid;
  std::string type = "Normal";  // or "Warning"
  std::string reason;           // DrainRemoved, DrainReleased, DrainUnconfirmed
  std::string action = "Drain";
  std::string note;
};

struct EventRecorderOptions {
  std::string node;    // reportingInstance
  size_t queue = 256;  // events waiting to be written; past it, dropped
  // Per object (pod): client-go's spam filter, a burst of 25 refilled one per 5 minutes.
  double object_burst = 25;
  std::chrono::milliseconds object_refill{300000};
  // Every event of this agent: 25 at once, 5 a second.
  double global_burst = 25;
  double global_per_second = 5;
  // A repeat (same pod, reason and note) within this patches the series of the first.
  std::chrono::milliseconds series_window{360000};
  std::chrono::milliseconds request_timeout{5000};
  std::function<std::chrono::system_clock::time_point()> clock;  // null: system_clock::now
  prometheus::Registry* registry = nullptr;
};

class EventRecorder {
 public:
  struct Reply {
    long status = 0;
  };
  // One request to the API server: method, path, JSON body, content type. An error: no answer.
  using Send = std::function<Result<Reply>(std::string_view method, const std::string& path,
                                           const std::string& body, std::string_view content_type,
                                           std::chrono::milliseconds timeout)>;
  EventRecorder(EventRecorderOptions opts, Send send);
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues the event, or drops and counts it. Never waits on the API server.
  void record(PodEvent e);

  struct Counts {
    uint64_t written = 0;  // created
    uint64_t patched = 0;  // repeats folded into a series
    uint64_t dropped_queue = 0;
    uint64_t dropped_rate_limit = 0;
    uint64_t failed = 0;  // the API server refused or did not answer
  };
  Counts counts() const;
  // Waits until everything queued was sent (tests).
  bool flush(std::chrono::milliseconds timeout);
  void stop();

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::system_clock::time_point at{};
  };
  struct Series {
    std::string name;
    uint64_t count = 1;
    std::chrono::system_clock::time_point last{};
  };
  bool take(Bucket& b, double burst, double per_second, std::chrono::system_clock::time_point now);
  void run();
  void send_one(const PodEvent& e);
  void count(const char* result, uint64_t Counts::*field);
  std::chrono::system_clock::time_point now() const;

  EventRecorderOptions opts_;
  Send send_;
  prometheus::Family<prometheus::Counter>* metric_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PodEvent> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  Counts counts_;
  Bucket global_;
  std::map<std::string, Bucket> objects_;  // by namespace/name/uid
  std::map<std::string, Series> series_;   // by pod, reason and note (the worker's)
  uint64_t names_ = 0;
  std::thread thread_;
};

// The JSON of an events.k8s.io/v1 Event (for the recorder and the tests).
std::string event_json(const PodEvent& e, const std::string& name, const std::string& node,
                       std::chrono::system_clock::time_point at);

// From successive states of the drain coordinator, the events each drain has not told yet:
// DrainRemoved once its endpoint is confirmed removed, DrainReleased (with the outcome) and,
// when unconfirmed, a Warning DrainUnconfirmed naming who may still route.
class DrainEvents {
 public:
  // `drains_json`: Coordinator::drains_json(); `members`: the drain's members (nodes).
  std::vector<PodEvent> observe(std::string_view drains_json, size_t members);

 private:
  std::map<std::string, unsigned> told_;  // by pod uid and address: bits of what was told
};

// From successive snapshots and the cluster watermark: Propagated, once an endpoint of a pod on
// this node that turned ready is in the state every member node's consumers (and their feed
// subscribers) applied — the cluster watermark reached the slice revision that showed it ready.
//
// And the cluster-wide programming latency (endpointd_cluster_programming_duration_seconds):
// for each endpoint of this node that turned ready or stopped being ready (not ready,
// terminating, or gone while ready), from its service's EndpointSlice trigger time
// (endpoints.kubernetes.io/last-change-trigger-time) to the cluster watermark covering the
// revision that showed the change. Measured by the endpoint's own node only, so each change is
// counted once in the cluster; changes without a trigger time, or before this agent started, are
// left out, as kube-proxy leaves them out of network_programming_duration_seconds.
class PropagationEvents {
 public:
  PropagationEvents() = default;
  // `cluster_programming`: where the latencies go (null: not measured).
  // `started`: trigger times before it are not this agent's to measure.
  PropagationEvents(prometheus::Histogram* cluster_programming,
                    std::chrono::system_clock::time_point started)
      : programming_(cluster_programming), started_(started) {}
  // Endpoints on `node` ready now and not in the previous snapshot seen start waiting (none at
  // the first snapshot: those were ready before this agent looked); so do endpoints ready in
  // the previous one and not now (for the latency only).
  void on_snapshot(const model::Snapshot& snap, const std::string& node,
                   std::chrono::steady_clock::time_point now);
  // `wall`: now by the wall clock, which trigger times are in.
  std::vector<PodEvent> observe(
      uint64_t cluster_watermark, size_t members, std::chrono::steady_clock::time_point now,
      std::chrono::system_clock::time_point wall = std::chrono::system_clock::now());
  size_t pending() const { return pending_.size(); }
  // Latencies observed so far (what the histogram got; for tests and the log).
  uint64_t programmed() const { return programmed_; }

  // The histogram's buckets: kube-proxy's network_programming_duration_seconds (0.25 s, 0.5 s,
  // every second to 59 s, every 5 s to 115 s, every 30 s to 300 s) with 10, 25, 50 and 100 ms
  // below them, since a cluster that keeps up programs in well under a quarter second.
  static std::vector<double> buckets();

 private:
  struct Pending {
    PodEvent base;
    std::string address;
    uint64_t revision = 0;
    std::chrono::steady_clock::time_point since;
    bool ready = true;  // false: stopped being ready; no event, the latency only
    std::chrono::system_clock::time_point trigger{};  // zero: no latency to measure
  };
  prometheus::Histogram* programming_ = nullptr;
  std::chrono::system_clock::time_point started_{};
  uint64_t programmed_ = 0;
  bool first_ = true;
  uint64_t generation_ = 0;
  // The services of the last snapshot seen (its chunked list: shared, not copied). The next
  // one is compared by model::diff_services, which skips the chunks both share: a look costs
  // the services that changed, not all of them (rebuilding a map of 10,000 services took
  // ~3 ms a look, and its bursts showed in the dataplane's change-to-commit p99).
  model::ServiceList seen_;
  // By pod uid and address, "+" (turned ready) or "-"; at most kMaxPending.
  std::map<std::string, Pending> pending_;
};

// Reads the coordinator's state every `every` and records what DrainEvents and
// PropagationEvents find (so the programming latency is measured to within `every`).
class DrainEventPoller {
 public:
  struct Inputs {
    std::function<std::string()> drains_json;   // Coordinator::drains_json
    std::function<std::string()> cluster_json;  // Coordinator::cluster_json ("null": off)
    // Coordinator::state_version (empty: look every time). When it and the snapshot are what
    // they were, nothing the poller reads changed: it renders and parses nothing.
    std::function<uint64_t()> version;
    std::function<model::SnapshotPtr()> snapshot;
    // The first synced snapshot the update loop published (null until then): what was ready
    // before this agent looked. Without it, the poller's first look is taken as that.
    std::function<model::SnapshotPtr()> first_synced;
    std::string node;
    // endpointd_cluster_programming_duration_seconds (null: not measured) and the agent's start.
    prometheus::Histogram* cluster_programming = nullptr;
    std::chrono::system_clock::time_point started{};
  };
  // `recorder` null: Events are off; the latency is still measured.
  DrainEventPoller(Inputs in, EventRecorder* recorder,
                   std::chrono::milliseconds every = std::chrono::milliseconds(100));
  ~DrainEventPoller();
  void stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace endpointd::daemon
