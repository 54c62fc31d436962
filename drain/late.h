// Observed removal (issue 47): a terminating pod's own node sees every new connection that
// reaches the pod, whoever sent it (proxy/new_flows.h reads them from connection tracking).
// Once the pod's removal is confirmed nothing should open one; whoever still does is a *late
// sender* — an ingress controller with its own EndpointSlice watch, an Envoy fed by another
// control plane, a cloud load balancer with IP targets, a node whose kernel missed the removal.
// This file names them from the cluster's state and keeps them per drain, bounded: what the
// coordinator shows in /debug/state, the pod's Events and the metrics.
//
// Pure logic: no sockets, no clock of its own (every call is given the time).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/ip.h"
#include "model/snapshot.h"

namespace endpointd::drain {

// Who a source address is, as the cluster's state knows it.
struct Source {
  enum class Kind { kPod, kNode, kExternal };
  Kind kind = Kind::kExternal;
  model::IpAddr address;
  // kPod: "namespace/name", or empty for an address of a node's pod range that no pod the
  // state lists holds (a pod just made or just gone); kNode: the Node's name.
  std::string name;
  std::string node;  // kPod: the node it runs on (or whose pod range holds the address)
  // "pod", "node" or "external": the `source` label of endpointd_drain_late_connections_total.
  const char* kind_label() const;
  // "pod ingress/nginx-1 on node-c (10.244.2.7)", "node node-c (10.0.0.3)",
  // "outside the cluster (203.0.113.9)".
  std::string str() const;
};

// A Node's address first (another node's kernel, a hostNetwork component and SNATed NodePort
// traffic all send from one), then a pod's (hostNetwork pods share their node's), then a
// node's pod range (spec.podCIDRs), else outside the cluster.
Source attribute(const model::Snapshot& snap, const model::IpAddr& src);

// The late senders of one drain, by source, bounded: the first kMaxSources sources are kept
// by name with their counts; connections from any later one are summed in others().
class LateSenders {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  static constexpr size_t kMaxSources = 8;
  struct Entry {
    Source source;
    uint64_t count = 0;
    TimePoint first{}, last{};
  };
  // A new connection from `src`; returns the kind of its source. `who` names a source not kept
  // yet (attribution looks through the state, so it is asked once a kept source, and once a
  // connection only for sources past the bound).
  Source::Kind add(const model::IpAddr& src, TimePoint at, const std::function<Source()>& who);
  const std::vector<Entry>& entries() const { return entries_; }
  uint64_t total() const { return total_; }
  uint64_t others() const { return others_; }
  bool empty() const { return total_ == 0; }
  // When the newest connection arrived (any source, kept or not).
  TimePoint last() const { return last_; }
  // "pod ingress/nginx-1 on node-c (10.244.2.7): 12, node node-c (10.0.0.3): 3, 2 more from
  // sources past the bound" — the most connections first.
  std::string summary() const;

 private:
  std::vector<Entry> entries_;
  uint64_t total_ = 0, others_ = 0;
  TimePoint last_{};
};

// One new connection to a watched address (proxy::NewFlow without the ports: who and when).
struct SeenFlow {
  model::IpAddr src, dst;
  std::chrono::steady_clock::time_point at{};
};

// This node's terminating pods and the new connections that reached them. A pod is watched
// from its drain's start; connections before its removal was confirmed are expected (counted,
// not named); after it, until the release, they are late senders; after the release they are
// kept apart for `window`, or until another pod holds the address (a reused address is that
// pod's traffic, not a late sender's).
class LateWatch {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // One drain as the coordinator sees it at a pass.
  struct Pod {
    model::IpAddr ip;
    std::string uid;                    // a drain belongs to one pod
    std::string name;                   // "namespace/name", for what is shown
    std::optional<TimePoint> removed;   // its removal confirmed
    std::optional<TimePoint> released;  // its prestop answered
    // When its drain started: of two drains under way at one address (a pod killed at its
    // grace, never released, whose address a new pod got), the newer is the pod that holds it.
    TimePoint start{};
  };
  struct Record {
    Pod pod;
    uint64_t before_removal = 0;         // new connections while it was being removed (expected)
    LateSenders late;                    // after its removal was confirmed, before its release
    LateSenders after_release;           // in the window after the release
    TimePoint until = TimePoint::max();  // when the watch of its address ends
  };

  explicit LateWatch(std::chrono::milliseconds window) : window_(window) {}

  // The drains at this pass, and this node's name and state (to see an address taken by
  // another pod). A pod no longer listed keeps its record until its window ends.
  void update(const std::vector<Pod>& pods, const std::string& node, const model::Snapshot* snap,
              TimePoint now);
  // The addresses to watch (hand them to the flow watch after each update).
  std::set<model::IpAddr> addresses() const;
  // New connections seen since the last call, attributed from `snap` (null: every source is
  // "outside the cluster").
  void observe(const std::vector<SeenFlow>& flows, const model::Snapshot* snap);
  // The record of a pod's drain, by its UID (null: none).
  const Record* record(const std::string& uid) const;
  // Records whose watch ended by `now`, removed from the watch: whoever sent after a release
  // is told once, when its window is over.
  std::vector<Record> take_finished(TimePoint now);

  struct Stats {
    uint64_t flows = 0;      // connections observed
    uint64_t unwatched = 0;  // to an address no record watched at that moment
    // Late connections by the kind of their source (Source::Kind's order): after a removal,
    // before and after the release.
    uint64_t late[3] = {0, 0, 0};
    uint64_t after_release[3] = {0, 0, 0};
  };
  const Stats& stats() const { return stats_; }

 private:
  std::chrono::milliseconds window_;
  std::map<std::string, Record> records_;  // by pod UID
  Stats stats_;
};

// /debug/state's `late` of a drain: {"before_removal":N,"after_removal":{…},"after_release":{…}},
// each {"total":N,"others":N,"senders":[{"source":"pod","name":…,"node":…,"address":…,
// "count":N}]}.
std::string late_json(const LateWatch::Record& r);

}  // namespace endpointd::drain
