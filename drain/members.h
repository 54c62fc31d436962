// Who confirms a removal: every node whose kernel may hold endpointd's rules — every Node in
// the Node list, whether its agent runs or not (an agent that stops leaves its rules in place;
// a node whose agent is absent, restarting or silent is unknown, never confirmed). Its agent is
// reached at the Node's first InternalIP, or (--drain-members-service) at its endpoint in the
// agents' own headless Service (hostNetwork pods: the node's address, but the Service says
// which nodes run an agent now and at which address it listens).
//
// Every agent therefore watches every Node. The API server sends each of them every Node
// write: at 5,000 nodes about 17 writes a second (the kubelet's status every 5 minutes; its
// heartbeats go to Leases, which are not watched) fanned out to 5,000 watchers
// (bench/results/drain-scale.md). Membership from the agents' Service alone was cheaper but
// not true: a node whose agent left the Service still routes by the rules it left.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/ip.h"
#include "model/objects.h"
#include "model/snapshot.h"

namespace endpointd::drain {

// Node name → where its agent is reached (nullopt: a Node without an InternalIP, which can
// take no part).
using Members = std::map<std::string, std::optional<model::IpAddr>>;

// Every Node at its first InternalIP; with `service`, a node with an endpoint of that Service
// is reached at that endpoint's address (its lowest IPv4, else lowest IPv6), and a node named
// only by the Service (its Node not listed yet) is a member too. With `service` and `agents`
// (the nodes ever seen in that Service by this agent), a Node that never ran an agent is left
// out (a node the DaemonSet does not schedule to holds no endpointd rules); one that did stays
// a member while its Node exists, whether its agent is in the Service now or not.
// The nodes the cluster's decision excludes ran an agent (the root heard them report before
// they fell silent), whether or not this agent ever saw one in the agents' Service — a new agent
// (no state file yet) that starts while another node's agent is out of the Service learns that
// node here. Adds them to `seen`; returns whether any was new.
bool learn_agents(std::set<std::string>& seen, const std::set<std::string>& excluded);
Members members_of(const model::Snapshot& snap, const std::optional<model::ServiceKey>& service,
                   const std::set<std::string>* agents = nullptr);

// Nodes whose Node object was deleted while their machine may still run (`kubectl delete node`
// on a live node, a cloud controller deleting a Node whose instance was briefly missing, a
// kubelet re-registering): their kernels keep endpointd's rules, so they stay members —
// *unknown* until their agent is shown alive and counted, or has been silent past a bound.
// Silent means excluded by the cluster watermark's liveness decision (drain/aggregate.h: no
// report within the liveness window); a deleted node's agent that keeps reporting stays a
// member for as long as it does. Without a cluster watermark (per-endpoint peers), nobody can
// say it is silent: it is held `bound` from its deletion. Pure: time comes in.
class DeletedNodes {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit DeletedNodes(std::chrono::milliseconds bound) : bound_(bound) {}

  // What an earlier process of this node's agent waited for (drain/node_state.h): a member of
  // it missing from the first Node list this process observes is held as deleted.
  void seed(const Members& earlier) { last_ = earlier; }
  // The members the Node list gives now (members_of): a member missing from it is held (at its
  // last address); one that is back is a live member again.
  void observe(const Members& from_nodes, TimePoint now);
  // The cluster's exclusion decision now, when there is one (the watermark's liveness).
  void excluded(const std::set<std::string>& excluded, TimePoint now);
  // Without a cluster watermark: held nodes past `bound` from their deletion go.
  void expire_unobserved(TimePoint now);
  // `from_nodes` with the held ones added.
  Members with_held(Members from_nodes) const;
  // Whether the held set changed since the last call (the members must be handed on again).
  bool take_changed() {
    bool c = changed_;
    changed_ = false;
    return c;
  }
  // When the next held node may go (to wake for it), if any is silent.
  std::optional<TimePoint> next_expiry() const;
  std::vector<std::string> held() const;
  std::chrono::milliseconds bound() const { return bound_; }

 private:
  struct Held {
    std::optional<model::IpAddr> address;
    TimePoint deleted_at;
    std::optional<TimePoint> silent_since;
  };
  std::chrono::milliseconds bound_;
  Members last_;
  std::map<std::string, Held> held_;
  bool changed_ = false;
};

}  // namespace endpointd::drain
