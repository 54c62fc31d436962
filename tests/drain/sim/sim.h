// A deterministic simulation of the whole drain protocol, in the manner of FoundationDB's and
// TigerBeetle's: N agents with their real drain logic (drain::Machine, drain::Aggregator,
// drain::LocalMarks, ClusterFacts), a simulated clock and network, and beside each agent what
// outlives it — its node's kernel rules, the answers its DNS gave that sit in clients' caches,
// the ingress/mesh proxies subscribed to it with their last accepted config. Faults are drawn
// from a seed; the same seed replays the same run exactly.
//
// The safety invariant, checked at every release (DESIGN.md, "What confirmed means"): a release
// whose outcome is "confirmed" happens only when no node in the Node list routes to the
// endpoint in its kernel, no DNS answer that carried it is still within its TTL, and no known
// subscriber's last accepted config routes to it. Who routes is read by the oracle (oracle.h)
// from what each consumer holds, built by endpointd's planner, feed encoders and DNS zone —
// never by the routing rule (model/routing.h) the drain side asks; the DNS answers clients
// cache are the zone's answers too. Every case the check excuses is counted in the Report.
//
// Liveness: after the faults stop (every agent running, every subscriber connected and
// acknowledging, no message lost), every drain of a pod is released confirmed within `liveness`
// of its start (the pods release after removal: no application drain).
//
// What is modelled rather than run: the consumers' sinks (the kernel applies the agent's
// snapshot after a programming delay; DNS answers headless services' ready endpoints; the feed
// hub's acknowledgement rules — identities, ghosts, a grace, holdouts — as feed/hub.h states
// them), the API server (one revision counter, every agent's watch a delay behind it) and the
// kubelet (the prestop call when the pod terminates, again after an agent restart; the pod
// removed after its release or its grace period).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "drain/aggregate.h"
#include "drain/local_marks.h"
#include "drain/machine.h"

namespace endpointd::drain::sim {

using std::chrono::milliseconds;
using TimePoint = std::chrono::steady_clock::time_point;

struct Faults {
  double kill_per_s = 0;        // chance an agent is stopped, per agent and second
  milliseconds down_max{6000};  // how long a stopped agent stays down
  double pause_per_s = 0;       // chance an agent is paused (starved), per agent and second
  milliseconds pause_max{3000};
  double loss = 0, duplicate = 0;  // per peer message
  milliseconds latency_max{20};
  bool reorder = false;         // messages of one link may overtake each other
  double disconnect_per_s = 0;  // per subscriber and second
  milliseconds disconnected_max{12000};
  double nack_per_s = 0;  // a subscriber rejects what it is sent for a while
  milliseconds nacking_max{12000};
  double gone_per_s = 0;        // a subscriber that never comes back (still routing)
  double ttl_reload_per_s = 0;  // the DNS TTL changed by a reload (1–3 s)
  double node_churn_per_s = 0;  // a Node deleted and created again (its kernel kept)
  double watch_lag_per_s = 0;   // an agent's watch falls behind (a relist after 410)
  milliseconds watch_lag_max{2000};
  double program_slow_per_s = 0;  // a programming delay of up to 1 s
  double fallback_per_s = 0;      // every other endpoint of a service unready for a while
  // Peer links cut for a while: a random side of the nodes from the rest, or a random set of
  // links (the root's among them as often as any).
  double partition_per_s = 0;
  // A Service-only change: web's internalTrafficPolicy set to Local for a while (the
  // EndpointSlices do not change, so the slice revision does not move).
  double spec_change_per_s = 0;
  milliseconds spec_change_max{3000};
  milliseconds partition_max{4000};
  // An unregistered router (an ingress with its own watch, a load balancer with IP targets: a
  // consumer endpointd does not know) keeps opening connections to a terminating pod, every
  // kRouterEvery from the pod's termination for up to router_max: the share of the fault
  // phase's terminations that get one. The pod's node sees each connection (drain/late.h).
  double router_share = 0;
  milliseconds router_max{3000};
};

struct Options {
  size_t nodes = 4;
  size_t subscribers_per_node = 1;
  bool dns = true;
  PeerPolicy policy = PeerPolicy::kProceed;
  milliseconds tick{20};
  milliseconds fault_phase{12000};
  milliseconds settle{6000};          // after the faults stop, before the liveness drains
  size_t liveness_drains = 2;         // drains started in the fault-free tail
  milliseconds liveness{1000};        // each must be released confirmed within this
  milliseconds terminate_every{700};  // a pod terminates this often during the fault phase
  milliseconds feed_grace{4000};
  milliseconds dns_ttl{2000};
  AggregatorOptions aggregator;
  Faults faults;
  // The feed hub keeps what it knew of its subscribers across the agent's restarts, as
  // --feed-state-file does: names and revisions, not states. Off: a restarted agent's hub knows
  // nobody, and a proxy that stayed away while the agent was down is forgotten although it
  // still routes (the simulation finds this in about 1 % of seeds).
  bool hub_memory_survives_restart = true;
  // The share of the fault phase's replacement pods that get the address of a pod gone
  // earlier (pod IP reuse), with a new name and UID.
  double ip_reuse = 0;
  // Members from the agents' Service (--drain-members-service, the chart's default): a node is
  // a member once its agent has had an endpoint in kube-system/endpointd. A stopped agent's
  // endpoint stays (its pod does) unless the stop replaced the pod (a fifth of stops): then it
  // leaves a while after and comes back with the new agent. Off: every Node.
  bool members_service = false;
  // The node's state file keeps the nodes its agent saw running an agent and the members it
  // waited for (--drain-state-file). Off: a restarted agent knows only what it sees.
  bool node_state_survives_restart = true;
  // The share of pods annotated endpointd.io/release-after: silent (the rest: removed). Never
  // the fault-free tail's liveness drains, whose bound has no room for the quiet time.
  double silent_share = 0;
};

// Draws a seed's options and faults: node count, policy, DNS on or off, and a fault mix.
Options options_for_seed(uint64_t seed);

struct Violation {
  std::string what;
  milliseconds at{};
};

struct Report {
  uint64_t seed = 0;
  std::vector<Violation> safety;    // a false "confirmed"
  std::vector<Violation> liveness;  // a tail drain not confirmed in time
  size_t releases_confirmed = 0, releases_unconfirmed = 0;
  size_t drains = 0;
  // Confirmed releases that a state newer than the releasing agent's view routed to by the
  // terminating fallback (not a violation: no agent can know a state it has not seen).
  size_t fallback_after_view = 0;
  // Nodes created (again) after the releasing agent's view, skipped by the check likewise.
  size_t node_after_view = 0;
  // Consumers of a node whose Node is not in the API at the release (deleted, not created again
  // yet) that route to the pod: skipped, as a Node's deletion ends its membership (counted per
  // kernel, subscriber and node's DNS answers).
  size_t node_deleted_routes = 0;
  // EDS subscribers holding the pod DRAINING (or UNHEALTHY) in an assignment less than half
  // healthy: an Envoy at its default panic threshold would balance over it; the check takes
  // endpointd's documented contract (no DRAINING host while one is healthy) instead.
  size_t eds_panic_assumed_off = 0;
  // Subscribers that still route by their last config after their hub forgot them (a lapsed
  // ghost, feed/hub.h's kForgetAfter after it went away): no longer known subscribers.
  size_t forgotten_subscriber_routes = 0;
  // The oracle's consumers read at releases that routed by EDS but not by the verdict field,
  // and the other way round (0 and 0 unless the encodings disagree).
  size_t feed_eds_only = 0, feed_upstream_only = 0;
  // Pods given an address of a pod gone earlier.
  size_t ips_reused = 0;
  // Releases an unregistered router's connections after the removal made unconfirmed
  // ("late traffic"); silent releases at the budget's end while a router still sent.
  size_t late_unconfirmed = 0, silent_at_budget = 0;
  bool long_horizon = false;             // a fault phase of 10 minutes or more
  std::map<std::string, size_t> faults;  // kind → how many were injected
  std::vector<std::string> log;          // with Options' trace on: what happened, in order
  bool ok() const { return safety.empty() && liveness.empty(); }
};

class World;

// One seed from start to end.
Report run(uint64_t seed, const Options& opts, bool trace = false);
Report run(uint64_t seed);

// A scripted scenario: the test holds the world and steps it by hand.
class Scenario {
 public:
  explicit Scenario(Options opts, uint64_t seed = 1);
  ~Scenario();
  Scenario(const Scenario&) = delete;
  Scenario& operator=(const Scenario&) = delete;

  void advance(milliseconds d);  // steps the world this long
  // Terminates a running pod of `service` ("web": ClusterIP, "db": headless) on `node`;
  // returns its address.
  std::string terminate(const std::string& service, size_t node);
  void kill(size_t node);     // the agent stops; its kernel keeps the rules
  void restart(size_t node);  // the agent starts again (fresh state, as a new process)
  void disconnect(size_t node, size_t sub);
  void reconnect(size_t node, size_t sub);
  void nack(size_t node, size_t sub, bool on);
  void set_ttl(milliseconds ttl);  // a reload of every agent's DNS TTL
  void query_dns(size_t node);     // a client asks node's DNS for the headless service
  void remove_node(size_t node);   // the Node deleted (the machine and its kernel stay)
  void add_node(size_t node);      // created again
  void fallback(const std::string& service, bool on);  // every other endpoint unready
  // An unregistered router opens a connection to the pod at `ip` every 20 ms from its
  // termination until `d` from now.
  void router(const std::string& ip, milliseconds d);
  // Stops peer messages between agents `a` and `b` (both ways) until set back.
  void partition(size_t a, size_t b, bool on);

  // The outcome of the release of `ip` ("confirmed", "unconfirmed", or empty: not released).
  // The node the aggregation tree's root is on, as node 0's agent lays it out.
  size_t root() const;
  std::string outcome(const std::string& ip) const;
  // The unconfirmed list of a released drain, "node/consumer: reason" per entry.
  std::vector<std::string> unconfirmed(const std::string& ip) const;
  milliseconds released_after(const std::string& ip) const;
  const Report& report() const;

 private:
  std::unique_ptr<World> world_;
};

}  // namespace endpointd::drain::sim
