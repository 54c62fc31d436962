// The planner: Snapshot + node context -> the endpointd tables (one per IP family), and
// per Delta the minimal changes to them. Pure: no I/O, no clock, no threads (reset()'s helper
// thread, when asked for one, is in planner_helper.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/snapshot.h"
#include "proxy/detect_local.h"
#include "proxy/table.h"

namespace endpointd::proxy {

struct NodeContext {
  std::string node_name;
  std::string zone;                     // topology.kubernetes.io/zone of this node
  std::vector<model::IpAddr> node_ips;  // the host's addresses and the Node's
  // The node's primary IPs: per family the Node object's first InternalIP (else ExternalIP),
  // as kube-proxy detects its node IPs. Empty until the Node object is known.
  std::vector<model::IpAddr> primary_ips;
  std::vector<model::IpPrefix> cluster_cidrs;  // pod CIDRs: traffic from them is "local"
  // Which test makes traffic "local" (from a pod): not masqueraded to cluster IPs, and given
  // every endpoint of an externalTrafficPolicy Local service.
  DetectLocal detect_local = DetectLocal::kClusterCidr;
  // kBridgeInterface: the bridge's name; kInterfaceNamePrefix: the prefix (without '*').
  std::string local_interface;
  // This Node's spec.podCIDRs (kNodeCidr), from the Node object.
  std::vector<model::IpPrefix> node_pod_cidrs;
  // The service CIDRs: traffic to an address in them that is no cluster IP is dropped
  // (kube-proxy's ServiceCIDR objects). Empty: no drop.
  std::vector<model::IpPrefix> service_cidrs;
  bool masquerade_all = false;
  // kube-proxy's nodePortAddresses: CIDRs that select which of node_ips serve NodePorts.
  // Empty: the primary IPs (kube-proxy nftables' default, "primary").
  std::vector<model::IpPrefix> node_port_addresses;
  bool ipv4 = true;  // families this node has
  bool ipv6 = true;
  // The node-local DNS address (--dns-node-local-address) and the port DNS answers on there:
  // its queries and answers skip conntrack (dns-notrack-* chains in its family's table).
  std::optional<model::IpAddr> dns_node_local;
  uint16_t dns_node_local_port = 53;
  friend bool operator==(const NodeContext&, const NodeContext&) = default;
};

// This node's context as the snapshot describes it: `base` (flags) plus this node's Node object
// (its InternalIP/ExternalIP addresses are added to node_ips, its zone replaces base's, its
// podCIDRs are node_pod_cidrs).
NodeContext node_context_from(const NodeContext& base, const model::Snapshot& snap);

// The addresses NodePorts are served on: node_ips within node_port_addresses when given; else
// the primary IPs; else (no Node object, e.g. a manifest directory without one) every address
// in node_ips. Never loopback or unspecified.
std::vector<model::IpAddr> node_port_ips(const NodeContext& ctx);

// What one plan or update counted, for logs and metrics.
struct PlanStats {
  uint64_t skipped = 0;  // service ports or addresses the kernel cannot take
  uint64_t no_local_endpoints_internal = 0;
  uint64_t no_local_endpoints_external = 0;
  std::vector<std::string> skip_reasons;  // "ns/name: why", for the log
  // Services whose elements the tables cannot hold (ElementMap::put refused one): planned not
  // at all, so each keeps the version planned before (none if it is new) and the others go on.
  uint64_t rejected = 0;
  std::vector<std::string> rejections;  // "ns/name: map M: what was wrong", for the log
};

class Planner {
 public:
  explicit Planner(NodeContext ctx);
  // Its state points into its own tables.
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  const NodeContext& context() const { return ctx_; }
  // A new node context (this node's IPs or zone changed); takes effect at the next reset().
  void set_context(NodeContext ctx) { ctx_ = std::move(ctx); }

  // Builds the tables for `snap` from nothing (forgets any earlier state). With `helper`, a
  // snapshot of thousands of services is planned on a second thread while this one puts each
  // service's elements in the tables, in the snapshot's order: the tables, stats and rejections
  // are the same as without (a full sync's planning on two cores).
  void reset(const model::Snapshot& snap, bool helper = false);
  // reset() takes its helper from this many services on (fewer plan in a few milliseconds).
  static constexpr size_t kHelperFrom = 1024;
  // Applies the services named in `delta` (looked up in `snap`) and returns what changed per
  // family (families without change are left out).
  std::vector<TableChanges> update(const model::Snapshot& snap, const model::Delta& delta);

  const Table& table(IpFamily f) const { return f == IpFamily::kV4 ? v4_ : v6_; }
  // The families this node programs (a table for a family the node lacks is not created).
  std::vector<IpFamily> families() const;
  const PlanStats& last_stats() const { return stats_; }
  // Current no-local-endpoints counts (kube-proxy's gauge-like counters): services of a
  // family, or of either (a dual-stack service counts once per family it has an address of).
  uint64_t no_local_internal(IpFamily f) const { return no_local_internal_[family_index(f)]; }
  uint64_t no_local_external(IpFamily f) const { return no_local_external_[family_index(f)]; }
  uint64_t no_local_internal() const { return no_local_internal_[0] + no_local_internal_[1]; }
  uint64_t no_local_external() const { return no_local_external_[0] + no_local_external_[1]; }
  static size_t family_index(IpFamily f) { return f == IpFamily::kV4 ? 0 : 1; }

 private:
  // The sets a service's elements go to: fixed ones, and the per-size backend maps.
  enum class SetKind : uint8_t {
    kHairpin,
    kFirewallIps,
    kFirewallAllow,
    kNoEndpointReject,
    kNoEndpointDrop,
    kServiceIps,
    kServiceLb,
    kClusterIps,
    kBackends,          // backends-N
    kAffinityBackends,  // affinity-backends-T (n is the timeout T)
    kLocalBackends,     // local-backends-N
  };
  static constexpr size_t kFixedSets = 8;
  struct SetId {
    SetKind kind;
    uint32_t n = 0;  // the backend maps' size; affinity-backends-T: T
  };
  // What the planner keeps per service: the state it was planned from (shared with the
  // snapshot), so an update plans the old state again to know which elements it put in,
  // instead of keeping a copy of every element per service.
  struct PlannedService {
    model::ServiceStatePtr state;
    bool no_local_internal[2] = {};  // by family_index
    bool no_local_external[2] = {};
  };
  struct FamilyState {
    Set* fixed[kFixedSets] = {};  // into the family's Table (its map's nodes do not move)
    // The backend maps in use, by size (numeric order, for the lb chains' rules).
    std::map<uint32_t, Set*> lb_sets;
    std::map<uint32_t, Set*> local_lb_sets;
    // ClientIP affinity: the VIPs' backends per timeout T in use (one record rule each).
    std::map<uint32_t, Set*> affinity_sets;
    // Elements more than one service put in (the same VIP key in two services): set name and
    // key -> how many services beyond the first. Rare, so every other element is stored once,
    // in the Table.
    std::map<std::pair<std::string, std::string>, uint32_t> extra_refs;
    // Keys of maps (set name, key) still shared after an update changed one of their services,
    // or that a service left while another keeps them: their value is made again the one a
    // fresh plan gives (resolve_shared).
    std::set<std::pair<std::string, std::string>> contested;
    // During update()'s redo of one service: the keys its new plan put in (so that taking out
    // its old plan's elements, which it shares with its new one for that moment, is not taken
    // for another service leaving). Null outside a redo.
    std::set<std::pair<std::string, std::string>>* redoing = nullptr;
  };

  // Calls emit(family, SetId, Element&&) for each element `st` puts in the tables; sets the
  // no-local flags of `out`. Skips are counted in `skips` when it is given. Reads only the
  // context planned with, so reset()'s helper may run it while the tables change.
  template <typename Emit>
  void plan_service(const model::ServiceState& st, PlanStats* skips, PlannedService& out,
                    Emit&& emit) const;
  // Services planned ahead by reset()'s helper, in order, and their elements.
  struct PlannedRun {
    struct Planned {
      IpFamily family;
      SetId id;
      Element element;
    };
    std::vector<Planned> elements;
    // Each service's plan and the end of its elements in `elements`.
    std::vector<std::pair<PlannedService, size_t>> services;
    PlanStats skips;
  };
  // Plans `st` into `run`: appends its elements, records its plan and their end. Pure (it
  // reads only `st` and the context planned with): reset()'s helper thread runs it.
  void plan_ahead(const model::ServiceStatePtr& st, PlannedRun& run) const;
  // The helper, its thread and the runs it hands over (planner_helper.cc).
  void reset_with_helper(const model::Snapshot& snap,
                         std::map<model::ServiceKey, PlannedService>& previous);
  // Puts in the elements [begin, end) of `run`, one service's; on the first one the tables
  // refuse, takes out those it put in and returns that error, naming the service.
  Status put_planned(PlannedRun& run, size_t begin, size_t end, const model::ServiceState& st);
  // Keeps `p` as planned, or (`planned` failed) rejects it and puts back the version planned
  // before, when there was one and the tables take it.
  void keep_planned(PlannedService p, const Status& planned,
                    const std::map<model::ServiceKey, PlannedService>& previous);
  void base_table(IpFamily f);
  Set& set_for(IpFamily f, SetId id);  // creates a backend map when its size is new
  Status add_element(IpFamily f, SetId id, Element&& e, TableChanges* ch);
  // Adds every element `st` plans (into `out`'s changes, or none when null). On the first one
  // the tables refuse, takes out again those it added and returns that error, naming the
  // service, the map and the element: the tables are then as they were before.
  Status add_service(const model::ServiceState& st, bool count_skips, PlannedService& plan,
                     std::vector<TableChanges>* out);
  void reject(const Status& why);
  // Elements two services put in under one key (two services claiming one address and port)
  // take the value of the last of them in key order, as reset() plans them: after an update
  // that changed or removed one, each contested key gets that value again (into `out`).
  void resolve_shared(IpFamily f, std::vector<TableChanges>* out);
  std::string set_name(IpFamily f, SetId id) const;
  void drop_backends_set(IpFamily f, SetId id);  // a backend map and its size
  void remove_element(IpFamily f, SetId id, const Element& e, TableChanges* ch);
  Table& table_mut(IpFamily f) { return f == IpFamily::kV4 ? v4_ : v6_; }
  FamilyState& state(IpFamily f) { return f == IpFamily::kV4 ? s4_ : s6_; }
  bool has_family(IpFamily f) const { return f == IpFamily::kV4 ? planned_.ipv4 : planned_.ipv6; }
  // Rewrites the rules of lb, local-lb and affinity-record from the backend-map sizes and the
  // affinity timeouts in use, and nat-postrouting's and nat-input's (their jumps to
  // affinity-record while any timeout is in use).
  void rebuild_lb_chains(IpFamily f);
  // The sets that come and go with a size or timeout in use, and those of one kind.
  static bool sized(SetKind k) {
    return k == SetKind::kBackends || k == SetKind::kLocalBackends ||
           k == SetKind::kAffinityBackends;
  }
  std::map<uint32_t, Set*>& sized_sets(IpFamily f, SetKind kind);
  void forget_service(const PlannedService& p);
  void remember_service(const PlannedService& p);
  TableChanges& changes_for(std::vector<TableChanges>* out, IpFamily f);

  NodeContext ctx_;                           // the newest context given
  std::vector<model::IpAddr> node_port_ips_;  // node_port_ips(planned_)
  NodeContext planned_;  // the context the tables were planned with (from the last reset)
  Table v4_;
  Table v6_;
  FamilyState s4_;
  FamilyState s6_;
  std::map<model::ServiceKey, PlannedService> services_;
  PlanStats stats_;
  uint64_t no_local_internal_[2] = {};  // by family_index
  uint64_t no_local_external_[2] = {};
};

// The map of one backend-map size (shared by the planner and tests).
Set backends_set(bool local, uint32_t n);
// The backends of the ClientIP affinity VIPs with one timeout (seconds).
Set affinity_backends_set(uint32_t timeout_s);
// A service's affinity timeout as the planner uses it: kube-proxy's range 1..86400, with 0
// (unset) meaning the default 10800.
uint32_t affinity_timeout(const model::Service& svc);

}  // namespace endpointd::proxy
